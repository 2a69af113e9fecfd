"""SIGTERM as Kubernetes sends it (rolling upgrade, node drain), with real processes: every
worker of a fleet under load is restarted in turn by SIGTERM, and no request is lost or
duplicated (the draining worker finishes what runs and refuses new work retryably, so the router
serves it elsewhere); a worker's readiness (`rl.v1.Worker`) goes NOT_SERVING while its liveness
stays SERVING during the drain; a draining router refuses new generations and admin calls while
its streams in flight finish, then exits 0."""

import random
import signal
import threading
import time

import grpc

from chaos import PROMPTS, start_fixed_worker
from raw_client import Client, pb
from rltest import start_router, wait_for

ROUTER = pb["router_pb2"]
GEN = pb["generate_pb2"]
ADMIN = pb["admin_pb2"]
HEALTH = pb["health_pb2"]


def health(address, service=""):
    with grpc.insecure_channel(address) as ch:
        try:
            r = pb["health_pb2_grpc"].HealthStub(ch).Check(
                HEALTH.HealthCheckRequest(service=service), timeout=5)
            return HEALTH.HealthCheckResponse.ServingStatus.Name(r.status)
        except grpc.RpcError as e:
            return e.code().name


def start_held_request(generate, admin, tries=5):
    """A 400-token stream through `generate`, its worker (`admin`) paused in place while it runs:
    returns (stream, first message). On a fast CPU the request can end between its first chunk
    and the pause; then the worker is continued, the stream read out and a new one started."""
    for _ in range(tries):
        req = GEN.GenerateRequest(text=PROMPTS[0], stream=True)
        req.sampling_params.temperature = 0.0
        req.sampling_params.max_new_tokens = 400
        req.sampling_params.ignore_eos = True  # runs its whole budget: still running when paused
        stream = generate(req, timeout=60)
        first = next(stream)
        assert first.HasField("chunk")
        admin.PauseGeneration(ADMIN.PauseGenerationRequest(mode=ADMIN.PAUSE_MODE_IN_PLACE),
                              timeout=30)
        if admin.GetServerInfo(ADMIN.GetServerInfoRequest(), timeout=30).num_running == 1:
            return stream, first
        admin.ContinueGeneration(ADMIN.ContinueGenerationRequest(), timeout=30)
        for _ in stream:
            pass
    raise AssertionError(f"the request ended before the pause {tries} times")


class Load:
    """`n` client threads generating through `address` until stop(); counts every outcome."""

    def __init__(self, address, n=4):
        self.client = Client(address, timeout=60)
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.lost = []
        self.threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def _loop(self, seed):
        rng = random.Random(seed)
        while not self.stopped.is_set():
            req = GEN.GenerateRequest(text=rng.choice(PROMPTS), stream=rng.random() < 0.5)
            req.sampling_params.temperature = 0.0
            req.sampling_params.max_new_tokens = rng.choice([8, 16, 32])
            finals = 0
            try:
                for msg in self.client.router.Generate(req, timeout=60):
                    if msg.HasField("final"):
                        finals += 1
                        reason = msg.final.finish_reason
                err = None
            except grpc.RpcError as e:
                err = e
            with self.lock:
                if err is not None:
                    self.lost.append(f"{err.code().name}: {err.details()}")
                elif finals != 1:
                    self.lost.append(f"{finals} final messages")
                elif reason == GEN.FINISH_REASON_ABORT:
                    self.lost.append("aborted")
                else:
                    self.ok += 1

    def stop(self):
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in self.threads), "a client thread hung"


def live(client, address):
    listing = client.router.ListWorkers(ROUTER.ListWorkersRequest(), timeout=10)
    return any(w.address == address and w.state == ROUTER.WORKER_STATE_LIVE for w in listing.workers)


