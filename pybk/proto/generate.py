"""Regenerate the committed protobuf/gRPC code from bookie.proto (`make proto`).

The generated modules are committed so that installing pybk needs no code generator;
`tests/test_proto.py` fails when they are stale.
"""
from __future__ import annotations

import pathlib
import re
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROTO = "bookie.proto"
OUTPUTS = ("bookie_pb2.py", "bookie_pb2.pyi", "bookie_pb2_grpc.py")
# Further protos without services: (directory, proto file, generated files).
META = HERE.parent / "meta"
EXTRA = ((META, "metadata.proto", ("metadata_pb2.py", "metadata_pb2.pyi")),)


def generate(out_dir: pathlib.Path) -> None:
    """Run protoc on bookie.proto into out_dir, with imports made package-relative."""
    from grpc_tools import protoc

    args = ["protoc", f"-I{HERE}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(HERE / PROTO)]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    grpc_file = out_dir / "bookie_pb2_grpc.py"
    text = grpc_file.read_text()
    text = re.sub(r"^import bookie_pb2 as", "from . import bookie_pb2 as", text, flags=re.M)
    grpc_file.write_text(text)
    for src, proto, _ in EXTRA:
        if protoc.main(["protoc", f"-I{src}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                        str(src / proto)]) != 0:
            raise SystemExit(f"protoc failed on {proto}")


def stale_files() -> list[str]:
    """Names of committed generated files that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        generate(out)
        targets = [(HERE / name, name) for name in OUTPUTS]
        targets += [(src / name, name) for src, _, names in EXTRA for name in names]
        return [name for path, name in targets
                if not path.exists() or path.read_text() != (out / name).read_text()]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        generate(out)
        for name in OUTPUTS:
            (HERE / name).write_text((out / name).read_text())
        for src, _, names in EXTRA:
            for name in names:
                (src / name).write_text((out / name).read_text())
    print("regenerated", ", ".join(OUTPUTS + tuple(n for _, _, names in EXTRA for n in names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
