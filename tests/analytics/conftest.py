"""Fixtures of the analytics tests (helpers in support.py): one in-process gateway and, for the
modules that need it, one local SparkSession per test module."""

from __future__ import annotations

import pytest

from tests.analytics.support import GatewayThread, spark_session


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    g = GatewayThread(str(tmp_path_factory.mktemp("gw") / "data")).start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def spark():
    s = spark_session()
    yield s
    s.stop()
