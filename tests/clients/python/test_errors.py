"""Failures raise rlfleet.FleetError, with the gRPC code and, for broadcasts, every worker's
result: a failed update through the router (in-band success=false), the same call on one worker
(a gRPC error), a tensor push the workers refuse, a bad tensor in the middle of a push (nothing
applied), a weight-group push naming an unknown tensor (refused before anything is sent), the
asyncio client, and a missing admin key."""

import asyncio

import grpc
import numpy as np
import pytest

import rltest


def checksums(c):
    return [w.result.rank_sha256 for w in c.weights_checker("checksum").workers]


def test_failed_update_raises_with_every_workers_reason(fleet2):
    from rlfleet import Client, FleetError
    with Client(fleet2.address) as c:
        with pytest.raises(FleetError) as e:
            c.update_weights_from_disk("/nope")
        err = e.value
        assert isinstance(err, grpc.RpcError)  # code written against raw grpc keeps working
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.method == "UpdateWeightsFromDisk"
        assert err.response is not None and not err.response.success
        assert sorted(r.worker for r in err.results) == sorted(w.address
                                                               for w in fleet2.workers)
        for r in err.failures:
            assert r.code == grpc.StatusCode.INVALID_ARGUMENT and "/nope" in r.message
        assert all(w.address in str(err) for w in fleet2.workers)
        # The old weights still serve.
        assert c.generate(text="Once upon a time", max_new_tokens=4).one().weight_version == 0

    with Client(fleet2.workers[0].address, via="worker") as w:
        with pytest.raises(FleetError) as e:
            w.update_weights_from_disk("/nope")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and not e.value.results
        assert "/nope" in e.value.details()

    async def run():
        from rlfleet import AsyncClient
        async with AsyncClient(fleet2.address) as ac:
            with pytest.raises(FleetError) as e:
                await ac.update_weights_from_disk("/nope")
            # grpc.aio cancels a stream whose iterator fails: the iterator's error is raised,
            # not a CancelledError.
            bad = [("model.norm.weight", np.ones(64, np.float32)), ("x", np.zeros(2))]
            with pytest.raises(TypeError, match="float64"):
                await ac.update_weights_from_tensor(t for t in bad)
            return e.value

    err = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and len(err.failures) == 2


def test_refused_tensor_push_raises_and_changes_nothing(fleet2):
    from rlfleet import Client, FleetError, read_safetensors
    ck = read_safetensors(rltest.STORIES)
    with Client(fleet2.address) as c:
        before = checksums(c)
        # A name the model does not have: every worker refuses it.
        with pytest.raises(FleetError) as e:
            c.update_weights_from_tensor([("no.such.weight", np.zeros(4, np.float32))])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(e.value.failures) == 2
        assert all("no.such.weight" in r.message for r in e.value.failures)
        # A refused push may have left partial weights: the router holds those workers out
        # until they are resynced or re-enabled (here the weights are intact).
        for r in e.value.failures:
            if r.left_out:
                c.enable_worker(r.worker)
        assert checksums(c) == before

        # A bad tensor after good ones in a list: refused before anything is sent.
        first = next(iter(ck))
        bad = [(first, ck[first] * 2), ("model.norm.weight", np.zeros(64, np.float64))]
        with pytest.raises(TypeError, match="model.norm.weight"):
            c.update_weights_from_tensor(bad)
        assert checksums(c) == before
        assert c.generate(text="Once upon a time", max_new_tokens=4).one().weight_version == 0
        # From a generator the bad tensor is met mid-stream: the call is cancelled (servers
        # apply no cut stream) and the client raises the real error, not gRPC's generic one.
        with pytest.raises(TypeError, match="model.norm.weight"):
            c.update_weights_from_tensor(x for x in bad)

        with pytest.raises(ValueError, match="empty"):
            c.update_weights_from_tensor([])
        with pytest.raises(ValueError, match="mode"):
            c.pause_generation("sideways")


def test_group_push_with_an_unknown_tensor_is_refused_before_sending(fleet2):
    from rlfleet import Client, FleetError, read_safetensors
    ck = read_safetensors(rltest.STORIES)
    with Client(fleet2.address) as c:
        before = checksums(c)
        with c.open_weights_group("g-err") as group:
            with pytest.raises(FleetError) as e:
                group.receive_weights({"bogus": np.zeros(3, np.float32)})
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bogus" in str(e.value)
            name = "model.norm.weight"
            with pytest.raises(FleetError, match="shape"):
                group.receive_weights({name: np.zeros(3, np.float32)})
            # Nothing was sent: the group still works.
            r = group.receive_weights({name: ck[name] * 3}, weight_version=5)
            assert r.weight_version == 5
        assert checksums(c) != before


def test_missing_admin_key_raises_unauthenticated(start_worker):
    from rlfleet import Client, FleetError
    w = start_worker("--admin-api-key", "k3y")
    with pytest.raises(FleetError) as e:
        Client(w.address, via="worker").pause_generation("retract")
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(FleetError) as e:
        Client(w.address, via="worker").update_weights_from_tensor(
            [("model.norm.weight", np.ones(64, np.float32))])
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    r = Client(w.address, via="worker", api_key="k3y").update_weights_from_tensor(
        [("model.norm.weight", np.ones(64, np.float32))])
    assert r.success and r.weight_version == 1
