"""Delta updates over the `tcp` weight-update group from a Python trainer (issue 30), against two
real rl-workers behind an rl-router, for an F32 and a BF16 model:

- WeightsGroup.send_delta / receive_weights(parent=...) / prepare_and_complete(parent=...), one
  call and two-phase (PrepareWeightsUpdate{parent_version} / CompleteWeightsUpdate), applied and
  staged then activated: only the changed words travel, and every worker ends holding exactly the
  dense child (its checksum equals the one computed here, and the manifest's);
- a delta of a version the fleet does not serve raises FleetError naming both versions, at
  Prepare (before a byte is broadcast) or in the one-call receive; nothing changes;
- all or none through the router: a staged two-phase delta that one worker receives corrupted
  (its bucket fails the CRC) is staged nowhere (the router drops the other worker's stage);
- the trainer dying mid-way: the broadcast cut at a random byte offset of a random bucket (the
  connection shut mid-payload), ten times, staged or applied: nothing staged, nothing applied,
  the served checksum unchanged."""

import random
import socket
import threading

import grpc
import numpy as np
import pytest

import rltest

PROMPT = "Once upon a time"
_WORDS = {"F32": (np.uint32, 0x7FFFFF), "BF16": (np.uint16, 0x7F)}


def load(model):
    """The checkpoint's tensors as the worker serves them (F32 arrays, BF16 WeightTensors)."""
    from rlfleet import read_safetensors
    ck = read_safetensors(rltest.DATA / model)
    return {n: ck[n] for n in ck}


def words(t):
    """(dtype, the raw words of `t` as unsigned integers)."""
    from rlfleet import WeightTensor
    if isinstance(t, WeightTensor):
        return t.dtype, np.asarray(t.data)
    return "F32", np.asarray(t).view(np.uint32)


def child_of(parent, seed, density=0.02, tensors=3):
    """`parent` with about `density` of the words of a few tensors changed in their mantissa
    (finite values stay finite)."""
    from rlfleet import WeightTensor
    rng = np.random.default_rng(seed)
    child = dict(parent)
    for name in rng.choice(sorted(parent), tensors, replace=False):
        dtype, w = words(parent[name])
        kind, mask = _WORDS[dtype]
        w = w.copy()
        flat = w.reshape(-1)
        idx = rng.choice(flat.size, max(1, int(flat.size * density)), replace=False)
        flat[idx] ^= rng.integers(1, mask + 1, idx.size).astype(kind)
        child[name] = WeightTensor(w, "BF16") if dtype == "BF16" else w.view(np.float32)
    return child


def manifest_for(tensors, version, parent_version):
    from rlfleet import rank_sha256, tensor_sha256
    from rlfleet.tensors import as_payload
    entries = {}
    for n, t in tensors.items():
        p = as_payload(n, t)
        entries[n] = {"dtype": p.dtype, "shape": list(p.shape), "sha256": tensor_sha256(n, t)}
    return {"format": "rlfleet.manifest.v1", "version": version,
            "parent_version": parent_version,
            "sha256": rank_sha256({n: e["sha256"] for n, e in entries.items()}),
            "tensors": entries}


def assert_fleet_holds(c, tensors, version):
    """Every worker serves `version` with exactly `tensors`: the checksum of the dense child."""
    want = manifest_for(tensors, max(version, 1), 0)
    for w in c.weights_checker("checksum").workers:
        assert w.result.rank_sha256 == want["sha256"], w.worker
    for w in c.get_server_info().workers:
        assert w.info.weight_version == version, w.worker


def staged(c):
    return [(w.info.has_staged_weights, w.info.staged_source, w.info.staged_weight_version)
            for w in c.get_server_info().workers]


