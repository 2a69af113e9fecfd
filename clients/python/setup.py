"""Build hook: generates the gRPC stubs into rlfleet/_proto while the package is built.

The .proto files are the repository's protos/ (found next to clients/, or RLFLEET_PROTO_ROOT).
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "rlfleet"))
import _build_stubs  # noqa: E402  (a plain module: importing rlfleet would need the stubs)


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        proto_root = Path(os.environ.get("RLFLEET_PROTO_ROOT", HERE.parent.parent / "protos"))
        _build_stubs.generate(proto_root, Path(self.build_lib) / "rlfleet" / "_proto")


setup(cmdclass={"build_py": BuildWithStubs})
