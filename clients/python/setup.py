"""Build hooks: the gRPC stubs are generated into rlfleet/_proto while the package is built, and
the sdist carries the .proto files so a wheel builds from it anywhere.

Where the .proto files come from, first found: RLFLEET_PROTO_ROOT; `protos/` of the repository
(clients/python is two levels below it); `rlfleet/protos/` (inside an sdist, put there by the
sdist command below).
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "rlfleet"))
import _build_stubs  # noqa: E402  (a plain module: importing rlfleet would need the stubs)


def proto_root() -> Path:
    if os.environ.get("RLFLEET_PROTO_ROOT"):
        return _build_stubs.check_root(Path(os.environ["RLFLEET_PROTO_ROOT"]))
    for candidate in (HERE.parent.parent / "protos", HERE / "rlfleet" / "protos"):
        if all((candidate / p).is_file() for p in _build_stubs.PROTOS):
            return candidate
    return _build_stubs.check_root(HERE.parent.parent / "protos")  # raises, naming them


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        _build_stubs.generate(proto_root(), Path(self.build_lib) / "rlfleet")


class SdistWithProtos(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        _build_stubs.copy_protos(proto_root(), Path(base_dir) / "rlfleet" / "protos")


setup(cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProtos})
