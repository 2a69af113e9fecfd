"""Per-worker outcomes of admin broadcasts with real processes: a typo'd update keeps every
worker serving, a stopped (SIGSTOP) worker misses its deadline and never holds the admin lock or
the fleet, a restarted worker is caught up to the fleet's version before it is routed."""

import json
import subprocess
import threading

import grpc
import pytest

from chaos import Client, start_fixed_worker
from rlfleet import FleetError
from rlfleet.proto import router_pb2 as ROUTER
from rltest import BIN, STORIES, start_router, wait_for


def listing(client):
    return client.list_workers()


class Fleet:
    """`n` rl-workers on fixed ports (restartable at the same address) behind one rl-router,
    every log in tmp_path/fleet.log."""

    def __init__(self, tmp_path, n, *router_flags):
        self.log = open(tmp_path / "fleet.log", "w")
        self.workers = []
        self.router = None
        try:
            self.workers = [start_fixed_worker(self.log) for _ in range(n)]
            self.router = start_router(self.workers, *router_flags, log=self.log)
        except BaseException:
            self.close()
            raise
        self.address = self.router.address
        self.client = Client(self.address, timeout=60)

    def close(self):
        for w in self.workers:
            w.stop()
        if self.router is not None:
            self.router.stop()
        self.log.close()


def test_typo_update_keeps_every_worker_serving(tmp_path):
    fleet = Fleet(tmp_path, 2, "--health-interval-ms", "100")
    try:
        out = subprocess.run([str(BIN / "rlctl"), "--target", fleet.address, "--json",
                              "update-weights", "--from-disk", "/typo/path"],
                             capture_output=True, text=True, timeout=60)
        r = json.loads(out.stdout)
        assert not r["success"]
        assert [x["code"] for x in r["results"]] == ["INVALID_ARGUMENT"] * 2
        assert not any(x.get("leftOut") or x.get("left_out") for x in r["results"])
        for w in listing(fleet.client).workers:
            assert w.state == ROUTER.WORKER_STATE_LIVE and w.enabled and not w.reason, w
        served = {fleet.client.generate(text="Once upon a time", max_new_tokens=2,
                                        temperature=0.0).one().worker for _ in range(6)}
        assert served == {w.address for w in fleet.workers}
    finally:
        fleet.close()


def test_stopped_worker_never_holds_the_admin_lock_or_the_fleet(tmp_path):
    # Slow health checks: the per-worker admin deadline is what catches the stopped worker.
    fleet = Fleet(tmp_path, 2, "--health-interval-ms", "60000", "--admin-call-timeout-ms",
                  "1500", "--admin-lock-timeout-ms", "120000")
    stuck, good = fleet.workers
    try:
        stuck.freeze()
        with pytest.raises(FleetError) as e:  # one worker failed: the call raises
            fleet.client.pause("retract")
        by_worker = {x.worker: x for x in e.value.results}
        assert by_worker[good.address].success
        assert by_worker[stuck.address].code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert by_worker[stuck.address].left_out
        assert "deadline" in by_worker[stuck.address].message
        states = {w.address: w for w in listing(fleet.client).workers}
        assert states[stuck.address].state == ROUTER.WORKER_STATE_DEAD
        assert "deadline" in states[stuck.address].reason
        # The lock is free and the stuck worker is left out of the rest of the cycle.
        r = fleet.client.update_weights_from_disk(str(STORIES), weight_version=4)
        assert [x.worker for x in r.results] == [good.address] and r.success
        r = fleet.client.continue_generation()
        assert r.success
        # Generations (no client deadline) go to the healthy worker.
        for _ in range(4):
            f = fleet.client.generate(text="Once upon a time", max_new_tokens=4,
                                      temperature=0.0).one()
            assert f.worker == good.address and f.weight_version == 4
    finally:
        fleet.close()


def test_hung_worker_streams_are_cancelled_and_retried(tmp_path):
    fleet = Fleet(tmp_path, 2, "--health-interval-ms", "100", "--health-timeout-ms", "300",
                  "--max-attempts", "10")
    stuck, good = fleet.workers
    try:
        results, errors = [], []

        def one():
            try:
                # No client deadline: a stream left on the hung worker would hang forever.
                c = Client(fleet.address, timeout=None)
                results.append(c.generate(text="Once upon a time", max_new_tokens=16,
                                          temperature=0.0).one())
            except FleetError as e:
                errors.append(e)

        stuck.freeze()
        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a generation hung on the stopped worker"
        # Streaming requests that got no token yet were retried; none was lost.
        assert len(results) + len(errors) == 8
        for e in errors:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "marked dead" in e.details()
        assert all(f.worker == good.address for f in results)
    finally:
        fleet.close()


def test_restarted_worker_is_caught_up_before_it_is_routed(tmp_path):
    # One failed check marks the killed worker dead, usually before its replacement listens; a
    # restart faster than that is refused by the worker itself (rl-min-weight-version), so no
    # output comes from its start-up weights either way.
    fleet = Fleet(tmp_path, 2, "--health-interval-ms", "100", "--health-failures", "1")
    w0 = fleet.workers[0]
    try:
        r = fleet.client.update_weights_from_disk(str(STORIES), weight_version=7)
        assert r.success and r.weight_version == 7
        lst = listing(fleet.client)
        assert lst.fleet_weight_version == 7
        assert lst.fleet_weight_source == "disk:" + str(STORIES)
        w0.kill()
        w0.start(tries=50)  # back at its start-up version 0, same address
        # Never routed before it is caught up: every output is at the fleet's version.
        for _ in range(20):
            f = fleet.client.generate(text="Once upon a time", max_new_tokens=2,
                                      temperature=0.0).one()
            assert f.weight_version == 7, f.worker
        wait_for(lambda: Client(w0.address, via="worker").model_info().weight_version == 7,
                 "the restarted worker to be caught up to v7")

        def caught_up():
            ws = {w.address: w for w in listing(fleet.client).workers}
            w = ws[w0.address]
            return w.state == ROUTER.WORKER_STATE_LIVE and w.weight_version == 7 and not w.reason

        wait_for(caught_up, "the router to route to the caught-up worker")
        served = set()
        for _ in range(6):
            f = fleet.client.generate(text="Once upon a time", max_new_tokens=2,
                                      temperature=0.0).one()
            assert f.weight_version == 7
            served.add(f.worker)
        assert w0.address in served
    finally:
        fleet.close()
