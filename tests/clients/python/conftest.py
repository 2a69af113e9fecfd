"""The rlfleet client tests use the package as a user installs it (pip, stubs generated at
build time), in a temporary folder first on sys.path; rl_client comes from the sources."""

import rltest

rltest.use_installed_rlfleet()
