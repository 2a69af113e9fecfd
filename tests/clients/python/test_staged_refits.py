"""Staged refits from Python (issue 30) against two real rl-workers behind an rl-router: tensors
pushed with stage=True over the tensor stream and over a `tcp` group (ReceiveWeights and the
two-phase receive) are staged while the fleet keeps serving the old version, and served only after
activate_weights, which leaves every worker holding exactly the pushed tensors; a checkpoint
staged with stage_weights can be dropped (activation then refuses); refit_weights refits the fleet
in one call; the asyncio client does the same."""

import asyncio

import grpc
import numpy as np
import pytest

import rltest

PROMPT = "Once upon a time"


def greedy(c):
    return c.generate(text=PROMPT, max_new_tokens=12, temperature=0.0).one()


def perturbed(seed, scale=0.05):
    from rlfleet import read_safetensors
    ck = read_safetensors(rltest.STORIES)
    rng = np.random.default_rng(seed)
    return {n: ck[n] + rng.normal(0.0, scale, ck[n].shape).astype(np.float32) for n in ck}


def assert_fleet_holds(c, tensors):
    from rlfleet import tensor_sha256
    want = {n: tensor_sha256(n, t) for n, t in tensors.items()}
    for w in c.weights_checker("checksum").workers:
        assert dict(w.result.tensor_sha256) == want, w.worker


def staged(c):
    """(has staged, source, version) of every worker."""
    return [(w.info.has_staged_weights, w.info.staged_source, w.info.staged_weight_version)
            for w in c.get_server_info().workers]


def test_staged_tensor_push_serves_only_after_activate(fleet2):
    from rlfleet import Client, FleetError
    with Client(fleet2.address) as c:
        before = greedy(c)
        pushed = perturbed(5)
        r = c.push_weights(pushed, stage=True, weight_version=21)
        assert r.success and len(r.results) == 2
        assert staged(c) == [(True, "tensor", 21)] * 2
        now = greedy(c)  # staged, not served
        assert now.weight_version == before.weight_version
        assert now.output_ids == before.output_ids
        with pytest.raises(FleetError) as e:
            c.activate_weights(weight_version=22)  # not the staged version: nothing changes
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        r = c.activate_weights(weight_version=21)
        assert r.success and r.weight_version == 21
        assert staged(c) == [(False, "", -1)] * 2
        after = greedy(c)
        assert after.weight_version == 21 and after.output_ids != before.output_ids
        assert_fleet_holds(c, pushed)
        # Engine options belong to the activation.
        with pytest.raises(FleetError) as e:
            c.update_weights_from_tensor(pushed, stage=True, keep_pause=True)
        assert "ActivateWeights" in str(e.value)


def test_staged_group_pushes(fleet2):
    from rlfleet import Client
    with Client(fleet2.address) as c:
        first, second = perturbed(6), perturbed(7)
        with c.open_weights_group("staged-group") as group:
            r = c.push_weights(first, stage=True, group=group, weight_version=31)
            assert r.success
            assert staged(c) == [(True, "group:staged-group", 31)] * 2
            assert greedy(c).weight_version != 31
            assert c.activate_weights().weight_version == 31
            assert_fleet_holds(c, first)
            r = group.prepare_and_complete(second, weight_version=32, stage=True,
                                           bucket_bytes=300_000)
            assert r.success
            assert staged(c) == [(True, "group:staged-group", 32)] * 2
            assert_fleet_holds(c, first)  # still the first until activation
            c.activate_weights(weight_version=32)
            assert_fleet_holds(c, second)
            assert greedy(c).weight_version == 32


def test_stage_drop_and_refit_from_disk(fleet2):
    from rlfleet import Client, FleetError, read_safetensors
    with Client(fleet2.address) as c:
        c.push_weights(perturbed(8), weight_version=3)  # one call: applied now
        assert greedy(c).weight_version == 3
        r = c.stage_weights(str(rltest.STORIES), weight_version=4)
        assert r.success
        assert staged(c) == [(True, f"disk:{rltest.STORIES}", 4)] * 2
        assert c.drop_staged_weights().success
        with pytest.raises(FleetError) as e:
            c.activate_weights()
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert greedy(c).weight_version == 3
        r = c.refit_weights(str(rltest.STORIES), weight_version=5)
        assert r.success and r.weight_version == 5
        ck = read_safetensors(rltest.STORIES)
        assert_fleet_holds(c, {n: ck[n] for n in ck})


def test_asyncio_staged_push(fleet2):
    from rlfleet import AsyncClient, Client
    pushed = perturbed(9)

    async def run():
        async with AsyncClient(fleet2.address) as ac:
            r = await ac.push_weights(pushed, stage=True, weight_version=41)
            assert r.success
            info = await ac.get_server_info()
            assert all(w.info.has_staged_weights for w in info.workers)
            assert (await ac.drop_staged_weights()).success
            await ac.push_weights(pushed, stage=True, weight_version=41)
            return await ac.activate_weights(weight_version=41)

    r = asyncio.run(run())
    assert r.weight_version == 41
    with Client(fleet2.address) as c:
        assert_fleet_holds(c, pushed)
