"""Loaded for every Python test under tests/ (tests/pytest.ini makes tests/ the rootdir): the
shared helpers (tests/testing/rltest.py) on sys.path. The `rlfleet` package is the venv's
(scripts/venv installs it); tests/clients/python and tests/collector install a fresh copy."""

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(_TESTS / "testing"))

import pytest  # noqa: E402

import rltest  # noqa: E402


@pytest.fixture
def start_worker():
    """A factory of rl-workers (rltest.start_worker's arguments), all stopped at teardown."""
    servers = []

    def start(*extra, model=None):
        s = rltest.start_worker(*extra, model=model)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def fleet():
    """One rl-worker (stories260K) behind one rl-router: {"worker": Server, "router": Server}."""
    worker = rltest.start_worker()
    router = rltest.start_router([worker])
    servers = {"worker": worker, "router": router}
    yield servers
    for s in reversed(list(servers.values())):
        s.stop()
