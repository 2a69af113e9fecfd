"""The trainer side (rank 0) of a `tcp` weight-update group, in Python: broadcasts in-memory
tensors to every worker that joined with InitWeightsUpdateGroup, bucket by bucket.

The protocol is the workers' own (protos/rl/v1/weight_sync.proto, docs/weight-sync.md): every
control message is an rl.v1.WeightSyncMessage inside a frame `u32 length | u32 CRC32C | body`;
per bucket the sender writes the Bucket header frame, then the payload's raw bytes (the tensors
back to back), then reads one Ack per receiver. Receivers check the header against the metadata
their UpdateWeightsFromDistributed / PrepareWeightsUpdate / ReceiveWeights call carried and the
payload's CRC32C before they use a byte.

`TcpWeightSender` listens as soon as it is made; `start()` admits receivers in a background
thread (so the InitWeightsUpdateGroup call that makes them connect can run meanwhile) and
`wait_for_receivers()` waits for the group to form. The rendezvous refuses a Hello with another
group name, backend or world size, a rank outside [1, world_size) or a rank already taken (an
error Welcome names the reason). Every wait is bounded: the group's formation by `timeout`, a
receiver that stops making progress by `stall_timeout`.

Cost: a bucket's tensors are read once for the checksum and once per receiver for the send;
C-contiguous CPU arrays are sent from the caller's memory (no copy), other tensors (CUDA, strided)
are copied to host once per bucket (memory: one bucket). One thread per receiver while a bucket
is sent; CRC32C runs at several GB/s (the `crc32c` package, hardware instructions).
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence

import crc32c as _crc32c
import grpc

from rlfleet._stubs import admin_pb2, weight_sync_pb2
from rlfleet.errors import FleetError, WorkerOutcome
from rlfleet.tensors import DEFAULT_CHUNK_BYTES, NamedTensors, TensorPayload, iter_named_tensors

PROTOCOL = weight_sync_pb2.WEIGHT_SYNC_PROTOCOL_V2
MAX_MESSAGE_BYTES = 64 << 20
DEFAULT_BUCKET_BYTES = 512 << 20
_HELLO_BUDGET_S = 5.0
_CLOSE_BUDGET_S = 1.0
_POLL_S = 0.1


def crc32c(data: Any, value: int = 0) -> int:
    """CRC32C (Castagnoli) of a bytes-like object, extending `value`."""
    return int(_crc32c.crc32c(data, value))


def encode_frame(message: weight_sync_pb2.WeightSyncMessage) -> bytes:
    """`u32 length | u32 CRC32C(body) | body` of one control message."""
    body = message.SerializeToString()
    return struct.pack("<II", len(body), crc32c(body)) + body


def _recv_exact(sock: socket.socket, n: int, deadline: float, what: str) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FleetError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{what}: no data in time")
        sock.settimeout(left)
        try:
            k = sock.recv_into(view[got:], n - got)
        except socket.timeout:
            raise FleetError(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"{what}: no data in time") from None
        except OSError as e:
            raise FleetError(grpc.StatusCode.UNAVAILABLE, f"{what}: {e}") from None
        if k == 0:
            raise FleetError(grpc.StatusCode.UNAVAILABLE, f"{what}: connection closed by the peer")
        got += k
    return bytes(buf)


def read_frame(sock: socket.socket, timeout: float, what: str) -> weight_sync_pb2.WeightSyncMessage:
    """Reads one control message, checking its length cap and CRC (DATA_LOSS)."""
    deadline = time.monotonic() + timeout
    size, crc = struct.unpack("<II", _recv_exact(sock, 8, deadline, what))
    if size > MAX_MESSAGE_BYTES:
        raise FleetError(grpc.StatusCode.DATA_LOSS, f"{what}: message of {size} bytes exceeds "
                         f"the {MAX_MESSAGE_BYTES}-byte cap (not a weight-sync peer?)")
    body = _recv_exact(sock, size, deadline, what)
    if crc32c(body) != crc:
        raise FleetError(grpc.StatusCode.DATA_LOSS, f"{what}: message checksum mismatch")
    msg = weight_sync_pb2.WeightSyncMessage()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # google.protobuf.message.DecodeError
        raise FleetError(grpc.StatusCode.DATA_LOSS,
                         f"{what}: not a weight-sync message: {e}") from None
    return msg


def _send_all(sock: socket.socket, data: Any, timeout: float, what: str) -> None:
    sock.settimeout(timeout)
    try:
        sock.sendall(data)
    except socket.timeout:
        raise FleetError(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"{what}: the receiver made no progress in {timeout:g} s") from None
    except OSError as e:
        raise FleetError(grpc.StatusCode.UNAVAILABLE, f"{what}: {e}") from None


def _peer_closed_or_readable(sock: socket.socket) -> bool:
    """A joined receiver sends nothing until the Welcome: readable means it left (or broke the
    protocol)."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(r)


