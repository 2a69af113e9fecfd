"""A router restart loses nothing (issue 31), with real rl-worker and rl-router processes.

- SIGKILL of rl-router (with --cache-dir) in the middle of a multi-turn load, then a restart at
  the same address over the same folder: every trajectory whose final reached a client before
  the kill is retrieved exactly (tokens, loss masks, logprob bits, per-token versions), and a
  turn 2 sent after the restart reuses turn 1's generated tokens (mask 1, same logprobs).
- A restart between a pause and its continue leaves no request hanging: the fleet is still known
  paused, requests queue until the continue and then finish; a worker paused directly (not
  through the router) gets no request.
- A restart after an update never routes to an old-version worker: a worker restarted at its
  start-up version while the router was down is caught up before it serves.
- A worker AHEAD of the restored version (an update the router died before recording) is out
  of routing with the reason until the operator adopts its version (rlctl workers adopt), after
  which the others catch up and the adopted version survives the next restart.
- Workers added and removed at run time (AddWorker / RemoveWorker) are the registry after a
  restart, also when a --worker flag names a removed one.
- A worker paused directly between two health checks refuses the router's requests, which are
  retried elsewhere at once: none waits on a pause the router does not know about.
- A full disk (prlimit --fsize on the running router): no answer claims durability, text
  prompts are refused UNAVAILABLE naming the store, and once space returns the store writes the
  whole cache again (every answered trajectory survives the next restart).
- Without --cache-dir the router says so: text-prompt answers carry cache_history_unknown, and
  rl_router_cache_durable is 0.
"""

import json
import shutil
import struct
import subprocess
import threading
import time

import grpc

from chaos import start_fixed_worker
from rlfleet._stubs import generate_pb2 as GEN
from rlfleet._stubs import router_pb2 as ROUTER
from rlfleet._stubs import router_pb2_grpc
from rltest import BIN, STORIES, free_port, start_router, wait_for


class Client:
    """The raw Router stub (this test reads fields the typed client does not surface)."""

    def __init__(self, target, timeout=60):
        self.channel = grpc.insecure_channel(target)
        self.router = router_pb2_grpc.RouterStub(self.channel)
PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went", "One day, a bird",
           "The sun was", "A big red ball"]


def bits(values):
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


def trajectory_of(t):
    return (list(t.tokens), list(t.loss_mask), bits(t.rollout_logp),
            list(t.token_weight_versions))


def generate(client, text, seed, timeout=30):
    req = GEN.GenerateRequest(text=text, return_trajectory=True, return_logprob=True)
    req.sampling_params.temperature = 1.0
    req.sampling_params.seed = seed
    req.sampling_params.max_new_tokens = 12
    final = None
    for msg in client.router.Generate(req, timeout=timeout):
        if msg.HasField("final"):
            final = msg.final
    return final


