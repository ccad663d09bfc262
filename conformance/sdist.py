"""A client library's PyPI sdist pinned by sha256, for running its own test suite against the gateway
(conformance/amqp_suite.py: aiormq; conformance/aiopika_suite.py: aio-pika): fetched once from the
package index, checked, cached, and its tests/ unpacked."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gateway-conformance"


@dataclass(frozen=True)
class PinnedSdist:
    package: str  # the PyPI project name
    version: str
    top: str  # the sdist's top directory (and file name without .tar.gz)
    sha256: str
    host_path: str  # its path on files.pythonhosted.org (what PyPI's JSON API gives)
    env_var: str  # names a local copy to use instead

    @property
    def filename(self) -> str:
        return f"{self.top}.tar.gz"

    def fetch(self, explicit: str | None = None) -> Path:
        """`explicit`, $<env_var>, the cache, else the index (sha256 checked)."""
        path = explicit or os.environ.get(self.env_var)
        if path:
            return Path(path)
        target = CACHE / self.filename
        if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == self.sha256:
            return target
        data = b""
        errors = []
        for url in self._urls():
            try:
                with urllib.request.urlopen(url, timeout=60) as r:
                    data = r.read()
                break
            except OSError as e:
                errors.append(f"{url}: {e}")
        if not data:
            raise OSError("; ".join(errors))
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise RuntimeError(f"{self.filename}: sha256 {digest}, expected {self.sha256}")
        CACHE.mkdir(parents=True, exist_ok=True)
        # written whole, then renamed: parallel test workers may fetch the same sdist at once
        part = target.with_name(f"{target.name}.{os.getpid()}.part")
        part.write_bytes(data)
        os.replace(part, target)
        return target

    def _urls(self) -> Iterator[str]:
        """PyPI's file host, then whatever the JSON API of the index says (mirrors answer with
        relative URLs)."""
        yield f"https://files.pythonhosted.org/packages/{self.host_path}"
        api = f"https://pypi.org/pypi/{self.package}/json"
        try:
            with urllib.request.urlopen(api, timeout=30) as r:
                meta = json.load(r)
        except (OSError, ValueError):
            return
        for u in meta.get("releases", {}).get(self.version, []):
            if u.get("packagetype") == "sdist":
                yield urllib.parse.urljoin(api, u["url"])

    def unpack_tests(self, sdist: Path, dest: Path) -> Path:
        """Only `tests/` of the sdist into `dest`; the unpacked top directory."""
        with tarfile.open(sdist) as tar:
            members = [
                m for m in tar.getmembers() if m.name.startswith(f"{self.top}/tests/") and ".." not in m.name
            ]
            tar.extractall(dest, members=members, filter="data")
        return dest / self.top