# Buckets ------------------------------------------------------------------------------------

class EncodedPayload(TensorPayload):
    """A tensor of a delta receive (issue 30) sent as its delta payload: on the wire it is
    U8[len(payload)] under the tensor's name; the gRPC request lists the tensor's own dtype and
    shape (`listed_dtype`, `listed_shape`) with its `encoding` ("overwrite" / "xor") and `count`
    (rlfleet.publication.encode_delta's output, as rl-worker decodes it)."""

    def __init__(self, name: str, dtype: str, shape: Sequence[int], encoding: str, count: int,
                 payload: bytes) -> None:
        view = memoryview(payload)

        def blocks(max_bytes: int) -> Iterator[memoryview]:
            for at in range(0, len(view), max_bytes):
                yield view[at:at + max_bytes]

        super().__init__(name, "U8", (len(payload),), blocks, zero_copy=True)
        self.listed_dtype = dtype
        self.listed_shape: tuple[int, ...] = tuple(int(d) for d in shape)
        self.encoding = encoding
        self.count = count


def listed_dtype(t: TensorPayload) -> str:
    """The dtype a receive request lists for `t` (an encoded tensor's own, not its payload's)."""
    return t.listed_dtype if isinstance(t, EncodedPayload) else t.dtype


def listed_shape(t: TensorPayload) -> tuple[int, ...]:
    """The shape a receive request lists for `t` (an encoded tensor's own)."""
    return t.listed_shape if isinstance(t, EncodedPayload) else t.shape


@dataclass
class Bucket:
    """The tensors of one broadcast and the metadata the workers' calls carry for it. A bucket
    of a delta receive holds EncodedPayloads beside whole tensors: its proto then names every
    tensor's encoding, count and payload bytes."""
    tensors: list[TensorPayload] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @property
    def dtypes(self) -> list[str]:
        return [listed_dtype(t) for t in self.tensors]

    @property
    def shapes(self) -> list[list[int]]:
        return [list(listed_shape(t)) for t in self.tensors]

    @property
    def is_delta(self) -> bool:
        return any(isinstance(t, EncodedPayload) for t in self.tensors)

    def to_proto(self) -> admin_pb2.WeightBucket:
        b = admin_pb2.WeightBucket(names=self.names, dtypes=self.dtypes)
        for s in self.shapes:
            b.shapes.add(dims=s)
        if self.is_delta:
            for t in self.tensors:
                b.encodings.append(t.encoding if isinstance(t, EncodedPayload) else "dense")
                b.delta_counts.append(t.count if isinstance(t, EncodedPayload) else 0)
                b.payload_bytes.append(t.nbytes)
        return b


