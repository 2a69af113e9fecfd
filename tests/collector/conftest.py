"""The collector's end-to-end tests use the rlfleet package as a user installs it (pip, stubs
generated at build time), in a temporary folder first on sys.path; `fleet` (tests/conftest.py)
gives them a worker behind a router."""

import rltest

rltest.use_installed_rlfleet()