def rlctl(target, *args):
    out = subprocess.run([str(BIN / "rlctl"), "--target", target, "--json", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def live_workers(client, n):
    listing = client.router.ListWorkers(ROUTER.ListWorkersRequest(), timeout=10)
    return sum(w.state == ROUTER.WORKER_STATE_LIVE for w in listing.workers) == n


class Fleet:
    def __init__(self, tmp_path, n, *router_flags):
        self.log = open(tmp_path / "fleet.log", "w")
        self.workers, self.router = [], None
        try:
            self.workers = [start_fixed_worker(self.log) for _ in range(n)]
            self.router = start_router(self.workers, "--log-level", "warn", *router_flags,
                                       port=str(free_port()), log=self.log)
        except BaseException:
            self.close()
            raise
        self.client = Client(self.router.address, timeout=60)
        wait_for(lambda: live_workers(self.client, n), "live workers")

    def restart_router(self):
        self.router.start(tries=50)  # the same arguments: same port, same --cache-dir
        self.client = Client(self.router.address, timeout=60)

        def reachable():
            # gRPC shares subchannels between channels: the killed router's may still be in
            # its reconnect backoff for a moment.
            try:
                self.client.router.ListWorkers(ROUTER.ListWorkersRequest(), timeout=10,
                                               wait_for_ready=True)
                return True
            except grpc.RpcError:
                return False

        wait_for(reachable, "the restarted router to answer")

    def close(self):
        for w in self.workers:
            w.stop()
        if self.router is not None:
            self.router.stop()
        self.log.close()


def test_sigkill_under_multiturn_load_loses_no_trajectory(tmp_path):
    fleet = Fleet(tmp_path, 2, "--cache-dir", str(tmp_path / "state"))
    try:
        done = {}  # text -> (trajectory, turn-1 text or None): finals that reached us
        mu = threading.Lock()
        stop = threading.Event()
        errors = []

        def converse(worker_id):
            client = fleet.client
            k = 0
            while not stop.is_set():
                seed = worker_id * 1000 + k
                prompt = f"{PROMPTS[k % len(PROMPTS)]} ({worker_id}.{k})"
                k += 1
                try:
                    f1 = generate(client, prompt, seed)
                    assert not f1.cache_history_unknown and not f1.trajectory_not_durable
                    with mu:
                        done[prompt + f1.text] = (trajectory_of(f1.trajectory), None)
                    turn2 = prompt + f1.text + " Then"
                    f2 = generate(client, turn2, seed + 1)
                    with mu:
                        done[turn2 + f2.text] = (trajectory_of(f2.trajectory), prompt + f1.text)
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE and not stop.is_set():
                        errors.append(repr(e))
                    return  # the router is gone
                except AssertionError as e:
                    errors.append(str(e))
                    return

        threads = [threading.Thread(target=converse, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        wait_for(lambda: len(done) >= 30, "30 finals before the kill", timeout_s=120)
        fleet.router.kill()  # SIGKILL mid-load: some requests are in flight
        stop.set()
        for t in threads:
            t.join(timeout=90)
        assert not errors, errors
        with mu:
            before = dict(done)
        t0 = time.monotonic()
        fleet.restart_router()
        print(f"router back in {time.monotonic() - t0:.2f} s with {len(before)} trajectories")
        client = fleet.client
        for text, (traj, _) in before.items():
            r = client.router.RetrieveFromText(ROUTER.RetrieveFromTextRequest(text=text),
                                               timeout=30)
            assert r.matched_bytes == len(text.encode()), text
            assert trajectory_of(r.trajectory) == traj, text
            assert not r.cache_history_unknown
        # Turn 2 after the restart reuses turn 1's generated tokens exactly.
        wait_for(lambda: live_workers(client, 2), "live workers after the restart")
        turn1 = [(text, traj) for text, (traj, prev) in before.items() if prev is None][:10]
        for i, (text, (tokens, mask, logp, versions)) in enumerate(turn1):
            f = generate(client, text + " And", 7000 + i)
            got = trajectory_of(f.trajectory)
            n = len(tokens)
            assert got[0][:n] == tokens and got[1][:n] == mask and got[2][:n] == logp, text
            assert got[3][:n] == versions, text
            assert 1 in mask, "turn 1 had generated tokens (mask 1)"
            assert not f.cache_history_unknown and not f.trajectory_not_durable
    finally:
        fleet.close()


def test_restart_between_pause_and_continue_leaves_nothing_hanging(tmp_path):
    fleet = Fleet(tmp_path, 2, "--cache-dir", str(tmp_path / "state"))
    try:
        rlctl(fleet.router.address, "pause", "--mode", "retract")
        fleet.router.kill()
        fleet.restart_router()
        client = fleet.client
        wait_for(lambda: live_workers(client, 2), "live workers after the restart")
        listing = client.router.ListWorkers(ROUTER.ListWorkersRequest(), timeout=10)
        assert not any("paused while the fleet is not" in w.reason for w in listing.workers)
        # The fleet is known paused: requests queue on the workers until the continue.
        results, errors = [], []

        def one(i):
            try:
                results.append(generate(client, f"Once upon a time {i}", i, timeout=60))
            except grpc.RpcError as e:
                errors.append(repr(e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        assert not results, "a request was served while the fleet was paused"
        t0 = time.monotonic()
        rlctl(fleet.router.address, "continue")
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert len(results) == 8
        assert time.monotonic() - t0 < 30
        # A worker paused directly, behind the router's back: no request goes to it.
        paused, other = fleet.workers
        rlctl(paused.address, "pause", "--mode", "in_place")
        wait_for(lambda: any("paused while the fleet is not" in w.reason for w in
                             client.router.ListWorkers(ROUTER.ListWorkersRequest(),
                                                       timeout=10).workers),
                 "the router to see the direct pause")
        served = [generate(client, f"The little dog {i}", i, timeout=20).worker
                  for i in range(10)]
        assert set(served) == {other.address}, served
        rlctl(paused.address, "continue")
    finally:
        fleet.close()


def test_restart_after_update_never_routes_an_old_worker(tmp_path):
    ckpt = tmp_path / "step-5"
    shutil.copytree(STORIES, ckpt)
    fleet = Fleet(tmp_path, 2, "--cache-dir", str(tmp_path / "state"))
    try:
        r = rlctl(fleet.router.address, "update-weights", "--from-disk", str(ckpt),
                  "--version", "5")
        assert r["success"], r
        fleet.router.kill()
        # While the router is down, one worker restarts at its start-up version (0).
        old = fleet.workers[1]
        old.kill()
        old.start(tries=50)
        fleet.restart_router()
        client = fleet.client
        versions = []
        deadline = time.monotonic() + 60
        while len(versions) < 40 and time.monotonic() < deadline:
            try:
                versions.append(generate(client, "Once upon a time", len(versions),
                                         timeout=20).weight_version)
            except grpc.RpcError as e:  # no routable worker yet: refused, retryable
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                time.sleep(0.1)
        assert len(versions) == 40
        assert set(versions) == {5}, versions
        # The restarted worker is caught up from the recorded folder, then serves.
        wait_for(lambda: all(w.weight_version == 5 and w.state == ROUTER.WORKER_STATE_LIVE
                             for w in client.router.ListWorkers(ROUTER.ListWorkersRequest(),
                                                                timeout=10).workers),
                 "the old worker caught up", timeout_s=60)
    finally:
        fleet.close()


def test_without_cache_dir_answers_say_history_unknown(tmp_path):
    fleet = Fleet(tmp_path, 1, "--metrics-port", "0")
    try:
        f = generate(fleet.client, "Once upon a time", 1)
        assert f.cache_history_unknown and f.trajectory_not_durable
        r = fleet.client.router.RetrieveFromText(
            ROUTER.RetrieveFromTextRequest(text="Once upon a time" + f.text), timeout=30)
        assert r.cache_history_unknown
        m = fleet.client.router.GetMetrics(ROUTER.GetMetricsRequest(), timeout=10)
        assert not m.cache.durable
        assert m.cache.history_unknown_answers >= 2
        assert "rl_router_cache_durable 0" in m.prometheus_text
    finally:
        fleet.close()


def listing_of(client):
    return client.router.ListWorkers(ROUTER.ListWorkersRequest(), timeout=10)


def test_worker_ahead_after_restart_is_kept_out_until_adopted(tmp_path):
    """The router died in the middle of an update: one worker installed version 6, the record
    still says 5. After the restart that worker is out of routing with the reason until the
    operator adopts its version; then the others catch up from the named folder, and the
    adopted version survives the next restart."""
    step5, step6 = tmp_path / "step-5", tmp_path / "step-6"
    shutil.copytree(STORIES, step5)
    shutil.copytree(STORIES, step6)
    fleet = Fleet(tmp_path, 2, "--cache-dir", str(tmp_path / "state"))
    try:
        r = rlctl(fleet.router.address, "update-weights", "--from-disk", str(step5),
                  "--version", "5")
        assert r["success"], r
        fleet.router.kill()
        behind, ahead = fleet.workers
        r = rlctl(ahead.address, "update-weights", "--from-disk", str(step6), "--version", "6")
        assert r["success"], r
        fleet.restart_router()
        client = fleet.client

        def states():
            return {w.address: w for w in listing_of(client).workers}

        wait_for(lambda: states()[ahead.address].state == ROUTER.WORKER_STATE_VERSION_MISMATCH
                 and states()[behind.address].state == ROUTER.WORKER_STATE_LIVE,
                 "the ahead worker listed VERSION_MISMATCH")
        reason = states()[ahead.address].reason
        assert "ahead of the fleet's 5" in reason and "adopt" in reason, reason
        served = [generate(client, f"Once upon a time {i}", i, timeout=20) for i in range(20)]
        assert {f.worker for f in served} == {behind.address}
        assert {f.weight_version for f in served} == {5}
        # Adopting a worker that is not ahead is refused with the reason.
        out = subprocess.run([str(BIN / "rlctl"), "--target", fleet.router.address, "workers",
                              "adopt", behind.address], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode != 0 and "not ahead" in out.stdout + out.stderr, out
        r = rlctl(fleet.router.address, "workers", "adopt", ahead.address, "--from-disk",
                  str(step6))
        assert r["fleet_weight_version"] == "6", r
        wait_for(lambda: all(w.state == ROUTER.WORKER_STATE_LIVE and w.weight_version == 6
                             for w in listing_of(client).workers),
                 "the other worker caught up to the adopted version", timeout_s=60)
        served = [generate(client, f"The little dog {i}", i, timeout=20) for i in range(10)]
        assert {f.weight_version for f in served} == {6}
        assert {f.worker for f in served} == {behind.address, ahead.address}
        fleet.router.kill()
        fleet.restart_router()
        listing = listing_of(fleet.client)
        assert listing.fleet_weight_version == 6
        assert listing.fleet_weight_source == f"disk:{step6}"
    finally:
        fleet.close()


def test_workers_added_and_removed_at_run_time_survive_a_restart(tmp_path):
    fleet = Fleet(tmp_path, 2, "--cache-dir", str(tmp_path / "state"))
    extra = start_fixed_worker(fleet.log)
    try:
        flag_worker = fleet.workers[0]
        rlctl(fleet.router.address, "workers", "add", extra.address)
        rlctl(fleet.router.address, "workers", "remove", flag_worker.address)
        fleet.router.kill()
        fleet.restart_router()  # the same --worker flags: both original workers
        client = fleet.client
        wait_for(lambda: live_workers(client, 2), "live workers after the restart")
        addresses = {w.address for w in listing_of(client).workers}
        assert addresses == {fleet.workers[1].address, extra.address}, addresses
        served = {generate(client, f"A big red ball {i}", i, timeout=20).worker
                  for i in range(8)}
        assert flag_worker.address not in served
        # Adding the removed flag worker back is kept too.
        rlctl(fleet.router.address, "workers", "add", flag_worker.address)
        fleet.router.kill()
        fleet.restart_router()
        wait_for(lambda: live_workers(fleet.client, 3), "three live workers")
    finally:
        extra.stop()
        fleet.close()


def test_a_worker_paused_between_health_checks_gets_no_request(tmp_path):
    """Health checks a minute apart: a worker paused directly right after one refuses the
    router's requests (the router says its fleet is running), which are retried on the other
    worker at once instead of waiting on a pause nobody will continue."""
    fleet = Fleet(tmp_path, 2, "--health-interval-ms", "60000")
    try:
        paused, other = fleet.workers
        rlctl(paused.address, "pause", "--mode", "in_place")
        t0 = time.monotonic()
        served = [generate(fleet.client, f"One day, a bird {i}", i, timeout=20).worker
                  for i in range(10)]
        assert set(served) == {other.address}, served
        assert time.monotonic() - t0 < 20
        listing = listing_of(fleet.client)
        reasons = {w.address: w.reason for w in listing.workers}
        assert "paused while the fleet is not" in reasons[paused.address], reasons
        rlctl(paused.address, "continue")
    finally:
        fleet.close()


def test_a_full_disk_refuses_text_prompts_then_recovers(tmp_path):
    """The router's files may not grow (prlimit --fsize on the running router: its writes fail
    with EFBIG, as on a full disk). No trajectory is acknowledged as durable: the answer whose
    insert was lost says so, later text prompts are refused UNAVAILABLE naming the store; once
    the limit is lifted the store writes the whole cache again and answers are durable."""
    state = tmp_path / "state"
    fleet = Fleet(tmp_path, 1, "--cache-dir", str(state), "--cache-store-retry-ms", "100",
                  "--metrics-port", "0")
    try:
        client = fleet.client
        first = generate(client, "Once upon a time", 1)
        assert not first.trajectory_not_durable
        db = state / "router-state.sqlite3"
        wal = state / "router-state.sqlite3-wal"
        full = max(p.stat().st_size for p in (db, wal) if p.exists())
        pid = str(fleet.router.proc.pid)
        subprocess.run(["prlimit", "--pid", pid, f"--fsize={full}:"], check=True)
        outcomes = []
        for i in range(6):
            try:
                f = generate(client, f"The little dog {i}", i)
                outcomes.append(("answered", f.trajectory_not_durable, f.text))
            except grpc.RpcError as e:
                outcomes.append((e.code(), e.details(), ""))
        assert all(o[1] for o in outcomes if o[0] == "answered"), outcomes  # never "durable"
        refused = [o for o in outcomes if o[0] == grpc.StatusCode.UNAVAILABLE]
        assert refused, outcomes
        assert str(db) in refused[0][1] and "retry" in refused[0][1], refused[0]
        subprocess.run(["prlimit", "--pid", pid, "--fsize=unlimited:"], check=True)

        def durable_again():
            try:
                return not generate(client, "A big red ball", 7).trajectory_not_durable
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                return False

        wait_for(durable_again, "the store to recover", timeout_s=30)
        m = client.router.GetMetrics(ROUTER.GetMetricsRequest(), timeout=10)
        assert m.cache.durable
        assert "rl_router_cache_store_recoveries_total 1" in m.prometheus_text
        # Every answered trajectory, those whose batch was lost included, survives a restart.
        answered = [("The little dog %d" % i) + o[2] for i, o in enumerate(outcomes)
                    if o[0] == "answered"]
        fleet.router.kill()
        fleet.restart_router()
        for text in ["Once upon a time" + first.text] + answered:
            r = fleet.client.router.RetrieveFromText(ROUTER.RetrieveFromTextRequest(text=text),
                                                     timeout=30)
            assert r.matched_bytes == len(text.encode()), text
    finally:
        fleet.close()
