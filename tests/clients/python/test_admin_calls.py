"""Every control-plane call of rlfleet.Client against real processes (two rl-workers behind an
rl-router, and a worker alone): pause / continue / flush, sleep and wake (with an in-memory
update while asleep), the weights checker's four actions, model / server info, list_weights,
health, metrics, load, the worker pool (remove, add, disable, enable), the resync of a worker
and the recovery of a STALE one after an in-memory update; the asyncio client's admin calls."""

import asyncio

import grpc
import numpy as np
import pytest

import rltest


def greedy(c, n=12):
    return c.generate(text="Once upon a time", max_new_tokens=n, temperature=0.0).one()


def test_pause_continue_flush_and_info(fleet2):
    from rlfleet import Client
    with Client(fleet2.address) as c:
        info = c.get_model_info()
        assert len(info.workers) == 2 and info.workers[0].info.vocab_size == 512
        r = c.pause_generation("retract")
        assert r.success and len(r.results) == 2
        assert all(w.info.paused for w in c.get_server_info().workers)
        assert c.flush_cache().success  # allowed while paused with retract
        c.continue_generation()
        assert not any(w.info.paused for w in c.get_server_info().workers)
        assert c.flush_cache().success
        assert greedy(c).completion_tokens == 12
        assert c.health_check() == "SERVING"
        m = c.get_metrics()
        assert m.total_workers == 2 and m.requests_total >= 1
        assert "rl_router" in m.prometheus_text
        names = {w.name: list(w.shape) for w in c.list_weights().weights}
        assert names["model.norm.weight"] == [64]
    with Client(fleet2.workers[0].address, via="worker") as w:
        load = w.get_load()
        assert load.weight_version == 0 and not load.paused
        assert w.health_check() == "SERVING"


def test_sleep_wake_with_an_update_while_asleep(fleet2):
    from rlfleet import Client, FleetError, read_safetensors, tensor_sha256
    ck = read_safetensors(rltest.STORIES)
    with Client(fleet2.address) as c:
        before = greedy(c)
        r = c.release_memory()
        assert r.success and len(r.results) == 2
        assert all(w.info.asleep for w in c.get_server_info().workers)
        with Client(fleet2.workers[0].address, via="worker") as w:
            # Asleep: not ready (not routable), yet live (a liveness probe must not restart it).
            assert w.health_check("rl.v1.Worker") == "NOT_SERVING"
            assert w.health_check() == "SERVING"
            with pytest.raises(FleetError):
                w.generate(text="Once upon a time", max_new_tokens=2)
        # Weights pushed while asleep are served after waking.
        rng = np.random.default_rng(7)
        new = {n: ck[n] + rng.normal(0, 0.05, ck[n].shape).astype(np.float32) for n in ck}
        assert c.update_weights_from_tensor(new, weight_version=9).weight_version == 9
        r = c.resume_memory()
        assert r.success
        assert not any(w.info.asleep for w in c.get_server_info().workers)
        after = greedy(c)
        assert after.weight_version == 9 and after.output_ids != before.output_ids
        want = {n: tensor_sha256(n, t) for n, t in new.items()}
        for w in c.weights_checker("checksum").workers:
            assert dict(w.result.tensor_sha256) == want


def test_weights_checker_actions(fleet2):
    from rlfleet import Client, FleetError
    with Client(fleet2.address) as c:
        with pytest.raises(FleetError):  # compare before any snapshot: every worker refuses
            c.weights_checker("compare")
        assert c.weights_checker("snapshot").success
        assert not any(w.result.changed for w in c.weights_checker("compare").workers)
        c.weights_checker("reset_tensors")
        changed = c.weights_checker("compare").workers
        assert all(len(w.result.changed) == 47 for w in changed)
        c.update_weights_from_disk(str(rltest.STORIES))
        assert not any(w.result.changed for w in c.weights_checker("compare").workers)
        with pytest.raises(ValueError):
            c.weights_checker("everything")


