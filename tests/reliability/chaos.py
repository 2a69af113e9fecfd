"""Chaos driver: a real fleet (3 rl-worker processes + rl-router on loopback) under concurrent
generations while one worker is SIGKILLed and restarted every ~2 s, another is SIGSTOPped and
resumed, and admin cycles (pause retract -> update from disk -> continue) run throughout.

Used by tests/reliability/test_chaos.py (about a minute, in ctest) and bench/chaos/chaos_soak.py
(minutes, prints counts). `run()` returns the counts and a list of violated invariants:
- every request ends exactly once: OK, or (streaming only) with an error after its first token
  was streamed (the router never replays streamed output); non-streaming requests all end OK
  (failures before output are retried by the router);
- no request hangs past its deadline;
- greedy outputs are identical for identical prompts at the same weight version;
- at the end every worker is live, routable and serving at the fleet's version.
"""

import os
import random
import sys
import threading
import time
from pathlib import Path

# Also run outside pytest (bench/chaos/chaos_soak.py): the shared helpers. The rlfleet package
# is the venv's (scripts/venv installs it).
_TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_TESTS / "testing")]

import grpc  # noqa: E402

from rlfleet import Client, FleetError, GenerateResult  # noqa: E402
from rlfleet.proto import router_pb2  # noqa: E402
from rltest import STORIES, free_port, start_router, start_worker  # noqa: E402

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went", "One day, a bird",
           "The sun was", "A big red ball"]
REQUEST_DEADLINE_S = 60.0


def start_fixed_worker(log):
    """An rl-worker on a fixed port, so that a restart (kill(), then start(tries=50): the port
    may linger a moment) comes back at the same address; its stderr into the shared `log`. A
    port taken between free_port() and the bind (the machine is shared) is refused by the
    worker: another one is tried."""
    for attempt in range(20):
        try:
            return start_worker("--kv-cache-gb", "0.02", "--log-level", "warn", port=free_port(),
                                log=log)
        except RuntimeError:
            if attempt == 19:
                raise


