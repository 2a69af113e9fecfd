"""Admin fencing across routers, with real processes: two rl-routers (--admin-lease-ttl-ms) over
the same two workers race admin broadcasts. The first router to make a control call holds each
worker's admin lease (GetServerInfo shows it) and keeps it while it lives; every control call of
the second is refused per worker, FAILED_PRECONDITION naming the holder, so a pause of one never
interleaves with an update of the other; once the holder is gone for one lease period the second
takes over. An operator's direct call (no lease claim) still runs. The tensor stream
(UpdateWeightsFromTensor) is fenced at its start the same way: the second router's push is
refused by every worker, naming the holder, and applies nothing."""

import threading
import time

import grpc
import pytest

from chaos import start_fixed_worker
from raw_client import Client, pb
from rltest import STORIES, start_router, wait_for

ROUTER = pb["router_pb2"]
ADMIN = pb["admin_pb2"]
TTL_MS = 1500


def live(client, n):
    r = client.router.ListWorkers(ROUTER.ListWorkersRequest(), timeout=10)
    return sum(w.state == ROUTER.WORKER_STATE_LIVE for w in r.workers) == n


def test_two_routers_race_admin_broadcasts(tmp_path):
    log = open(tmp_path / "fleet.log", "w")
    workers, routers = [], []
    try:
        workers = [start_fixed_worker(log) for _ in range(2)]
        for name in ("router-a", "router-b"):
            routers.append(start_router(workers, "--router-id", name, "--admin-lease-ttl-ms",
                                        str(TTL_MS), log=log))
        a, b = (Client(r.address, timeout=60) for r in routers)
        for c in (a, b):
            wait_for(lambda c=c: live(c, 2), "both workers live")
        # A takes the leases with its first control call.
        r = a.admin.PauseGeneration(ADMIN.PauseGenerationRequest(mode=ADMIN.PAUSE_MODE_RETRACT),
                                    timeout=60)
        assert r.success, r
        for w in workers:
            info = Client(w.address, timeout=30).admin.GetServerInfo(
                ADMIN.GetServerInfoRequest(), timeout=30)
            assert info.admin_lease_owner == "router-a" and info.admin_lease_expires_in_ms > 0
        a.admin.ContinueGeneration(ADMIN.ContinueGenerationRequest(), timeout=60)

        # Both race cycles (pause retract -> update -> continue) for several lease periods.
        outcomes = {"router-a": [], "router-b": []}
        stop = threading.Event()

        def cycles(name, client):
            version = 1_000_000 if name == "router-a" else 2_000_000
            while not stop.is_set():
                version += 1
                for call in (
                        lambda: client.admin.PauseGeneration(
                            ADMIN.PauseGenerationRequest(mode=ADMIN.PAUSE_MODE_RETRACT),
                            timeout=60),
                        lambda v=version: client.admin.UpdateWeightsFromDisk(
                            ADMIN.UpdateWeightsFromDiskRequest(model_path=str(STORIES),
                                                               weight_version=v), timeout=60),
                        lambda: client.admin.ContinueGeneration(
                            ADMIN.ContinueGenerationRequest(), timeout=60)):
                    try:
                        resp = call()
                        outcomes[name] += [(x.success, x.code, x.message) for x in resp.results]
                    except grpc.RpcError as e:
                        outcomes[name].append((False, e.code().name, e.details()))

        threads = [threading.Thread(target=cycles, args=(n, c))
                   for n, c in (("router-a", a), ("router-b", b))]
        for t in threads:
            t.start()
        time.sleep(3 * TTL_MS / 1000)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        assert outcomes["router-a"] and outcomes["router-b"]
        assert all(ok for ok, _, _ in outcomes["router-a"]), outcomes["router-a"][:5]
        for ok, code, message in outcomes["router-b"]:
            assert not ok and code == "FAILED_PRECONDITION" and "router-a" in message, \
                (ok, code, message)
        # The fleet is A's, at A's last version, serving.
        versions = {Client(w.address, timeout=30).admin.GetServerInfo(
            ADMIN.GetServerInfoRequest(), timeout=30).weight_version for w in workers}
        assert len(versions) == 1 and 1_000_000 < versions.pop() < 2_000_000
        # The tensor stream: B's push is refused by each worker at the stream's start,
        # FAILED_PRECONDITION naming A, and applies nothing; A's own push goes through.
        from rlfleet import Client as FleetClient
        from rlfleet import FleetError, read_safetensors
        ck = read_safetensors(STORIES)
        with pytest.raises(FleetError) as refused:
            FleetClient(routers[1].address, timeout=60).update_weights_from_tensor(
                ck, weight_version=2_999_999)
        results = refused.value.results
        assert len(results) == 2 and not any(x.success for x in results), results
        for x in results:
            assert x.code == grpc.StatusCode.FAILED_PRECONDITION, x
            assert "UpdateWeightsFromTensor" in x.message and "'router-a'" in x.message, x
        r = FleetClient(routers[0].address, timeout=60).update_weights_from_tensor(
            ck, weight_version=1_999_999)
        assert r.success and len(r.results) == 2, r
        versions = {Client(w.address, timeout=30).admin.GetServerInfo(
            ADMIN.GetServerInfoRequest(), timeout=30).weight_version for w in workers}
        assert versions == {1_999_999}, versions
        # An operator's own call (no lease claim) is not fenced.
        direct = Client(workers[0].address, timeout=30)
        direct.admin.FlushCache(ADMIN.FlushCacheRequest(), timeout=30)

        # A goes away: B is refused until A's lease lapses, then takes over.
        routers[0].stop()
        wait_for(lambda: b.admin.PauseGeneration(
            ADMIN.PauseGenerationRequest(mode=ADMIN.PAUSE_MODE_RETRACT), timeout=60).success,
            "router-b takes the leases", timeout_s=30, interval_s=0.2)
        b.admin.ContinueGeneration(ADMIN.ContinueGenerationRequest(), timeout=60)
        for w in workers:
            info = Client(w.address, timeout=30).admin.GetServerInfo(
                ADMIN.GetServerInfoRequest(), timeout=30)
            assert info.admin_lease_owner == "router-b"
    finally:
        for w in workers:
            w.stop()
        for r in routers:
            r.stop()
        log.close()