def test_worker_pool_calls_resync_and_stale_recovery(fleet2):
    from rlfleet import Client, FleetError, read_safetensors
    from rlfleet.proto import router_pb2
    a, b = (w.address for w in fleet2.workers)
    ck = read_safetensors(rltest.STORIES)
    with Client(fleet2.address) as c:
        listing = c.list_workers()
        assert sorted(w.address for w in listing.workers) == sorted([a, b])
        c.disable_worker(b)
        assert {greedy(c, 2).worker for _ in range(6)} == {a}
        c.enable_worker(b)
        rltest.wait_for(lambda: {greedy(c, 2).worker for _ in range(6)} == {a, b},
                        "both workers routed again")
        assert [w.address for w in c.remove_worker(b).workers] == [a]
        # An in-memory update while b is out of the pool: b comes back behind the fleet, the
        # router cannot replay a tensor stream, and the one peer at that version (a) is
        # disabled, so b is STALE until resynced (with a peer, b is caught up from it).
        c.update_weights_from_tensor(ck, weight_version=4)
        c.disable_worker(a)
        assert sorted(w.address for w in c.add_worker(b).workers) == sorted([a, b])
        rltest.wait_for(lambda: c.stale_workers() == [b], "the re-added worker listed STALE")
        with pytest.raises(FleetError) as e:
            c.recover_stale_workers()
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and b in str(e.value)
        # The pushed tensors are the checkpoint's: resync b from it at the fleet's version.
        r = c.recover_stale_workers(from_disk=str(rltest.STORIES))
        assert r is not None and [x.worker for x in r.results] == [b]
        assert r.results[0].weight_version == 4
        c.enable_worker(a)
        rltest.wait_for(lambda: all(w.state == router_pb2.WORKER_STATE_LIVE and w.enabled
                                    for w in c.list_workers().workers), "b live again")
        assert c.recover_stale_workers(from_disk=str(rltest.STORIES)) is None
        # resync_workers is the same call, for any worker.
        r = c.resync_workers([a], str(rltest.STORIES))
        assert r.results[0].weight_version == 4
        with pytest.raises(ValueError):
            c.resync_workers([], str(rltest.STORIES))
        assert {greedy(c, 2).weight_version for _ in range(4)} == {4}


def test_asyncio_admin_calls(fleet2):
    from rlfleet import AsyncClient, read_safetensors
    ck = read_safetensors(rltest.STORIES)

    async def run():
        async with AsyncClient(fleet2.address) as ac:
            await ac.wait_ready()
            assert (await ac.pause_generation("in_place")).success
            assert all(w.info.paused for w in (await ac.get_server_info()).workers)
            await ac.continue_generation()
            await ac.flush_cache()
            assert (await ac.release_memory()).success
            assert (await ac.resume_memory()).success
            assert (await ac.get_model_info()).workers[0].info.num_hidden_layers == 5
            assert len((await ac.list_weights()).weights) == 47
            assert len((await ac.weights_checker("checksum")).workers) == 2
            assert (await ac.health_check()) == "SERVING"
            assert (await ac.get_metrics()).total_workers == 2
            w = fleet2.workers[1].address
            await ac.disable_worker(w)
            await ac.enable_worker(w)
            assert (await ac.remove_worker(w)).workers[0].address != w
            await ac.add_worker(w)
            r = await ac.resync_workers([w], str(rltest.STORIES))
            assert r.success
            assert await ac.stale_workers() == []
            assert await ac.recover_stale_workers() is None
            r = await ac.update_weights_from_tensor(
                {"model.norm.weight": ck["model.norm.weight"] * np.float32(2.0)})
            assert r.success and len(r.results) == 2
            return (await ac.generate(text="Once upon a time", max_new_tokens=3)).one()

    assert asyncio.run(run()).completion_tokens == 3
