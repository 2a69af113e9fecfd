"""In-memory weight pushes from Python against two real rl-workers behind an rl-router: the
stories260K tensors, perturbed in NumPy, over the tensor stream (blocking and asyncio; bf16 as
raw uint16; small chunks so every tensor is cut) and over a `tcp` weight group with the Python
sender (single-call receive, two-phase, per bucket). Each push must change the greedy output and
leave every worker holding exactly the pushed tensors: the weights checker's SHA-256 per tensor
equals the digest rlfleet.tensor_sha256 computes from the pushed arrays."""

import asyncio

import numpy as np

import rltest

PROMPT = "Once upon a time"


def greedy(c):
    return c.generate(text=PROMPT, max_new_tokens=16, temperature=0.0).one()


def perturbed(seed, scale=0.05):
    """stories260K's tensors (float32) plus seeded noise, by name."""
    from rlfleet import read_safetensors
    ck = read_safetensors(rltest.STORIES)
    rng = np.random.default_rng(seed)
    return {n: ck[n] + rng.normal(0.0, scale, ck[n].shape).astype(np.float32) for n in ck}


def assert_fleet_holds(c, tensors, num_workers=2):
    """Every worker's checksum of every tensor equals the digest of `tensors` (as held)."""
    from rlfleet import rank_sha256, tensor_sha256
    want = {n: tensor_sha256(n, t) for n, t in tensors.items()}
    sums = c.weights_checker("checksum")
    assert len(sums.workers) == num_workers
    for w in sums.workers:
        assert dict(w.result.tensor_sha256) == want, w.worker
        assert w.result.rank_sha256 == rank_sha256(want)


def test_tensor_stream_push_from_numpy(fleet2):
    from rlfleet import Client, PushProgress, read_safetensors, tensor_sha256
    with Client(fleet2.address) as c:
        names = [w.name for w in c.list_weights().weights]
        ck = read_safetensors(rltest.STORIES)
        assert sorted(names) == sorted(ck)
        # The checkpoint as loaded: the digests the workers report before any push.
        assert_fleet_holds(c, {n: ck[n] for n in ck})
        before = greedy(c)
        pushed = perturbed(1)
        seen = []
        r = c.update_weights_from_tensor(pushed, weight_version=7, chunk_bytes=16 << 10,
                                         progress=seen.append)
        assert r.success and r.weight_version == 7 and len(r.results) == 2
        assert all(x.success and x.weight_version == 7 for x in r.results)
        # Progress: every byte reported once, in order, against the known total.
        total = sum(t.nbytes for t in pushed.values())
        assert all(isinstance(p, PushProgress) for p in seen)
        assert [p.bytes_done for p in seen] == sorted(p.bytes_done for p in seen)
        assert seen[-1].bytes_done == seen[-1].bytes_total == total
        assert seen[-1].tensors_done == len(pushed)
        after = greedy(c)
        assert after.weight_version == 7 and after.output_ids != before.output_ids
        assert_fleet_holds(c, pushed)
        # Non-contiguous views are streamed block by block, never copied whole: the workers
        # receive exactly their values.
        name = "model.layers.0.mlp.down_proj.weight"
        w = pushed[name]
        doubled = np.zeros((w.shape[0], 2 * w.shape[1]), np.float32)
        doubled[:, ::2] = w * 0.5
        view = doubled[:, ::2]
        assert not view.flags.c_contiguous
        c.update_weights_from_tensor([(name, view)], chunk_bytes=4096)
        assert dict(c.weights_checker("checksum").workers[0].result.tensor_sha256)[name] == \
            tensor_sha256(name, np.ascontiguousarray(view))


def test_bf16_values_and_asyncio_push(fleet2):
    """bf16 from NumPy (raw uint16 with an explicit dtype) into float32 workers: they hold the
    values widened to float32. Then the asyncio client pushes the checkpoint as read from disk
    (rlfleet.read_safetensors, a mapping)."""
    from rlfleet import AsyncClient, Client, WeightTensor, read_safetensors
    ck = read_safetensors(rltest.STORIES)
    pushed = perturbed(2)
    bf16 = {n: WeightTensor((t.view(np.uint32) >> 16).astype(np.uint16), "BF16")
            for n, t in pushed.items()}
    widened = {n: (b.data.astype(np.uint32) << 16).view(np.float32) for n, b in bf16.items()}
    with Client(fleet2.address) as c:
        before = greedy(c)
        c.update_weights_from_tensor(list(bf16.items()), chunk_bytes=32 << 10)
        assert_fleet_holds(c, widened)
        assert greedy(c).output_ids != before.output_ids

    async def run():
        async with AsyncClient(fleet2.address) as ac:
            # The checkpoint mapping itself: each tensor is read from disk when it is sent.
            r = await ac.update_weights_from_tensor(ck, weight_version=40, chunk_bytes=64 << 10)
            return r, (await ac.generate(text=PROMPT, max_new_tokens=16, temperature=0.0)).one()

    r, after = asyncio.run(run())
    assert r.weight_version == 40 and after.weight_version == 40
    with Client(fleet2.address) as c:
        assert_fleet_holds(c, {n: ck[n] for n in ck})
        assert after.output_ids == greedy(c).output_ids


