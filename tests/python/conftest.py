"""Fixtures for the Python tests: built binaries, shared data, servers on loopback port 0."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))
BUILD = Path(os.environ.get("RL_BUILD_DIR", ROOT / "build"))
DATA = Path(os.environ.get("RL_TEST_DATA", ROOT.parent / "shared" / "models"))


class Server:
    def __init__(self, args):
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"{args[0]} did not start: {line!r} {self.proc.stderr.read()}")
        self.address = line.split()[-1]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def start_worker():
    servers = []

    def start(*extra, model=None):
        s = Server([str(BUILD / "bin" / "rl-worker"), "--model", str(model or DATA / "stories260K"),
                    "--port", "0", *extra])
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
