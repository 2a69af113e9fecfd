"""The rlfleet client tests use the package as a user installs it (pip, stubs generated at
build time), in a temporary folder first on sys.path, and share a two-worker fleet fixture."""

import pytest

import rltest

rltest.use_installed_rlfleet()


@pytest.fixture
def fleet2():
    """Two rl-workers (stories260K) behind one rl-router (rltest.Fleet), stopped at teardown."""
    f = rltest.Fleet(num_workers=2)
    yield f
    f.stop()
