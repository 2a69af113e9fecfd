"""Chaos with version constraints (issue 30): a real fleet (3 rl-worker processes + rl-router on
loopback) where one worker is SIGKILLed and restarted every ~2.5 s while an admin thread
alternates transactional refits from disk (Admin.RefitWeights through the router) and in-memory
tensor pushes (UpdateWeightsFromTensor through the router, each version with other weights),
and clients send greedy requests that accept only some versions: `min_weight_version` (the
newest published version, or the one before) or `exact_weight_version` (the newest).

Used by tests/reliability/test_chaos_versions.py (about a minute, in ctest). `run()` returns the
counts and the violated invariants:
- no request ever ran below its minimum or off its exact version: the start
  (`dispatch_weight_version`), every token's version (`weight_version_segments`) and the end
  (`weight_version`) are all accepted;
- a request ends OK, or (constrained only) UNAVAILABLE when no worker served an accepted version
  before its deadline; none hangs past its deadline;
- greedy outputs are identical for identical prompts generated wholly at one version;
- at the end, after one more in-memory push and one more restart (so the restarted worker can
  only catch up from a live peer), every worker is live at the fleet's version with identical
  weight checksums, the pushed ones, and the router caught workers up from peers during the run.
"""

import os
import random
import re
import sys
import threading
import time
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_TESTS / "testing"), str(Path(__file__).resolve().parent)]

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from chaos import PROMPTS, start_fixed_worker  # noqa: E402
from rlfleet import Client, FleetError  # noqa: E402
from rlfleet.proto import admin_pb2, router_pb2  # noqa: E402
from rltest import STORIES, start_router  # noqa: E402

CONSTRAINED_DEADLINE_S = 10.0
FREE_DEADLINE_S = 60.0


def pushed_norm(version):
    """model.norm.weight (F32 [64] in stories260K) as the push of `version` sets it."""
    return np.full(64, 0.6 + 0.1 * (version % 7), dtype=np.float32)


