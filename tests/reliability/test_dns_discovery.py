"""--worker-dns with real processes: rl-router finds its workers through a fake DNS server on
127.0.0.1 (--dns-server, tests/testing/fake_dns.py). Every worker listens on the same port on its
own loopback address (127.0.0.2, .3, .4), as pods of a headless Service do; the test scales the
fleet up and down by changing the name's answer, under load, and no request is lost: a worker
that leaves the answer is removed from routing (its calls finish), then SIGTERMed as Kubernetes
does, and drains."""

import random
import signal
import threading
import time

import grpc

from chaos import PROMPTS
from fake_dns import FakeDns
from raw_client import Client, pb
from rltest import start_router, start_worker, wait_for

ROUTER = pb["router_pb2"]
GEN = pb["generate_pb2"]
NAME = "rlfleet-worker.rl.test"
IPS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def listed(client):
    r = client.router.ListWorkers(ROUTER.ListWorkersRequest(), timeout=10)
    return {w.address: w.state for w in r.workers}


def live_set(client):
    return {a for a, s in listed(client).items() if s == ROUTER.WORKER_STATE_LIVE}


def start_workers(log):
    """One worker per address in IPS, all on one port (retried when the port is taken)."""
    from rltest import free_port
    for _ in range(20):
        port = free_port()
        workers = []
        try:
            for ip in IPS:
                workers.append(start_worker("--host", ip, "--kv-cache-gb", "0.02", "--log-level",
                                            "warn", port=port, log=log))
            return port, workers
        except RuntimeError:
            for w in workers:
                w.stop()
    raise RuntimeError("no port free on every loopback address")


def test_scale_up_and_down_through_dns_under_load(tmp_path):
    log = open(tmp_path / "fleet.log", "w")
    dns = FakeDns()
    workers, router = [], None
    try:
        port, workers = start_workers(log)
        addr = {ip: f"{ip}:{port}" for ip in IPS}
        dns.set(NAME, IPS[:1])
        router = start_router([], "--worker-dns", f"{NAME}:{port}", "--dns-server", dns.address,
                              "--dns-interval-ms", "200", "--max-attempts", "10", log=log)
        client = Client(router.address, timeout=60)
        wait_for(lambda: live_set(client) == {addr[IPS[0]]}, "one worker found")
        stop = threading.Event()
        lost, ok = [], [0]
        lock = threading.Lock()

        def load(seed):
            rng = random.Random(seed)
            c = Client(router.address, timeout=60)
            while not stop.is_set():
                req = GEN.GenerateRequest(text=rng.choice(PROMPTS), stream=rng.random() < 0.5)
                req.sampling_params.temperature = 0.0
                req.sampling_params.max_new_tokens = rng.choice([8, 16])
                try:
                    finals = [m.final for m in c.router.Generate(req, timeout=60)
                              if m.HasField("final")]
                    with lock:
                        if len(finals) != 1 or finals[0].finish_reason == GEN.FINISH_REASON_ABORT:
                            lost.append(f"finals: {finals}")
                        else:
                            ok[0] += 1
                except grpc.RpcError as e:
                    with lock:
                        lost.append(f"{e.code().name}: {e.details()}")

        threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        try:
            # Scale up: 1 → 3.
            dns.set(NAME, IPS)
            wait_for(lambda: live_set(client) == set(addr.values()), "three workers found")
            before = ok[0]
            wait_for(lambda: ok[0] > before + 20, "requests served by the larger fleet")
            served = {client.generate(text=PROMPTS[0], max_new_tokens=2, temperature=0.0).worker
                      for _ in range(30)}
            assert served == set(addr.values())
            # Scale down: 3 → 1; the two leaving workers are removed, then SIGTERMed.
            dns.set(NAME, IPS[2:])
            wait_for(lambda: set(listed(client)) == {addr[IPS[2]]}, "two workers removed")
            for w in workers[:2]:
                w.proc.send_signal(signal.SIGTERM)
                assert w.proc.wait(timeout=60) == 0
            before = ok[0]
            wait_for(lambda: ok[0] > before + 20, "requests served by the smaller fleet")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a client thread hung"
        assert not lost, lost[:10]
        # To zero and back (no load: with no worker at all a request has nowhere to go): an
        # answer with no address empties the pool; a lookup that fails keeps it.
        dns.set(NAME, [])
        wait_for(lambda: not listed(client), "every worker removed")
        dns.set(NAME, IPS[2:])
        wait_for(lambda: live_set(client) == {addr[IPS[2]]}, "the worker found again")
        dns.stop()
        time.sleep(1.0)  # several rounds fail (the server is gone)
        assert live_set(client) == {addr[IPS[2]]}
        assert client.generate(text=PROMPTS[0], max_new_tokens=2,
                               temperature=0.0).worker == addr[IPS[2]]
    finally:
        for w in workers:
            w.stop()
        if router is not None:
            router.stop()
        dns.stop()
        log.close()
