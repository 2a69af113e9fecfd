"""rltest.free_port's port claims (`_claim`, tests/testing/rltest.py), with processes of their
own in a claim folder of the test's own (TMPDIR): stale claims raced for by several processes
at once go to exactly one of them each; a process's claims are removed when it exits; a killed
process's claim holds until it is stale, then is taken over; a live process's claim is never
taken over, however old."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTING = Path(__file__).resolve().parent
FIRST = 20000  # the ports' numbers only name claim files here: nothing binds them

# Claims `count` ports from FIRST on its "go" line, prints those it won, then holds them until
# its stdin closes (then exits normally: atexit removes its claims).
RACER = """
import sys
import rltest
count = int(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
won = [p for p in range(%d, %d + count) if rltest._claim(p)]
print(" ".join(map(str, won)), flush=True)
sys.stdin.read()
""" % (FIRST, FIRST)


def spawn(tmp, *args):
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(TESTING)}
    return subprocess.Popen([sys.executable, "-c", RACER, *map(str, args)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def claim_once(tmp, port):
    """Whether a fresh process can claim `port` (it exits at once, releasing it if won)."""
    p = spawn(tmp, port - FIRST + 1)
    try:
        assert p.stdout.readline() == "ready\n"
        p.stdin.write("go\n")
        p.stdin.flush()
        won = p.stdout.readline().split()
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    return str(port) in won


def claims(tmp):
    return sorted(f.name for f in (tmp / "rltest-ports").iterdir())


def make_stale(path, age_s=3600):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    t = time.time() - age_s
    os.utime(path, (t, t))


def test_stale_claims_raced_for_go_to_exactly_one_process_each(tmp_path):
    # Racers claim the same ports in the same order: a late one catches up with the leader
    # (refusing a fresh claim is quicker than taking one), and from there they race on each
    # port. A stat-then-touch takeover gave one port to two of them in most rounds.
    ports, racers = 600, 8
    for r in range(3):
        tmp = tmp_path / str(r)
        for i in range(ports):
            make_stale(tmp / "rltest-ports" / str(FIRST + i))
        procs = [spawn(tmp, ports) for _ in range(racers)]
        try:
            for p in procs:
                assert p.stdout.readline() == "ready\n"
            for p in procs:  # as close together as one loop can
                p.stdin.write("go\n")
                p.stdin.flush()
            won = [[int(w) for w in p.stdout.readline().split()] for p in procs]
        finally:
            for p in procs:
                p.stdin.close()
            for p in procs:
                p.wait(timeout=30)
        every = sorted(w for one in won for w in one)
        assert every == list(range(FIRST, FIRST + ports)), (r, won)  # each port once
        assert claims(tmp) == []  # every racer removed its claims at exit


def test_claims_live_with_their_process_and_a_dead_ones_go_stale(tmp_path):
    port = FIRST + 7
    holder = spawn(tmp_path, 8)
    try:
        assert holder.stdout.readline() == "ready\n"
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert str(port) in holder.stdout.readline().split()
        assert not claim_once(tmp_path, port)  # held
        make_stale(tmp_path / "rltest-ports" / str(port))
        assert not claim_once(tmp_path, port)  # old, but its holder lives
        holder.send_signal(signal.SIGKILL)  # dies without removing its claims
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.stdin.close()
    assert str(port) in claims(tmp_path)
    os.utime(tmp_path / "rltest-ports" / str(port))  # as if the holder just died
    assert not claim_once(tmp_path, port)  # recent: might still be in use
    make_stale(tmp_path / "rltest-ports" / str(port))
    assert claim_once(tmp_path, port)  # stale: taken over (and released at that exit)
    assert claim_once(tmp_path, port)
    assert str(port) not in claims(tmp_path)
