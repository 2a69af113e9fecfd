"""Compiles the rl.v1 protos into a `_proto` package (run at package build time).

protoc writes absolute imports (`from rl.v1 import generate_pb2`); they are rewritten to
`rlfleet._proto.rl.v1` so the stubs live inside the package and never shadow a top-level `rl`.
Usage: python _build_stubs.py PROTO_ROOT OUT_DIR
"""

import shutil
import sys
import tempfile
from pathlib import Path

PROTOS = ["rl/v1/generate.proto", "rl/v1/worker.proto", "rl/v1/admin.proto",
          "rl/v1/router.proto"]


def generate(proto_root: Path, out_dir: Path) -> None:
    from grpc_tools import protoc
    proto_root = Path(proto_root)
    missing = [p for p in PROTOS if not (proto_root / p).exists()]
    if missing:
        raise RuntimeError(f"rlfleet: protos not found under {proto_root}: {missing} "
                           "(build from the repository, or set RLFLEET_PROTO_ROOT)")
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{proto_root}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}"] + PROTOS
        if protoc.main(args) != 0:
            raise RuntimeError(f"rlfleet: protoc failed on {proto_root}")
        out_dir = Path(out_dir)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(tmp, out_dir)
    for d in [out_dir, out_dir / "rl", out_dir / "rl" / "v1"]:
        (d / "__init__.py").touch()
    for f in (out_dir / "rl" / "v1").glob("*.py*"):
        text = f.read_text()
        f.write_text(text.replace("from rl.v1 import", "from rlfleet._proto.rl.v1 import"))


if __name__ == "__main__":
    generate(Path(sys.argv[1]), Path(sys.argv[2]))