def plan_buckets(tensors: Iterable[TensorPayload], bucket_bytes: int) -> list[Bucket]:
    """Greedy in the given order, as rl-weight-sender plans a checkpoint: a bucket closes when
    the next tensor would push it past `bucket_bytes`; a larger tensor travels alone."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, not {bucket_bytes}")
    buckets: list[Bucket] = []
    current = Bucket()
    size = 0
    for t in tensors:
        if current.tensors and size + t.nbytes > bucket_bytes:
            buckets.append(current)
            current, size = Bucket(), 0
        current.tensors.append(t)
        size += t.nbytes
    if current.tensors:
        buckets.append(current)
    return buckets


def iter_buckets(named_tensors: NamedTensors, bucket_bytes: int) -> Iterable[Bucket]:
    """plan_buckets over a collection, one bucket at a time (a generator input is consumed as
    the buckets are taken)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, not {bucket_bytes}")
    current = Bucket()
    size = 0
    for t in iter_named_tensors(named_tensors):
        if current.tensors and size + t.nbytes > bucket_bytes:
            yield current
            current, size = Bucket(), 0
        current.tensors.append(t)
        size += t.nbytes
    if current.tensors:
        yield current


@dataclass(frozen=True)
class BroadcastStats:
    """One bucket's broadcast: payload bytes (sent once per receiver) and seconds from reading
    the tensors to the last receiver's ack."""
    bytes: int
    seconds: float
    receivers: int


# The sender ---------------------------------------------------------------------------------