@pytest.mark.parametrize("model", ["stories260K", "stories260K-bf16"])
def test_group_deltas_one_call_and_two_phase(model):
    from rlfleet import Client, FleetError
    from rlfleet.publication import delta_tensors
    fleet = rltest.Fleet(2, model=rltest.DATA / model)
    try:
        with Client(fleet.address) as c:
            v0 = load(model)
            v1, v2, v3, v4 = (child_of(p, s) for p, s in ((v0, 1), (v0, 2), (v0, 3), (v0, 4)))
            v2 = child_of(v1, 2)
            v3 = child_of(v2, 3)
            v4 = child_of(v3, 4)
            dense = sum(t.nbytes for t in delta_tensors({}, v1))
            sent = sum(t.nbytes for t in delta_tensors(v0, v1))
            assert sent < dense // 10  # the changed words, not the model
            with c.open_weights_group("deltas") as g:
                # One call, applied, verified against the manifest.
                r = g.send_delta(v0, v1, 1, 0, manifest=manifest_for(v1, 1, 0),
                                 bucket_bytes=4096)
                assert r.success and r.weight_version == 1 and len(r.results) == 2
                assert_fleet_holds(c, v1, 1)
                # Two-phase, staged: served only after the activation.
                r = g.send_delta(v1, v2, 2, 1, two_phase=True, stage=True,
                                 manifest=manifest_for(v2, 2, 1), bucket_bytes=4096)
                assert r.success
                assert staged(c) == [(True, "group:deltas", 2)] * 2
                for w in c.get_server_info().workers:
                    assert w.info.staged_parent_version == 1
                assert_fleet_holds(c, v1, 1)
                assert c.activate_weights(weight_version=2).weight_version == 2
                assert_fleet_holds(c, v2, 2)
                # Two-phase, applied (no manifest).
                r = g.prepare_and_complete(v3, weight_version=3, parent=v2, parent_version=2)
                assert r.success and r.weight_version == 3
                assert_fleet_holds(c, v3, 3)
                # One call, staged.
                r = g.receive_weights(v4, weight_version=4, parent=v3, parent_version=3,
                                      stage=True)
                assert r.success and staged(c) == [(True, "group:deltas", 4)] * 2
                c.activate_weights()
                assert_fleet_holds(c, v4, 4)
                # A parent the fleet does not serve: refused at Prepare, before the broadcast.
                v5 = child_of(v1, 5)
                with pytest.raises(FleetError) as e:
                    g.send_delta(v1, v5, 5, 1, two_phase=True, stage=True)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "applies to version 1" in str(e.value)
                assert "serves version 4" in str(e.value)
                assert staged(c) == [(False, "", -1)] * 2
                assert_fleet_holds(c, v4, 4)
                # The same in one call (the failed call closes the sender: the group is done).
                with pytest.raises(FleetError) as e:
                    g.send_delta(v1, v5, 5, 1)
                assert "applies to version 1" in str(e.value), str(e.value)
                assert_fleet_holds(c, v4, 4)
            greedy = c.generate(text=PROMPT, max_new_tokens=4, temperature=0.0).one()
            assert greedy.weight_version == 4
    finally:
        fleet.stop()


def test_async_group_delta(fleet2):
    import asyncio

    from rlfleet import AsyncClient, Client
    v0 = load("stories260K")
    v1 = child_of(v0, 11)

    async def run():
        async with AsyncClient(fleet2.address) as c:
            group = await c.open_weights_group("async-deltas")
            async with group:
                r = await group.send_delta(v0, v1, 1, 0, two_phase=True,
                                           manifest=manifest_for(v1, 1, 0))
                assert r.success and r.weight_version == 1

    asyncio.run(run())
    with Client(fleet2.address) as c:
        assert_fleet_holds(c, v1, 1)


class _Wire:
    """Wraps rlfleet.weight_sync._send_all for one push: `cut_at` (payload bytes per receiver)
    shuts every connection mid-payload there, as a trainer that dies does; `corrupt_rank`
    flips a payload byte sent to that rank (its CRC then fails)."""

    def __init__(self, monkeypatch, sender, cut_at=None, corrupt_rank=None):
        import rlfleet.weight_sync as ws
        self._orig = ws._send_all
        self._sender = sender
        self._cut_at = cut_at
        self._corrupt = corrupt_rank
        self._sent = {}
        self._lock = threading.Lock()
        monkeypatch.setattr(ws, "_send_all", self)

    def __call__(self, sock, data, timeout, what):
        if what != "bucket payload":
            return self._orig(sock, data, timeout, what)
        rank = self._sender._receivers.index(sock) + 1
        with self._lock:
            done = self._sent.get(rank, 0)
            self._sent[rank] = done + len(data)
        if self._corrupt == rank:
            data = bytearray(data)
            data[0] ^= 0xFF
        if self._cut_at is not None and done + len(data) > self._cut_at:
            self._orig(sock, bytes(data[:self._cut_at - done]), timeout, what)
            sock.shutdown(socket.SHUT_RDWR)
            from rlfleet import FleetError
            raise FleetError(grpc.StatusCode.UNAVAILABLE, "the trainer died")
        return self._orig(sock, data, timeout, what)


