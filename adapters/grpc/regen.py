"""Regenerate `adapters/grpc/generated/` from the vendored protos (needs grpcio-tools, a dev dependency).

    .venv/bin/python -m adapters.grpc.regen

The protos are registered under their upstream names (`apache/rocketmq/v2/*.proto`); the generated
modules are flattened into `generated/` and their cross-imports rewritten to package-absolute ones."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "proto")
OUT = os.path.join(HERE, "generated")
NAMES = ("definition", "service", "admin")
_IMPORT = re.compile(r"^from apache\.rocketmq\.v2 import (\w+_pb2)", re.M)


def main() -> None:
    protos = [os.path.join("apache", "rocketmq", "v2", f"{n}.proto") for n in NAMES]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                *protos,
            ],
            check=True,
        )
        src = os.path.join(tmp, "apache", "rocketmq", "v2")
        os.makedirs(OUT, exist_ok=True)
        for f in sorted(os.listdir(src)):
            with open(os.path.join(src, f)) as fh:
                text = fh.read()
            text = _IMPORT.sub(r"from adapters.grpc.generated import \1", text)
            with open(os.path.join(OUT, f), "w") as fh:
                fh.write(text)
    init = os.path.join(OUT, "__init__.py")
    with open(init, "w") as fh:
        fh.write(
            '"""Generated from adapters/grpc/proto (apache/rocketmq-apis v2.1.2) by '
            '`python -m adapters.grpc.regen`. Do not edit."""\n'
        )
    shutil.rmtree(os.path.join(OUT, "__pycache__"), ignore_errors=True)


if __name__ == "__main__":
    main()
