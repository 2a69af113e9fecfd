"""Fixtures for the collector's end-to-end tests: the rlfleet package built and installed the
way a user installs it (pip, stubs generated at build time) into a temporary folder, and
rl-worker / rl-router processes on loopback port 0."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RL_BUILD_DIR", ROOT / "build"))
DATA = Path(os.environ.get("RL_TEST_DATA", ROOT.parent / "shared" / "models"))
BIN = BUILD / "bin"


def _install_rlfleet(tmp: Path) -> Path:
    # Build from a copy so that setuptools writes nothing into the source tree.
    src = tmp / "src"
    shutil.copytree(ROOT / "clients" / "python", src / "clients" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copytree(ROOT / "protos", src / "protos")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-build-isolation", "--no-deps", "--target", str(site),
                    str(src / "clients" / "python")], check=True, timeout=300)
    return site


_site = _install_rlfleet(Path(__import__("tempfile").mkdtemp(prefix="rlfleet_pkg_")))
sys.path.insert(0, str(_site))


class Server:
    def __init__(self, args):
        self.args = args
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"{args[0]} did not start: {line!r}")
        self.address = line.split()[-1]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_worker():
    return Server([str(BIN / "rl-worker"), "--model", str(DATA / "stories260K"), "--port", "0",
                   "--kv-cache-gb", "0.05"])


def start_router(worker, port="0"):
    return Server([str(BIN / "rl-router"), "--tokenizer", str(DATA / "stories260K"),
                   "--port", port, "--worker", worker.address, "--health-interval-ms", "100",
                   "--retry-backoff-ms", "20"])


@pytest.fixture
def fleet():
    worker = start_worker()
    router = start_router(worker)
    servers = {"worker": worker, "router": router}
    yield servers
    for s in servers.values():
        s.stop()
