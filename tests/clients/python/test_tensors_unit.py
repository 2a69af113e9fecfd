"""rlfleet's tensor and weight-sync pieces without servers: chunking (strided, big-endian, 0-d,
empty, bf16 from raw values, bounded chunks), the weights checker's digest, the tensor stream's
encoding (decodes to what protobuf itself would build) and its message sequence (options first,
bounded chunks in order, the explicit end alone last), bucket planning, the
safetensors reader's checks, the control-message frame (length, CRC32C, cap), and the Python
sender's rendezvous and bucket exchange against receivers written here from the protocol
(refusals, a rejected bucket that keeps the group usable, a receiver that disconnects, the close
message)."""

import hashlib
import json
import socket
import struct
import threading

import grpc
import numpy as np
import pytest


# Tensors ------------------------------------------------------------------------------------

def test_chunks_cover_every_layout_in_bounded_pieces():
    from rlfleet.tensors import WeightTensor, as_payload
    base = np.arange(6 * 10, dtype=np.float32).reshape(6, 10)
    cases = {
        "contiguous": base,
        "strided": base[:, ::2],
        "transposed": base.T,
        "big_endian": base.astype(">f4"),
        "scalar": np.array(3.5, np.float32),
        "empty": np.zeros((0, 4), np.float16),
        "bf16": WeightTensor(np.arange(12, dtype=np.uint16).reshape(3, 4), "BF16"),
        "bf16_bytes": WeightTensor(np.arange(12, dtype=np.uint16).tobytes(), "bf16", (3, 4)),
    }
    for name, t in cases.items():
        p = as_payload(name, t)
        values = t.data if isinstance(t, WeightTensor) else t
        want = np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<")).tobytes() \
            if isinstance(values, np.ndarray) else values
        for limit in (4, 12, 1 << 20):
            pieces = [bytes(c) for c in p.chunks(limit)]
            assert all(0 < len(c) <= limit for c in pieces), (name, limit)
            assert b"".join(pieces) == want, (name, limit)
        assert p.nbytes == len(want)
    assert as_payload("c", base).zero_copy and not as_payload("s", base[:, ::2]).zero_copy
    assert as_payload("bf16", cases["bf16"]).dtype == "BF16"
    with pytest.raises(TypeError, match="float64"):
        as_payload("x", np.zeros(2))
    with pytest.raises(TypeError, match="needs 2"):
        as_payload("x", WeightTensor(np.zeros(2, np.float32), "BF16"))
    with pytest.raises(TypeError, match="not a NumPy array"):
        as_payload("x", [1.0, 2.0])


def test_tensor_digest_is_the_weights_checkers():
    from rlfleet import rank_sha256, tensor_sha256
    w = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    want = hashlib.sha256(b"a.w\0F32\x002,2\0" + w.tobytes()).hexdigest()
    assert tensor_sha256("a.w", w) == want
    assert tensor_sha256("a.w", w.T.copy().T) == want  # layout does not matter, values do
    assert rank_sha256({"b": "2", "a": "1"}) == hashlib.sha256(b"a:1\nb:2\n").hexdigest()


def test_stream_encoding_decodes_to_the_protobuf_message():
    from rlfleet._rpc import encode_chunk
    from rlfleet.proto import admin_pb2
    data = bytes(range(200)) * 1000
    header = admin_pb2.TensorChunk(name="model.w", dtype="BF16", shape=[100, 1000], offset=64)
    options = admin_pb2.UpdateWeightsFromTensorRequest(weight_version=7, keep_pause=True)
    want = admin_pb2.UpdateWeightsFromTensorRequest(weight_version=7, keep_pause=True)
    want.chunk.CopyFrom(header)
    want.chunk.data = data
    got = admin_pb2.UpdateWeightsFromTensorRequest.FromString(
        encode_chunk(header, memoryview(data), options))
    assert got == want
    empty = admin_pb2.UpdateWeightsFromTensorRequest.FromString(
        encode_chunk(admin_pb2.TensorChunk(name="e", dtype="F32", shape=[0]), b""))
    assert empty.chunk.name == "e" and empty.chunk.data == b"" and list(empty.chunk.shape) == [0]