def run(duration_s=45.0, num_clients=4, kill_every_s=2.0, stop_for_s=2.5, admin_every_s=2.5,
        verbose=False, log_dir=None, on_start=None, on_stop=None, report_every_s=1.0):
    """The scenario for `duration_s`; returns (counts, violations). `on_start(router, workers)`
    is called once the fleet is up and `on_stop()` before it is stopped (the soak samples the
    processes' memory in between); with `verbose` the counts are printed every
    `report_every_s`."""
    log_path = Path(log_dir or os.environ.get("RL_CHAOS_LOG_DIR", "/tmp")) / f"chaos-{os.getpid()}.log"
    log = open(log_path, "w")
    workers = []
    router = None
    counts = {"requests": 0, "ok": 0, "streamed_then_failed": 0, "kills": 0, "stops": 0,
              "admin_cycles": 0, "admin_worker_failures": 0, "admin_call_errors": 0}
    violations = []
    lock = threading.Lock()
    outputs = {}  # (prompt, version) -> set of output tuples
    stop = threading.Event()
    fleet_version = [0]
    try:
        workers = [start_fixed_worker(log) for _ in range(3)]
        router = start_router(workers, "--health-interval-ms", "200", "--health-timeout-ms",
                              "500", "--health-failures", "2", "--max-attempts", "30",
                              "--admin-call-timeout-ms", "2000", "--admin-load-timeout-ms",
                              "20000", "--admin-lock-timeout-ms", "60000", "--log-level", "info",
                              log=log)
        router_address = router.address
        client = Client(router_address, timeout=REQUEST_DEADLINE_S)
        if on_start is not None:
            on_start(router, workers)

        def generate_once(rng):
            prompt = rng.choice(PROMPTS)
            streaming = rng.random() < 0.25
            max_new_tokens = rng.choice([4, 8, 16])
            finals, chunks = 0, 0
            final = None
            start = time.monotonic()
            try:
                for part in client.generate_stream(text=prompt, stream=streaming,
                                                   temperature=0.0,
                                                   max_new_tokens=max_new_tokens):
                    if isinstance(part, GenerateResult):
                        finals += 1
                        final = part
                    else:
                        chunks += 1
                err = None
            except FleetError as e:
                err = e
            elapsed = time.monotonic() - start
            with lock:
                counts["requests"] += 1
                if err is None:
                    if finals != 1:
                        violations.append(f"request '{prompt}' got {finals} final messages")
                        return
                    counts["ok"] += 1
                    key = (prompt, max_new_tokens, final.weight_version)
                    outputs.setdefault(key, set()).add(tuple(final.output_ids))
                    return
                code = err.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    violations.append(f"request '{prompt}' hung past its deadline ({elapsed:.1f} s)")
                elif streaming and chunks > 0 and finals == 0 and code == grpc.StatusCode.UNAVAILABLE:
                    counts["streamed_then_failed"] += 1  # reported, not replayed: allowed
                else:
                    violations.append(f"request '{prompt}' (stream={streaming}, {chunks} chunks) "
                                      f"lost: {code.name}: {err.details()}")

        def load(seed):
            rng = random.Random(seed)
            while not stop.is_set():
                generate_once(rng)

        def killer():
            w = workers[0]
            while not stop.wait(kill_every_s):
                w.kill()
                counts["kills"] += 1
                time.sleep(0.1)
                w.start(tries=50)

        def stopper():
            w = workers[1]
            while not stop.wait(stop_for_s):
                w.freeze()
                counts["stops"] += 1
                stop.wait(stop_for_s)
                w.thaw()

        def results(call):
            """Every worker's result of a broadcast; one that some worker failed raises
            FleetError carrying them all (a gRPC error has none and is re-raised)."""
            try:
                return list(call().results)
            except FleetError as e:
                if e.response is None:
                    raise
                return list(e.response.results)

        def admin():
            admin_client = Client(router_address, timeout=120)
            while not stop.wait(admin_every_s):
                try:
                    r = results(lambda: admin_client.pause("retract"))
                    counts["admin_worker_failures"] += sum(not x.success for x in r)
                    version = fleet_version[0] + 1
                    r = results(lambda: admin_client.update_weights_from_disk(
                        str(STORIES), weight_version=version))
                    counts["admin_worker_failures"] += sum(not x.success for x in r)
                    if any(x.success for x in r):
                        fleet_version[0] = version
                    r = results(admin_client.continue_generation)
                    counts["admin_worker_failures"] += sum(not x.success for x in r)
                    counts["admin_cycles"] += 1
                except FleetError as e:
                    # No live worker at that moment, or the lock: reported, never a hang.
                    counts["admin_call_errors"] += 1
                    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        violations.append(f"admin call hung: {e.details()}")
                    try:  # never leave the fleet paused
                        admin_client.continue_generation()
                    except FleetError:
                        pass

        threads = [threading.Thread(target=load, args=(i,)) for i in range(num_clients)]
        threads += [threading.Thread(target=f) for f in (killer, stopper, admin)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + duration_s
        next_report = time.monotonic() + report_every_s
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            if verbose and time.monotonic() >= next_report:
                next_report += report_every_s
                print(f"[{duration_s - (deadline - time.monotonic()):5.0f} s] {counts}", flush=True)
        stop.set()
        for t in threads:
            t.join(timeout=REQUEST_DEADLINE_S + 30)
            if t.is_alive():
                violations.append("a driver thread did not finish (hang)")
        if workers[1].frozen:
            workers[1].thaw()
        # The fleet converges: every worker live, at the fleet's version, serving.
        version = fleet_version[0]
        converged = False
        listing = None
        for _ in range(300):
            listing = client.list_workers()
            if all(w.state == router_pb2.WORKER_STATE_LIVE and w.enabled and
                   w.weight_version == version and not w.reason for w in listing.workers):
                converged = True
                break
            time.sleep(0.1)
        if not converged:
            violations.append(f"fleet did not converge to v{version}: {listing}")
        for w in workers:
            direct = Client(w.address, timeout=30, via="worker")
            f = direct.generate(text=PROMPTS[0], max_new_tokens=4, temperature=0.0).one()
            if f.weight_version != version:
                violations.append(f"worker {w.address} serves v{f.weight_version}, fleet v{version}")
        served = set()
        for _ in range(30):
            served.add(client.generate(text=PROMPTS[1], max_new_tokens=2,
                                       temperature=0.0).one().worker)
        if served != {w.address for w in workers}:
            violations.append(f"the router routes to {sorted(served)} only")
        for key, outs in outputs.items():
            if len(outs) != 1:
                violations.append(f"greedy outputs differ for {key}: {outs}")
        counts["fleet_version"] = version
        counts["distinct_prompt_versions"] = len(outputs)
    finally:
        stop.set()
        if on_stop is not None:
            on_stop()
        for w in workers:
            w.stop()
        if router is not None:
            router.stop()
        log.close()
    counts["log"] = str(log_path)
    return counts, violations


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--duration-s", type=float, default=45.0)
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args()
    c, v = run(args.duration_s, args.clients, verbose=True)
    print(c)
    for line in v:
        print("VIOLATION:", line)
    sys.exit(1 if v else 0)
