"""The collector's end-to-end tests use the rlfleet package as a user installs it (pip, stubs
generated at build time), in a temporary folder first on sys.path; `fleet` (tests/conftest.py)
gives them a worker behind a router."""

import sys
import tempfile
from pathlib import Path

import rltest

sys.path.insert(0, str(rltest.install_rlfleet(Path(tempfile.mkdtemp(prefix="rlfleet_pkg_")))))