def run(duration_s=40.0, num_clients=4, kill_every_s=2.5, admin_every_s=1.5, verbose=False,
        log_dir=None):
    log_path = (Path(log_dir or os.environ.get("RL_CHAOS_LOG_DIR", "/tmp")) /
                f"chaos-versions-{os.getpid()}.log")
    log = open(log_path, "w")
    workers = []
    router = None
    counts = {"requests": 0, "ok": 0, "min": 0, "exact": 0, "refused": 0, "kills": 0,
              "refits": 0, "refits_failed": 0, "pushes": 0, "admin_call_errors": 0,
              "mixed_version_requests": 0}
    violations = []
    lock = threading.Lock()
    outputs = {}  # (prompt, max_new_tokens, version) -> set of outputs
    stop = threading.Event()
    published = [0]  # the fleet's version as the router last recorded it

    def record(msg):
        with lock:
            violations.append(msg)

    try:
        workers = [start_fixed_worker(log) for _ in range(3)]
        router = start_router(workers, "--health-interval-ms", "200", "--health-timeout-ms",
                              "500", "--health-failures", "2", "--max-attempts", "30",
                              "--admin-call-timeout-ms", "2000", "--admin-load-timeout-ms",
                              "20000", "--admin-lock-timeout-ms", "60000", "--log-level", "info",
                              log=log)
        client = Client(router.address, timeout=FREE_DEADLINE_S)
        constrained_client = Client(router.address, timeout=CONSTRAINED_DEADLINE_S)

        def check(kind, bound, r):
            versions = [r.dispatch_weight_version, r.weight_version]
            versions += [v for v, _ in r.weight_version_segments]
            if kind == "min":
                bad = [v for v in versions if v < bound]
            elif kind == "exact":
                bad = [v for v in versions if v != bound]
            else:
                bad = []
            if bad:
                record(f"request with {kind}_weight_version {bound} ran at {bad}: dispatch "
                       f"{r.dispatch_weight_version}, segments {r.weight_version_segments}, "
                       f"end {r.weight_version}")

        def generate_once(rng):
            prompt = rng.choice(PROMPTS)
            max_new_tokens = rng.choice([4, 8, 16])
            kind = rng.choice(["none", "min", "min", "exact"])
            current = published[0]
            bound = None
            kwargs = {}
            if kind == "min":
                bound = max(0, current - rng.choice([0, 1]))
                kwargs["min_weight_version"] = bound
            elif kind == "exact":
                bound = current
                kwargs["exact_weight_version"] = bound
            deadline = CONSTRAINED_DEADLINE_S if kind != "none" else FREE_DEADLINE_S
            start = time.monotonic()
            try:
                c = constrained_client if kind != "none" else client
                r = c.generate(text=prompt, temperature=0.0, max_new_tokens=max_new_tokens,
                               **kwargs).one()
                err = None
            except FleetError as e:
                err = e
            elapsed = time.monotonic() - start
            with lock:
                counts["requests"] += 1
                if kind != "none":
                    counts[kind] += 1
            if err is None:
                check(kind, bound, r)
                segments = {v for v, _ in r.weight_version_segments}
                with lock:
                    counts["ok"] += 1
                    if len(segments) > 1 or r.dispatch_weight_version != r.weight_version:
                        counts["mixed_version_requests"] += 1
                    elif r.finish_reason in ("length", "stop"):
                        key = (prompt, max_new_tokens, r.weight_version)
                        outputs.setdefault(key, set()).add(tuple(r.output_ids))
                return
            code = err.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED or elapsed > deadline + 5:
                record(f"request ({kind} {bound}) hung: {code.name} after {elapsed:.1f} s")
            elif kind != "none" and code == grpc.StatusCode.UNAVAILABLE:
                with lock:
                    counts["refused"] += 1  # no worker served an accepted version in time
            else:
                record(f"request '{prompt}' ({kind} {bound}) lost: {code.name}: {err.details()}")

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

        def fleet_version(c):
            return c.list_workers().fleet_weight_version

        def admin():
            admin_client = Client(router.address, timeout=120)
            step = 0
            while not stop.wait(admin_every_s):
                step += 1
                version = max(published[0], fleet_version(admin_client)) + 1
                try:
                    if step % 2:
                        req = admin_pb2.RefitWeightsRequest(model_path=str(STORIES),
                                                            weight_version=version)
                        try:
                            admin_client._admin("RefitWeights", req, load=True)
                            counts["refits"] += 1
                        except FleetError as e:
                            if e.response is None:
                                raise
                            counts["refits_failed"] += 1  # none activated: allowed
                    else:
                        try:
                            admin_client.update_weights_from_tensor(
                                {"model.norm.weight": pushed_norm(version)},
                                weight_version=version)
                        except FleetError as e:
                            if e.response is None:
                                raise
                        counts["pushes"] += 1
                except FleetError as e:
                    counts["admin_call_errors"] += 1  # no live worker, the lock: never a hang
                    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        record(f"admin call hung: {e.details()}")
                published[0] = max(published[0], fleet_version(admin_client))

        threads = [threading.Thread(target=load, args=(i,)) for i in range(num_clients)]
        threads += [threading.Thread(target=f) for f in (killer, admin)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            time.sleep(1)
            if verbose:
                print(f"[{duration_s - (deadline - time.monotonic()):5.0f} s] {counts}",
                      flush=True)
        stop.set()
        for t in threads:
            t.join(timeout=FREE_DEADLINE_S + 30)
            if t.is_alive():
                record("a driver thread did not finish (hang)")

        # The last version exists only in memory; then the restarted worker can only catch up
        # from a live peer.
        final = max(published[0], fleet_version(client)) + 1
        client.update_weights_from_tensor({"model.norm.weight": pushed_norm(final)},
                                          weight_version=final)
        workers[0].kill()
        counts["kills"] += 1
        time.sleep(0.1)
        workers[0].start(tries=50)
        converged = False
        listing = None
        direct_clients = [Client(w.address, timeout=5, via="worker") for w in workers]

        def served_versions():
            # Each worker's own answer: the router's listing can still show the killed process's
            # version when the restart came back before a health check saw it down.
            versions = []
            for d in direct_clients:
                try:
                    versions.append(d.get_load().weight_version)
                except Exception:  # noqa: BLE001 - still starting
                    versions.append(None)
            return versions

        for _ in range(300):
            listing = client.list_workers()
            if (listing.fleet_weight_version == final and listing.fleet_weight_source == "tensor"
                    and all(w.state == router_pb2.WORKER_STATE_LIVE and w.enabled and
                            w.weight_version == final and not w.reason
                            for w in listing.workers)
                    and all(v == final for v in served_versions())):
                converged = True
                break
            time.sleep(0.1)
        for d in direct_clients:
            d.close()
        if not converged:
            record(f"fleet did not converge to v{final}: {listing}")
        sums = {}
        for w in workers:
            direct = Client(w.address, timeout=30, via="worker")
            sums[w.address] = direct.weights_checker("checksum").rank_sha256
            f = direct.generate(text=PROMPTS[0], max_new_tokens=4, temperature=0.0).one()
            if f.weight_version != final:
                record(f"worker {w.address} serves v{f.weight_version}, fleet v{final}")
        if len(set(sums.values())) != 1:
            record(f"weight checksums differ across the fleet: {sums}")
        for key, outs in outputs.items():
            if len(outs) != 1:
                record(f"greedy outputs differ for {key}: {outs}")
        counts["fleet_version"] = final
        counts["distinct_prompt_versions"] = len(outputs)
    finally:
        stop.set()
        for w in workers:
            w.stop()
        if router is not None:
            router.stop()
        log.close()
    text = log_path.read_text(errors="replace")
    counts["peer_catch_ups"] = len(re.findall(r"caught up \S+ to weight_version \d+ from a peer",
                                              text))
    counts["disk_catch_ups"] = len(re.findall(r"caught up \S+ to weight_version \d+$", text,
                                              re.MULTILINE))
    counts["log"] = str(log_path)
    return counts, violations


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--duration-s", type=float, default=40.0)
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args()
    c, v = run(args.duration_s, args.clients, verbose=True)
    print(c)
    for line in v:
        print("VIOLATION:", line)
    sys.exit(1 if v else 0)
