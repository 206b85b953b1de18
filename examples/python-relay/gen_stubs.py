#!/usr/bin/env python3
"""Generates the outboxd gRPC stubs for Python into ./gen.

The stubs are build output, not source: they are regenerated from
../../proto on every build or test run, so they can never drift from the
proto that the server was built from. relay.py puts ./gen on sys.path.
"""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
OUT = HERE / "gen"
PROTOS = ["outbox/v1/outbox.proto"]


def main() -> int:
    # Start from an empty directory so a proto that was removed leaves no stub behind.
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    # google/protobuf/{duration,timestamp}.proto ship inside grpcio-tools.
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={OUT}",
        f"--pyi_out={OUT}",
        f"--grpc_python_out={OUT}",
        *PROTOS,
    ]
    code = protoc.main(args)
    if code != 0:
        print(f"protoc failed with exit code {code}", file=sys.stderr)
        return 1
    print(f"generated stubs for {', '.join(PROTOS)} in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
