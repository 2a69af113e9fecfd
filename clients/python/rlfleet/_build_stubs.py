"""Compiles the rl.v1 protos into a `_proto` package (run at package build time).

protoc writes absolute imports (`from rl.v1 import generate_pb2`); they are rewritten to
`rlfleet._proto.rl.v1` so the stubs live inside the package and never shadow a top-level `rl`.
The .proto files themselves are copied next to them (`rlfleet/protos/rl/v1/*.proto`): the
package carries its protos (grpcurl -import-path, other languages).
Usage: python _build_stubs.py PROTO_ROOT OUT_PACKAGE_DIR
"""

import shutil
import sys
import tempfile
from pathlib import Path

PROTOS = ["rl/v1/generate.proto", "rl/v1/worker.proto", "rl/v1/admin.proto",
          "rl/v1/router.proto", "rl/v1/weight_sync.proto"]


def check_root(proto_root: Path) -> Path:
    """`proto_root` if it holds every proto, else a RuntimeError naming the missing ones."""
    missing = [p for p in PROTOS if not (Path(proto_root) / p).is_file()]
    if missing:
        raise RuntimeError(f"rlfleet: protos not found under {proto_root}: {missing} "
                           "(build from the repository or from the sdist, or set "
                           "RLFLEET_PROTO_ROOT)")
    return Path(proto_root)


def copy_protos(proto_root: Path, dest: Path) -> None:
    """Copies the package's .proto files to `dest` (same relative layout)."""
    for p in PROTOS:
        (dest / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(proto_root) / p, dest / p)


def generate(proto_root: Path, package_dir: Path) -> None:
    """Writes `package_dir`/_proto (the generated modules) and `package_dir`/protos."""
    from grpc_tools import protoc  # type: ignore[import-untyped]
    proto_root = check_root(proto_root)
    out_dir = Path(package_dir) / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{proto_root}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}"] + PROTOS
        if protoc.main(args) != 0:
            raise RuntimeError(f"rlfleet: protoc failed on {proto_root}")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(tmp, out_dir)
    for d in [out_dir, out_dir / "rl", out_dir / "rl" / "v1"]:
        (d / "__init__.py").touch()
    for f in (out_dir / "rl" / "v1").glob("*.py*"):
        text = f.read_text()
        f.write_text(text.replace("from rl.v1 import", "from rlfleet._proto.rl.v1 import"))
    protos = Path(package_dir) / "protos"
    if protos.exists():
        shutil.rmtree(protos)
    copy_protos(proto_root, protos)


if __name__ == "__main__":
    generate(Path(sys.argv[1]), Path(sys.argv[2]))