def test_stream_messages_options_first_chunks_in_order_and_the_explicit_end():
    from rlfleet._progress import Reporter
    from rlfleet._rpc import StreamSource
    from rlfleet.proto import admin_pb2
    a = np.arange(10, dtype=np.float32)
    b = np.arange(6, dtype=np.float16).reshape(2, 3)
    done = []
    with Reporter(done.append, "push", None) as rep:
        src = StreamSource([("a", a), ("b", b)], rep, 16, 7, True, False, True)
        msgs = [admin_pb2.UpdateWeightsFromTensorRequest.FromString(m) for m in src.messages()]
    chunks = msgs[:-1]
    # The options ride on the first message only, with the first chunk.
    assert msgs[0].weight_version == 7 and msgs[0].flush_cache and msgs[0].keep_pause
    assert all(not m.HasField("weight_version") and not m.keep_pause for m in msgs[1:])
    # Every chunk at most 16 bytes, in order, offsets contiguous, the bytes exactly the tensor's.
    got = {}
    for m in chunks:
        c = m.chunk
        assert 0 < len(c.data) <= 16 and c.offset == len(got.get(c.name, b""))
        assert (c.dtype, list(c.shape)) in (("F32", [10]), ("F16", [2, 3]))
        got[c.name] = got.get(c.name, b"") + c.data
    assert got == {"a": a.tobytes(), "b": b.tobytes()}
    assert [m.chunk.name for m in chunks] == ["a"] * 3 + ["b"]
    assert done[-1].bytes_done == 52 and done[-1].tensors_done == 2
    # The last message is the end alone, with the distinct names and the bytes.
    end = msgs[-1]
    assert not end.HasField("chunk") and end.HasField("end")
    assert (end.end.num_tensors, end.end.num_bytes) == (2, 52)
    assert all(not m.HasField("end") for m in chunks)
    with pytest.raises(ValueError, match="empty"):
        StreamSource([], rep, 16, None, None, False, False)


def test_bucket_plan_is_greedy_and_keeps_big_tensors_alone():
    from rlfleet import plan_buckets
    from rlfleet.tensors import as_payload
    ts = [as_payload(f"t{i}", np.zeros(n, np.float32)) for i, n in enumerate([10, 10, 30, 5, 5])]
    plan = plan_buckets(ts, 80)  # bytes: 40 40 | 120 | 20 20
    assert [b.names for b in plan] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert [b.nbytes for b in plan] == [80, 120, 40]
    assert plan[0].to_proto().shapes[0].dims == [10]
    with pytest.raises(ValueError):
        plan_buckets(ts, 0)


def test_safetensors_reader_checks_headers(tmp_path):
    from rlfleet import WeightTensor, read_safetensors
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(4, dtype=np.uint16)
    header = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}
    raw = json.dumps(header).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + a.tobytes() +
                                             b.tobytes())
    ck = read_safetensors(tmp_path)
    assert list(ck) == ["a", "b"] and ck.total_bytes() == 32 and ck.spec("b") == ("BF16", (4,))
    assert np.array_equal(ck["a"], a)
    assert isinstance(ck["b"], WeightTensor) and np.array_equal(ck["b"].data, b)
    header["b"]["data_offsets"] = [24, 40]  # beyond the file
    raw = json.dumps(header).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + a.tobytes() +
                                             b.tobytes())
    with pytest.raises(ValueError, match="'b'"):
        read_safetensors(tmp_path)
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(ValueError, match="header length"):
        read_safetensors(tmp_path / "m.safetensors")


# The frame and the sender -------------------------------------------------------------------

def test_frames_carry_length_crc_and_a_cap():
    from rlfleet.proto import weight_sync_pb2
    from rlfleet.weight_sync import crc32c, encode_frame, read_frame
    from rlfleet import FleetError
    assert crc32c(b"123456789") == 0xE3069283
    msg = weight_sync_pb2.WeightSyncMessage()
    msg.ack.seq = 3
    msg.ack.message = "ok"
    a, b = socket.socketpair()
    with a, b:
        frame = encode_frame(msg)
        size, crc = struct.unpack("<II", frame[:8])
        assert size == len(frame) - 8 and crc == crc32c(frame[8:])
        a.sendall(frame)
        assert read_frame(b, 5, "ack") == msg
        bad = bytearray(frame)
        bad[-1] ^= 1
        a.sendall(bytes(bad))
        with pytest.raises(FleetError, match="checksum") as e:
            read_frame(b, 5, "ack")
        assert e.value.code() == grpc.StatusCode.DATA_LOSS
        a.sendall(struct.pack("<II", (64 << 20) + 1, 0))
        with pytest.raises(FleetError, match="cap"):
            read_frame(b, 5, "ack")


