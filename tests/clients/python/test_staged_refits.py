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


def delta_child(parent, seed, density=0.02):
    """`parent` with about `density` of the words of three tensors changed (finite values)."""
    rng = np.random.default_rng(seed)
    child = dict(parent)
    for name in sorted(parent)[:3]:
        t = parent[name].copy()
        flat = t.reshape(-1)
        idx = rng.choice(flat.size, max(1, int(flat.size * density)), replace=False)
        flat[idx] += rng.normal(0.0, 0.01, idx.size).astype(np.float32)
        child[name] = t
    return child


def manifest_for(tensors, version, parent_version):
    from rlfleet import rank_sha256, tensor_sha256
    entries = {n: {"dtype": "F32", "shape": list(t.shape), "sha256": tensor_sha256(n, t)}
               for n, t in tensors.items()}
    return {"format": "rlfleet.manifest.v1", "version": version,
            "parent_version": parent_version,
            "sha256": rank_sha256({n: e["sha256"] for n, e in entries.items()}),
            "tensors": entries}


def test_push_delta_stages_verified_and_refuses_a_missing_parent(fleet2):
    """push_delta (issue 30): only the changed words travel; staged and verified against the
    manifest on every worker (GetServerInfo reports its digest), served after activate_weights;
    a delta of a version the fleet does not serve, or whose manifest the result does not match,
    raises and changes nothing."""
    from rlfleet import Client, FleetError, read_safetensors
    from rlfleet.publication import delta_messages
    ck = read_safetensors(rltest.STORIES)
    parent = {n: ck[n] for n in ck}
    child = delta_child(parent, 1)
    with Client(fleet2.address) as c:
        assert greedy(c).weight_version == 0
        m = manifest_for(child, 1, 0)
        dense_bytes = sum(t.nbytes for t in child.values())
        sent = sum(len(b) for b in delta_messages(parent, child, 1, 0))
        assert sent < dense_bytes // 10  # a few changed words, not the model
        r = c.push_delta(parent, child, 1, 0, stage=True, manifest=m)
        assert r.success and len(r.results) == 2
        for w in c.get_server_info().workers:
            assert w.info.has_staged_weights and w.info.staged_weight_version == 1
            assert w.info.staged_weights_sha256 == m["sha256"]
            assert w.info.staged_parent_version == 0
        assert greedy(c).weight_version == 0  # staged, not served
        assert c.activate_weights(weight_version=1).weight_version == 1
        assert_fleet_holds(c, child)
        # The fleet serves 1: a delta of 0 is refused everywhere, nothing staged.
        with pytest.raises(FleetError) as e:
            c.push_delta(parent, delta_child(parent, 2), 2, 0, stage=True)
        assert "applies to version 0" in str(e.value)
        assert staged(c) == [(False, "", -1)] * 2
        # A manifest that the result does not match: refused, nothing staged.
        grand = delta_child(child, 3)
        with pytest.raises(FleetError):
            c.push_delta(child, grand, 2, 1, stage=True, manifest=manifest_for(child, 2, 1))
        assert staged(c) == [(False, "", -1)] * 2
        assert greedy(c).weight_version == 1
        assert_fleet_holds(c, child)
        # The right one applies in one call.
        r = c.push_delta(child, grand, 2, 1, manifest=manifest_for(grand, 2, 1))
        assert r.success and r.weight_version == 2
        assert_fleet_holds(c, grand)


def test_async_push_delta(fleet2):
    from rlfleet import AsyncClient, read_safetensors
    ck = read_safetensors(rltest.STORIES)
    parent = {n: ck[n] for n in ck}
    child = delta_child(parent, 4)

    async def run():
        async with AsyncClient(fleet2.address) as c:
            r = await c.push_delta(parent, child, 1, 0)
            assert r.success and r.weight_version == 1

    asyncio.run(run())
    from rlfleet import Client
    with Client(fleet2.address) as c:
        assert_fleet_holds(c, child)