def test_a_delta_staged_on_one_worker_only_is_staged_nowhere(fleet2, monkeypatch):
    """All or none through the router: one worker's bucket arrives corrupted, so its staged
    Complete fails; the router drops the other worker's stage."""
    from rlfleet import Client, FleetError
    from rlfleet.publication import delta_tensors
    from rlfleet.weight_sync import plan_buckets
    v0 = load("stories260K")
    v1 = child_of(v0, 21)
    with Client(fleet2.address) as c, c.open_weights_group("one-bad") as g:
        buckets = plan_buckets(delta_tensors(v0, v1), 1 << 20)
        assert len(buckets) == 1
        r = c.prepare_weights_update("one-bad", buckets, parent_version=0,
                                     manifest=manifest_for(v1, 1, 0))
        assert r.ready and len(r.results) == 2
        _Wire(monkeypatch, g.sender, corrupt_rank=2)
        with pytest.raises(FleetError) as e:
            g.sender.broadcast(buckets[0])
        assert "rank 2" in str(e.value) and "rank 1" not in e.value.details()
        monkeypatch.undo()
        with pytest.raises(FleetError) as e:
            c.complete_weights_update("one-bad", weight_version=1, stage=True)
        assert "nothing is staged anywhere" in str(e.value), str(e.value)
        assert sum(1 for o in e.value.results if o.success) == 1
        assert staged(c) == [(False, "", -1)] * 2
        assert_fleet_holds(c, v0, 0)


def test_a_delta_cut_mid_payload_changes_nothing(fleet2, monkeypatch):
    """The trainer dies at a random byte offset of a random bucket, ten times (staged or
    applied, two-phase): nothing is staged or applied anywhere, the served checksum stays."""
    from rlfleet import Client, FleetError
    from rlfleet.publication import delta_tensors
    from rlfleet.weight_sync import plan_buckets
    v0 = load("stories260K")
    rng = random.Random(7)
    with Client(fleet2.address) as c:
        for round in range(10):
            v1 = child_of(v0, 100 + round, density=0.05, tensors=4)
            buckets = plan_buckets(delta_tensors(v0, v1), 2048)
            total = sum(b.nbytes for b in buckets)
            cut = rng.randrange(0, total)
            stage = round % 2 == 0
            with c.open_weights_group(f"cut-{round}") as g:
                r = c.prepare_weights_update(g.group_name, buckets, parent_version=0,
                                             manifest=manifest_for(v1, 1, 0))
                assert r.ready
                _Wire(monkeypatch, g.sender, cut_at=cut)
                with pytest.raises(FleetError):
                    for b in buckets:
                        g.sender.broadcast(b)
                monkeypatch.undo()
                with pytest.raises(FleetError) as e:
                    c.complete_weights_update(g.group_name, weight_version=1, stage=stage)
                assert "prepared receive failed" in str(e.value), (round, cut, str(e.value))
                assert staged(c) == [(False, "", -1)] * 2, (round, cut)
                assert_fleet_holds(c, v0, 0)
        # The fleet still takes a whole delta afterwards.
        v1 = child_of(v0, 99)
        with c.open_weights_group("after") as g:
            assert g.send_delta(v0, v1, 1, 0, two_phase=True).weight_version == 1
        assert_fleet_holds(c, v1, 1)


def test_a_refused_delta_leaves_every_worker_routed(fleet2):
    """A delta every worker refuses after receiving it (a NaN its payload writes), one call or
    two-phase and applied: FleetError naming the NaN, the old weights serve, and both workers
    stay in routing (a delta is built whole on a copy, so its failure is not partial weights)."""
    from rlfleet import Client, FleetError
    v0 = load("stories260K")
    bad = child_of(v0, 31)
    name = sorted(v0)[5]
    w = np.asarray(bad[name]).copy()
    w.reshape(-1).view(np.uint32)[7] = 0x7FC00000  # NaN
    bad[name] = w
    with Client(fleet2.address) as c:
        for two_phase in (False, True):
            with c.open_weights_group(f"nan-{two_phase}") as g:
                with pytest.raises(FleetError) as e:
                    g.send_delta(v0, bad, 1, 0, two_phase=two_phase)
                assert "NaN" in str(e.value), str(e.value)
            from rlfleet._stubs import router_pb2
            workers = c.list_workers().workers
            assert len(workers) == 2
            assert all(w.state == router_pb2.WORKER_STATE_LIVE and w.enabled and not w.reason
                       for w in workers), workers
            assert_fleet_holds(c, v0, 0)
        good = child_of(v0, 32)
        with c.open_weights_group("after-nan") as g:
            assert g.send_delta(v0, good, 1, 0).weight_version == 1
        assert_fleet_holds(c, good, 1)
