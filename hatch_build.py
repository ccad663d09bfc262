"""Hatchling build hook: compile the optional Cython hot path (docs/store.md, "Compiled hot path"):
the store's record codec and append loop (`store/_codec_speedups.pyx`, `_append_speedups.pyx`, which
cimports the codec's C functions through `_codec_speedups.pxd`), the MQTT PUBLISH encoder
(`adapters/mqtt/codec/_speedups.pyx`), the store node protocol's message lists
(`cluster/_speedups.pyx`), the gRPC delivery encoder (`adapters/grpc/_speedups.pyx`) and the AMQP
codec's encoder and decoder (`adapters/amqp/codec/_encode_speedups.pyx`, `_decode_speedups.pyx`,
which share `_bytes.pxd`).

Each extension is built under build/ and renamed next to its source, which is where the editable
install that `uv sync` makes imports it from; a wheel also carries it. Without a C compiler (or with
any other build failure) the hook only warns: the package installs as pure Python, which is the
reference and the fallback (`GATEWAY_PURE_PYTHON=1` selects it at run time even when built).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

EXTENSIONS = {
    "store._codec_speedups": "store/_codec_speedups.pyx",
    "store._append_speedups": "store/_append_speedups.pyx",
    "adapters.mqtt.codec._speedups": "adapters/mqtt/codec/_speedups.pyx",
    "cluster._speedups": "cluster/_speedups.pyx",
    "adapters.grpc._speedups": "adapters/grpc/_speedups.pyx",
    "adapters.amqp.codec._encode_speedups": "adapters/amqp/codec/_encode_speedups.pyx",
    "adapters.amqp.codec._decode_speedups": "adapters/amqp/codec/_decode_speedups.pyx",
}


class SpeedupsBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Build the extensions in place; on failure warn and install pure Python."""
        if self.target_name != "wheel":
            return
        try:
            built = _build_in_place(Path(self.root))
        except (Exception, SystemExit) as e:  # noqa: BLE001 - no compiler, no Cython, a C error: pure Python
            print(f"msg-gateway: compiled hot path not built, using pure Python ({e})", file=sys.stderr)
            return
        # (the .so files are ignored by git, hence hatchling's default file selection: list them)
        build_data["artifacts"] += [p.relative_to(self.root).as_posix() for p in built]
        build_data["pure_python"] = False
        build_data["infer_tag"] = True


def _build_in_place(root: Path) -> list[Path]:
    """Cythonize and compile every extension of EXTENSIONS next to its source; the built files."""
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    cwd = os.getcwd()
    os.chdir(root)  # setuptools builds relative to the project root
    try:
        modules = cythonize(
            [Extension(name, [src], extra_compile_args=["-O2"]) for name, src in EXTENSIONS.items()],
            compiler_directives={"language_level": 3},
            quiet=True,
        )
        dist = Distribution({"name": "msg-gateway-speedups", "ext_modules": modules})
        cmd = build_ext(dist)
        cmd.build_temp = str(root / "build" / "speedups")
        cmd.build_lib = str(root / "build" / "speedups-lib")
        cmd.ensure_finalized()
        cmd.run()
        built = []
        for name in EXTENSIONS:
            rel = cmd.get_ext_filename(name)
            # renamed into place, never rewritten: a running process keeps the file it has mapped
            os.replace(Path(cmd.build_lib) / rel, root / rel)
            built.append(root / rel)
        return built
    finally:
        os.chdir(cwd)
