"""Fixtures of the CLUSTER tests: `etcd`, one real etcd per test module (tests/cluster/etcd_support.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.etcd_support import EtcdProcess


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(tmp_path_factory.mktemp("etcd"))
    proc.start()
    yield proc
    proc.stop()
