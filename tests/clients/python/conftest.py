"""The rlfleet client tests use the package as a user installs it (pip, stubs generated at
build time), in a temporary folder first on sys.path; rl_client comes from the sources."""

import sys
import tempfile
from pathlib import Path

import rltest

sys.path.insert(0, str(rltest.install_rlfleet(Path(tempfile.mkdtemp(prefix="rlfleet_pkg_")))))