def test_rolling_sigterm_restart_of_every_worker_loses_no_request(tmp_path):
    log = open(tmp_path / "fleet.log", "w")
    workers, router = [], None
    try:
        workers = [start_fixed_worker(log) for _ in range(3)]
        router = start_router(workers, "--health-interval-ms", "100", "--max-attempts", "10",
                              log=log)
        client = Client(router.address, timeout=60)
        for w in workers:
            wait_for(lambda w=w: live(client, w.address), f"{w.address} live")
        load = Load(router.address)
        try:
            time.sleep(1.0)
            for w in workers:
                before = load.ok
                w.proc.send_signal(signal.SIGTERM)
                # It drains (what runs finishes; new work goes elsewhere) and exits cleanly.
                assert w.proc.wait(timeout=60) == 0
                w.start(tries=50)
                wait_for(lambda w=w: live(client, w.address), f"{w.address} live again")
                wait_for(lambda b=before: load.ok > b + 5, "requests served after the restart")
        finally:
            load.stop()
        assert not load.lost, load.lost[:10]
        assert load.ok >= 30, load.ok
        # The restarted fleet serves on every worker.
        served = {client.generate(text=PROMPTS[0], max_new_tokens=2, temperature=0.0).worker
                  for _ in range(30)}
        assert served == {w.address for w in workers}
    finally:
        for w in workers:
            w.stop()
        if router is not None:
            router.stop()
        log.close()


def test_draining_worker_is_live_but_not_ready(tmp_path):
    """A paused-in-place request holds a SIGTERMed worker in its drain: liveness SERVING,
    readiness NOT_SERVING, new generations refused UNAVAILABLE; after the grace period the request
    ends aborted with its partial output and the process exits 0."""
    log = open(tmp_path / "worker.log", "w")
    w = start_fixed_worker(log)
    # start_fixed_worker takes the default grace; restart with a short one.
    w.stop()
    w.args += ["--drain-grace-s", "1.5"]
    w.start(tries=50)
    try:
        direct = Client(w.address, timeout=60)
        stream, first = start_held_request(direct.worker.Generate, direct.admin)
        w.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: health(w.address, "rl.v1.Worker") == "NOT_SERVING", "readiness off")
        assert health(w.address) == "SERVING"
        new = GEN.GenerateRequest(text=PROMPTS[1])
        new.sampling_params.max_new_tokens = 2
        try:
            list(direct.worker.Generate(new, timeout=10))
            raise AssertionError("a draining worker took new work")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "draining" in e.details(), e
        tokens = list(first.chunk.token_ids)
        final = None
        for msg in stream:
            if msg.HasField("chunk"):
                tokens += list(msg.chunk.token_ids)
            if msg.HasField("final"):
                final = msg.final
        assert final is not None and final.finish_reason == GEN.FINISH_REASON_ABORT
        assert 1 <= len(final.output_ids) < 400 and list(final.output_ids) == tokens
        assert w.proc.wait(timeout=60) == 0
    finally:
        w.stop()
        log.close()


def test_draining_router_refuses_new_work_and_admin_calls(tmp_path):
    """A SIGTERMed router with a stream in flight (its worker paused in place): readiness
    (`rl.v1.Router`) NOT_SERVING, liveness SERVING, Generate and admin calls refused UNAVAILABLE;
    the stream finishes once the worker resumes, and the router exits 0."""
    log = open(tmp_path / "fleet.log", "w")
    w = start_fixed_worker(log)
    router = None
    try:
        router = start_router([w], "--drain-grace-s", "60", log=log)
        client = Client(router.address, timeout=60)
        wait_for(lambda: live(client, w.address), "worker live")
        direct = Client(w.address, timeout=60)
        stream, _ = start_held_request(client.router.Generate, direct.admin)
        assert health(router.address, "rl.v1.Router") == "SERVING"
        router.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: health(router.address, "rl.v1.Router") == "NOT_SERVING", "readiness off")
        assert health(router.address) == "SERVING"
        for call in (lambda: list(client.router.Generate(GEN.GenerateRequest(text="Hi"),
                                                         timeout=10)),
                     lambda: client.admin.ContinueGeneration(ADMIN.ContinueGenerationRequest(),
                                                             timeout=10),
                     lambda: client.router.AddWorker(ROUTER.AddWorkerRequest(address="x:1"),
                                                     timeout=10)):
            try:
                call()
                raise AssertionError("a draining router took a call")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE and "draining" in e.details(), e
        assert router.proc.poll() is None  # waits for its stream
        direct.admin.ContinueGeneration(ADMIN.ContinueGenerationRequest(), timeout=30)
        final = [m.final for m in stream if m.HasField("final")]
        assert len(final) == 1 and len(final[0].output_ids) == 400
        assert router.proc.wait(timeout=60) == 0
    finally:
        w.stop()
        if router is not None:
            router.stop()
        log.close()