class Receiver:
    """One rank of a group, speaking the protocol from weight_sync.proto."""

    def __init__(self, port, rank, world=3, group="g", protocol=2, backend=2):
        from rlfleet.proto import weight_sync_pb2
        from rlfleet.weight_sync import encode_frame
        self.pb = weight_sync_pb2
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        hello = weight_sync_pb2.WeightSyncMessage()
        hello.hello.protocol = protocol
        hello.hello.backend = backend
        hello.hello.rank = rank
        hello.hello.world_size = world
        hello.hello.group_name = group
        self.sock.sendall(encode_frame(hello))

    def read(self):
        from rlfleet.weight_sync import read_frame
        return read_frame(self.sock, 10, "test receiver")

    def receive_bucket(self, verdict=0, message=""):
        """Reads a bucket header and its payload, acks with `verdict`; returns both."""
        from rlfleet.weight_sync import crc32c, encode_frame
        msg = self.read()
        assert msg.WhichOneof("kind") == "bucket", msg
        payload = b""
        while len(payload) < msg.bucket.payload_bytes:
            payload += self.sock.recv(msg.bucket.payload_bytes - len(payload))
        assert crc32c(payload) == msg.bucket.payload_crc32c
        ack = self.pb.WeightSyncMessage()
        ack.ack.seq = msg.bucket.seq
        ack.ack.code = verdict
        ack.ack.message = message
        self.sock.sendall(encode_frame(ack))
        return msg.bucket, payload


def test_sender_rendezvous_refusals_and_buckets():
    from rlfleet import FleetError, TcpWeightSender
    sender = TcpWeightSender("g", world_size=3, timeout=20)
    sender.start()
    try:
        for kwargs, why in (({"group": "other"}, "group_name"), ({"world": 4}, "world_size"),
                            ({"rank": 3}, "outside"), ({"protocol": 1}, "protocol version"),
                            ({"backend": 1}, "backend")):
            r = Receiver(sender.port, **{"rank": 1, **kwargs})
            w = r.read().welcome
            assert w.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and why in w.message, w
            r.sock.close()
        r1 = Receiver(sender.port, 1)
        dup = Receiver(sender.port, 1)
        w = dup.read().welcome
        assert w.code == grpc.StatusCode.ALREADY_EXISTS.value[0], w
        dup.sock.close()
        r2 = Receiver(sender.port, 2)
        assert r1.read().welcome.code == 0 and r2.read().welcome.code == 0
        sender.wait_for_receivers(timeout=20)

        values = {"w": np.arange(8, dtype=np.float32), "v": np.ones((2, 2), np.float16)}
        got = {}

        def rank(r, key, verdict=0):
            got[key] = r.receive_bucket(verdict, "mismatch" if verdict else "")

        threads = [threading.Thread(target=rank, args=(r1, 1)),
                   threading.Thread(target=rank, args=(r2, 2))]
        for t in threads:
            t.start()
        stats = sender.broadcast(values)
        for t in threads:
            t.join(10)
        header, payload = got[1]
        assert [t.name for t in header.tensors] == ["w", "v"] and header.seq == 0
        assert payload == values["w"].tobytes() + values["v"].tobytes() == got[2][1]
        assert stats.bytes == 40 and stats.receivers == 2

        # Rank 2 rejects the next bucket: the error names it; the group stays usable.
        threads = [threading.Thread(target=rank, args=(r1, 1)),
                   threading.Thread(target=rank, args=(r2, 2, 3))]
        for t in threads:
            t.start()
        with pytest.raises(FleetError) as e:
            sender.broadcast(values)
        for t in threads:
            t.join(10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert [o.success for o in e.value.results] == [True, False]
        assert "rank 2 rejected the bucket: INVALID_ARGUMENT: mismatch" in str(e.value)

        # Rank 2 disconnects: I/O trouble breaks its link; later broadcasts fail fast.
        r2.sock.close()
        t = threading.Thread(target=lambda: got.setdefault("late", r1.receive_bucket()))
        t.start()
        with pytest.raises(FleetError) as e:
            sender.broadcast(values)
        t.join(10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(FleetError, match="broken"):
            sender.broadcast(values)
    finally:
        sender.close()
    assert r1.read().WhichOneof("kind") == "close"  # the healthy rank is told the group ended
    r1.sock.close()


def test_sender_times_out_naming_the_missing_ranks():
    from rlfleet import FleetError, TcpWeightSender
    with TcpWeightSender("g", world_size=3, timeout=0.5) as sender:
        r1 = Receiver(sender.port, 1)
        with pytest.raises(FleetError) as e:
            sender.wait_for_receivers()
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "missing ranks [2]" in e.value.details()
        r1.sock.close()