def test_tcp_group_push_from_python(fleet2):
    """The Python sender is rank 0 of a tcp group the two workers join (ranks 1 and 2); every
    push mode delivers the in-memory tensors bucket by bucket."""
    from rlfleet import Client
    with Client(fleet2.address) as c:
        before = greedy(c)
        first, second = perturbed(3), perturbed(4)
        with c.open_weights_group("py-group") as group:
            assert group.sender.world_size == 3
            assert list(c.get_server_info().workers[0].info.weight_update_groups) == ["py-group"]
            r = group.receive_weights(first, weight_version=11, bucket_bytes=200_000)
            assert r.weight_version == 11 and all(x.success for x in r.results)
            assert_fleet_holds(c, first)
            one = greedy(c)
            assert one.weight_version == 11 and one.output_ids != before.output_ids

            seen = []
            r = group.prepare_and_complete(second, weight_version=12, bucket_bytes=300_000,
                                           progress=seen.append,
                                           before_complete=lambda: seen.append("complete"))
            assert r.weight_version == 12
            assert seen[-1] == "complete" and seen[-2].bytes_done == seen[-2].bytes_total
            assert_fleet_holds(c, second)
            two = greedy(c)
            assert two.weight_version == 12 and two.output_ids != one.output_ids

            answers = group.update_weights_from_distributed(first, weight_version=30,
                                                            bucket_bytes=400_000)
            assert len(answers) >= 2 and answers[-1].weight_version == 30
            assert_fleet_holds(c, first)
            assert greedy(c).output_ids == one.output_ids
        assert list(c.get_server_info().workers[0].info.weight_update_groups) == []


def test_tcp_group_push_from_asyncio(fleet2):
    from rlfleet import AsyncClient, Client
    first, second, third = perturbed(5), perturbed(6), perturbed(7)

    async def run():
        async with AsyncClient(fleet2.address) as ac:
            async with await ac.open_weights_group("async-group") as group:
                r = await group.receive_weights(first, weight_version=3, bucket_bytes=250_000)
                assert r.weight_version == 3
                with Client(fleet2.address) as c:
                    assert_fleet_holds(c, first)
                r = await group.prepare_and_complete(second, weight_version=4,
                                                     bucket_bytes=250_000)
                assert r.weight_version == 4
                with Client(fleet2.address) as c:
                    assert_fleet_holds(c, second)
                answers = await group.update_weights_from_distributed(
                    third, weight_version=9, bucket_bytes=400_000)
                return [a.weight_version for a in answers]

    versions = asyncio.run(run())
    assert len(versions) >= 2 and versions[-1] == 9
    with Client(fleet2.address) as c:
        assert_fleet_holds(c, third)
        assert list(c.get_server_info().workers[0].info.weight_update_groups) == []


def test_sender_and_low_level_group_calls_by_hand(fleet2):
    """The raw calls a trainer with its own loop makes: TcpWeightSender,
    init_weights_update_group, update_weights_from_distributed (in a thread) while the bucket
    is broadcast, destroy_weights_update_group."""
    import threading

    from rlfleet import Client, TcpWeightSender, plan_buckets
    from rlfleet.tensors import iter_named_tensors
    pushed = perturbed(6)
    with Client(fleet2.address) as c, TcpWeightSender("raw", world_size=3) as sender:
        sender.start()
        c.init_weights_update_group("127.0.0.1", sender.port, 1, 3, "raw", backend="tcp")
        sender.wait_for_receivers(timeout=30)
        buckets = plan_buckets(iter_named_tensors(pushed), 1 << 30)
        assert len(buckets) == 1
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", c.update_weights_from_distributed(
            buckets[0].names, buckets[0].dtypes, buckets[0].shapes, "raw", weight_version=50)))
        t.start()
        stats = sender.broadcast(buckets[0])
        t.join(60)
        assert out["r"].weight_version == 50
        assert stats.bytes == sum(x.nbytes for x in pushed.values()) and stats.receivers == 2
        assert_fleet_holds(c, pushed)
        c.destroy_weights_update_group("raw")