class TcpWeightSender:
    """Rank 0 of a `tcp` weight-update group. Thread-safe: one broadcast at a time (a lock);
    close() may run from another thread and makes a pending call fail promptly.

        sender = TcpWeightSender("g", world_size=3)          # listening now
        sender.start()                                       # admits receivers meanwhile
        client.init_weights_update_group("127.0.0.1", sender.port, 1, 3, "g", backend="tcp")
        sender.wait_for_receivers()
        # per bucket, while the workers' UpdateWeightsFromDistributed call waits:
        sender.broadcast(bucket)
        sender.close()
    """

    def __init__(self, group_name: str, world_size: int, *, host: str = "127.0.0.1",
                 port: int = 0, timeout: float = 60.0, stall_timeout: Optional[float] = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if not group_name:
            raise ValueError("group_name must not be empty")
        if world_size < 2:
            raise ValueError(f"world_size must be >= 2 (this sender and a receiver), not "
                             f"{world_size}")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.group_name = group_name
        self.world_size = world_size
        self.timeout = timeout
        self.stall_timeout = stall_timeout if stall_timeout else timeout
        self.chunk_bytes = chunk_bytes
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener: Optional[socket.socket] = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
            self._listener.listen(max(16, world_size))
        except OSError as e:
            self._listener.close()
            raise FleetError(grpc.StatusCode.UNAVAILABLE,
                             f"weight-sync sender: cannot listen on {host}:{port}: {e}") from None
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._context = f"weight-sync group '{group_name}' sender on {host}:{self.port}"
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._receivers: list[socket.socket] = []
        self._broken: list[Optional[str]] = []
        self._seq = 0
        self._ready = False
        self._accept_thread: Optional[threading.Thread] = None
        self._accept_error: Optional[FleetError] = None

    # Rendezvous ---------------------------------------------------------------------------

    def start(self) -> None:
        """Admits receivers in a background thread (wait_for_receivers() waits for it)."""
        if self._accept_thread is not None:
            return
        self._accept_thread = threading.Thread(target=self._accept_main, daemon=True,
                                               name=f"rlfleet-accept-{self.group_name}")
        self._accept_thread.start()

    def wait_for_receivers(self, timeout: Optional[float] = None) -> None:
        """Waits until every rank has joined and got its Welcome. FleetError DEADLINE_EXCEEDED
        naming the missing ranks after `timeout` (the group's), UNAVAILABLE / FAILED_PRECONDITION
        when closed meanwhile."""
        self.start()
        assert self._accept_thread is not None
        self._accept_thread.join(self.timeout + 5 if timeout is None else timeout)
        if self._accept_thread.is_alive():
            raise FleetError(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"{self._context}: the group has not formed yet")
        if self._accept_error is not None:
            raise self._accept_error

    def _accept_main(self) -> None:
        try:
            self._accept_all()
        except FleetError as e:
            self._accept_error = e
        except Exception as e:  # never lose an error in a thread
            self._accept_error = FleetError(grpc.StatusCode.INTERNAL, f"{self._context}: {e!r}")

    def _admit(self, peer: socket.socket, joined: list[Optional[socket.socket]],
               deadline: float) -> int:
        budget = max(0.001, min(deadline - time.monotonic(), _HELLO_BUDGET_S))
        msg = read_frame(peer, budget, "hello")
        verdict: Optional[tuple[grpc.StatusCode, str]] = None
        if msg.WhichOneof("kind") != "hello":
            verdict = (grpc.StatusCode.INVALID_ARGUMENT,
                       f"expected a hello, got {msg.WhichOneof('kind') or 'an empty message'}")
        else:
            h = msg.hello
            world = self.world_size
            if h.protocol != PROTOCOL:
                verdict = (grpc.StatusCode.INVALID_ARGUMENT,
                           f"protocol version {h.protocol}, this sender speaks {PROTOCOL}")
            elif h.group_name != self.group_name:
                verdict = (grpc.StatusCode.INVALID_ARGUMENT,
                           f"group_name '{h.group_name[:64]}' does not match the sender's "
                           f"'{self.group_name}'")
            elif h.backend != admin_pb2.GROUP_BACKEND_TCP:
                verdict = (grpc.StatusCode.INVALID_ARGUMENT,
                           f"backend {admin_pb2.GroupBackend.Name(h.backend)} does not match the "
                           "sender's tcp" if h.backend in admin_pb2.GroupBackend.values() else
                           f"unknown backend {h.backend}")
            elif h.world_size != world:
                verdict = (grpc.StatusCode.INVALID_ARGUMENT,
                           f"world_size {h.world_size} does not match the sender's {world}")
            elif not 1 <= h.rank < world:
                verdict = (grpc.StatusCode.INVALID_ARGUMENT,
                           f"rank {h.rank} is outside [1, {world})")
            else:
                old = joined[h.rank - 1]
                if old is not None and not _peer_closed_or_readable(old):
                    verdict = (grpc.StatusCode.ALREADY_EXISTS,
                               f"rank {h.rank} has already joined the group")
        if verdict is not None:
            refusal = weight_sync_pb2.WeightSyncMessage()
            refusal.welcome.protocol = PROTOCOL
            refusal.welcome.code = verdict[0].value[0]
            refusal.welcome.message = verdict[1]
            try:
                _send_all(peer, encode_frame(refusal), budget, "welcome")
            except FleetError:
                pass
            raise FleetError(verdict[0], verdict[1])
        return int(msg.hello.rank)

    def _accept_all(self) -> None:
        assert self._listener is not None
        start = time.monotonic()
        deadline = start + self.timeout
        joined: list[Optional[socket.socket]] = [None] * (self.world_size - 1)
        try:
            while True:
                for i, s in enumerate(joined):
                    if s is not None and _peer_closed_or_readable(s):
                        s.close()
                        joined[i] = None
                if all(s is not None for s in joined):
                    break
                if self._closing.is_set():
                    raise FleetError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"{self._context}: closed before the group formed")
                now = time.monotonic()
                if now >= deadline:
                    missing = [i + 1 for i, s in enumerate(joined) if s is None]
                    raise FleetError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"{self._context}: group did not form within {now - start:.1f} s; "
                        f"{len(joined) - len(missing)} of {len(joined)} receivers joined, "
                        f"missing ranks {missing}")
                self._listener.settimeout(min(_POLL_S, deadline - now))
                try:
                    peer, _ = self._listener.accept()
                except socket.timeout:
                    continue
                except OSError as e:
                    if self._closing.is_set():
                        continue
                    raise FleetError(grpc.StatusCode.UNAVAILABLE, f"{self._context}: {e}") from None
                peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    rank = self._admit(peer, joined, deadline)
                except FleetError:
                    peer.close()
                    continue
                old = joined[rank - 1]
                if old is not None:
                    old.close()
                joined[rank - 1] = peer
            welcome = weight_sync_pb2.WeightSyncMessage()
            welcome.welcome.protocol = PROTOCOL
            welcome.welcome.code = 0
            welcome.welcome.message = "joined"
            frame = encode_frame(welcome)
            for i, s in enumerate(joined):
                assert s is not None
                try:
                    _send_all(s, frame, max(0.001, deadline - time.monotonic()), "welcome")
                except FleetError as e:
                    raise FleetError(e.code(), f"{self._context}: rank {i + 1} left while the "
                                     f"group formed: {e.details()}") from None
        except BaseException:
            for s in joined:
                if s is not None:
                    s.close()
            raise
        finally:
            self._listener.close()
            self._listener = None
        with self._lock:
            self._receivers = [s for s in joined if s is not None]
            self._broken = [None] * len(self._receivers)
            self._ready = True

    # Broadcast ----------------------------------------------------------------------------

    def broadcast(self, tensors: Bucket | NamedTensors) -> BroadcastStats:
        """Sends one bucket (a Bucket, or any collection of named tensors sent as one) to every
        receiver and waits for every ack. FleetError naming each rank that failed (its
        WorkerOutcome in `results`): FAILED_PRECONDITION when a receiver rejected the bucket
        (e.g. its metadata differs: the group stays usable), UNAVAILABLE / DEADLINE_EXCEEDED /
        DATA_LOSS for I/O trouble (that rank's link is broken: destroy and re-create the
        group)."""
        bucket = tensors if isinstance(tensors, Bucket) else Bucket(
            list(iter_named_tensors(tensors)))
        with self._lock:
            if self._closing.is_set():
                raise FleetError(grpc.StatusCode.FAILED_PRECONDITION, f"{self._context}: closed")
            if not self._ready:
                raise FleetError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{self._context}: wait_for_receivers() has not completed")
            broken = [f"rank {i + 1}: {b}" for i, b in enumerate(self._broken) if b]
            if broken:
                raise FleetError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{self._context}: group broken by an earlier error (destroy "
                                 f"and re-create it): {'; '.join(broken)}",
                                 method="broadcast")
            return self._broadcast_locked(bucket)

    def _broadcast_locked(self, bucket: Bucket) -> BroadcastStats:
        start = time.monotonic()
        # The bucket's bytes: views of the caller's memory where possible, host copies of one
        # chunk each otherwise (CUDA, strided); the CRC over all of them.
        pieces: list[Any] = []
        crc = 0
        for t in bucket.tensors:
            for chunk in t.chunks(self.chunk_bytes):
                piece = chunk if t.zero_copy else bytes(chunk)
                crc = crc32c(piece, crc)
                pieces.append(piece)
        seq = self._seq
        self._seq += 1
        header = weight_sync_pb2.WeightSyncMessage()
        header.bucket.seq = seq
        for t in bucket.tensors:
            header.bucket.tensors.add(name=t.name, dtype=t.dtype, shape=list(t.shape),
                                      bytes=t.nbytes)
        header.bucket.payload_bytes = bucket.nbytes
        header.bucket.payload_crc32c = crc
        frame = encode_frame(header)
        results: list[Optional[FleetError]] = [None] * len(self._receivers)

        def serve(i: int) -> None:
            s = self._receivers[i]
            try:
                _send_all(s, frame, self.stall_timeout, "bucket header")
                for piece in pieces:
                    _send_all(s, piece, self.stall_timeout, "bucket payload")
                ack = read_frame(s, self.stall_timeout, f"ack from rank {i + 1}")
                if ack.WhichOneof("kind") != "ack":
                    raise FleetError(grpc.StatusCode.DATA_LOSS,
                                     f"ack from rank {i + 1}: unexpected "
                                     f"{ack.WhichOneof('kind')}")
                if ack.ack.seq != seq:
                    raise FleetError(grpc.StatusCode.DATA_LOSS, f"ack from rank {i + 1}: for "
                                     f"bucket {ack.ack.seq}, expected {seq}")
                if ack.ack.code != 0:
                    code = _code_from_wire(ack.ack.code)
                    results[i] = FleetError(grpc.StatusCode.FAILED_PRECONDITION,
                                            f"rank {i + 1} rejected the bucket: {code.name}: "
                                            f"{ack.ack.message}")
            except FleetError as e:
                results[i] = e

        if len(self._receivers) == 1:
            serve(0)
        else:
            threads = [threading.Thread(target=serve, args=(i,), daemon=True)
                       for i in range(len(self._receivers))]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        failures = [(i, e) for i, e in enumerate(results) if e is not None]
        if failures:
            for i, e in failures:
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    self._broken[i] = e.details()
            if self._closing.is_set():
                raise FleetError(grpc.StatusCode.FAILED_PRECONDITION, f"{self._context}: closed")
            # The most telling code: a receiver's verdict over I/O trouble.
            codes = [e.code() for _, e in failures]
            code = (grpc.StatusCode.FAILED_PRECONDITION
                    if grpc.StatusCode.FAILED_PRECONDITION in codes else codes[0])
            outcomes = []
            for i, err in enumerate(results):
                if err is None:
                    outcomes.append(WorkerOutcome(f"rank {i + 1}", True, grpc.StatusCode.OK, ""))
                else:
                    outcomes.append(WorkerOutcome(f"rank {i + 1}", False, err.code(),
                                                  err.details()))
            raise FleetError(code, f"{self._context}: bucket {seq} failed: " +
                             "; ".join(f"rank {i + 1}: {e.details()}" for i, e in failures),
                             method="broadcast", results=outcomes)
        return BroadcastStats(bucket.nbytes, time.monotonic() - start, len(self._receivers))

    # Close --------------------------------------------------------------------------------

    def close(self) -> None:
        """Tells receivers the group is over (their pending receive fails) and releases the
        sockets. Idempotent; safe from another thread while a call runs (which then fails)."""
        first = not self._closing.is_set()
        self._closing.set()
        if not self._lock.acquire(blocking=False):
            for s in list(self._receivers):  # a broadcast is in flight: make it fail promptly
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._lock.acquire()
        try:
            if first and self._ready:
                bye = weight_sync_pb2.WeightSyncMessage()
                bye.close.seq = self._seq
                frame = encode_frame(bye)
                for i, s in enumerate(self._receivers):
                    if self._broken[i] is None:
                        try:
                            _send_all(s, frame, min(self.stall_timeout, _CLOSE_BUDGET_S), "close")
                        except FleetError:
                            pass
            for s in self._receivers:
                try:
                    s.close()
                except OSError:
                    pass
            self._receivers = []
            self._ready = False
        finally:
            self._lock.release()
        accept = self._accept_thread
        if accept is not None and accept is not threading.current_thread():
            accept.join(self.timeout + 5)
        elif self._listener is not None:
            self._listener.close()
            self._listener = None

    def __enter__(self) -> "TcpWeightSender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _code_from_wire(code: int) -> grpc.StatusCode:
    for c in grpc.StatusCode:
        if c.value[0] == code:
            return c
    return grpc.StatusCode.UNKNOWN


def bucket_metadata(buckets: Sequence[Bucket]) -> list[admin_pb2.WeightBucket]:
    """The PrepareWeightsUpdate / ReceiveWeights `buckets` field of a plan."""
    return [b.to_proto() for b in buckets]


__all__ = ["TcpWeightSender", "Bucket", "EncodedPayload", "BroadcastStats", "plan_buckets",
           "iter_buckets", "bucket_metadata", "encode_frame", "read_frame", "crc32c"]
