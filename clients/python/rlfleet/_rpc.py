"""What the blocking and the asyncio clients share: request building, the check that turns a
`success=false` answer into FleetError, and the tensor stream's messages."""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Optional, Sequence, TypeVar

import grpc
from google.protobuf.message import Message

from rlfleet._progress import Reporter
from rlfleet._stubs import admin_pb2
from rlfleet.errors import FleetError, WorkerOutcome, status_code
from rlfleet.tensors import (DTYPE_SIZES, NamedTensors, SafetensorsFile, TensorPayload,
                             iter_named_tensors, normalize_dtype)

M = TypeVar("M", bound=Message)

OPTIONS = [("grpc.max_receive_message_length", 512 << 20),
           ("grpc.max_send_message_length", 512 << 20)]
# The router's fair admission keys on this header (else on the connection's peer address).
CLIENT_ID_HEADER = "rl-client-id"
MAX_CLIENT_ID_BYTES = 128
# Largest data of one tensor-stream message the servers take (--max-tensor-chunk-bytes).
MAX_CHUNK_BYTES = 256 << 20

PAUSE_MODES = {"abort": admin_pb2.PAUSE_MODE_ABORT, "in_place": admin_pb2.PAUSE_MODE_IN_PLACE,
               "retract": admin_pb2.PAUSE_MODE_RETRACT, "drain": admin_pb2.PAUSE_MODE_DRAIN}
CHECKER_ACTIONS = {"snapshot": admin_pb2.WEIGHTS_CHECKER_ACTION_SNAPSHOT,
                   "reset_tensors": admin_pb2.WEIGHTS_CHECKER_ACTION_RESET_TENSORS,
                   "compare": admin_pb2.WEIGHTS_CHECKER_ACTION_COMPARE,
                   "checksum": admin_pb2.WEIGHTS_CHECKER_ACTION_CHECKSUM}
BACKENDS = {"tcp": admin_pb2.GROUP_BACKEND_TCP, "nccl": admin_pb2.GROUP_BACKEND_NCCL,
            "auto": admin_pb2.GROUP_BACKEND_UNSPECIFIED}


def metadata(api_key: Optional[str], client_id: Optional[str]) -> list[tuple[str, str]]:
    md = [("authorization", f"Bearer {api_key}")] if api_key else []
    if client_id:
        if not client_id.isascii() or not client_id.isprintable():
            raise ValueError(f"client_id: {client_id!r} must be printable ASCII")
        if len(client_id) > MAX_CLIENT_ID_BYTES:
            raise ValueError(f"client_id: {len(client_id)} bytes is more than "
                             f"{MAX_CLIENT_ID_BYTES}")
        md.append((CLIENT_ID_HEADER, client_id))
    return md


def path(service: str, method: str) -> str:
    return f"/{service}/{method}"


def serialize(message: Message) -> bytes:
    return message.SerializeToString()


def identity(message: bytes) -> bytes:
    """The serializer of calls whose messages are encoded already (the tensor stream)."""
    return message


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


_CHUNK_TAG = b"\x0a"  # UpdateWeightsFromTensorRequest.chunk: field 1, length-delimited
_DATA_TAG = b"\x2a"   # TensorChunk.data: field 5, length-delimited


def encode_chunk(header: admin_pb2.TensorChunk, data: Any,
                 options: Optional[admin_pb2.UpdateWeightsFromTensorRequest] = None) -> bytes:
    """The encoded UpdateWeightsFromTensorRequest{chunk: header + data, options}: the header's
    encoding (`data` unset) followed by the data field, then the options' fields. Protobuf
    decoders merge fields however they are split, so this decodes to exactly the message
    SerializeToString would give (tests/clients/python/test_tensors_unit.py checks it), while
    the chunk's bytes are copied once, into the message, instead of three times (bytes(),
    the field, the serializer)."""
    head = header.SerializeToString()
    size = _varint(len(data))
    inner = len(head) + len(_DATA_TAG) + len(size) + len(data)
    parts = [_CHUNK_TAG, _varint(inner), head, _DATA_TAG, size, data]
    if options is not None:
        parts.append(options.SerializeToString())
    return b"".join(parts)


def pick(table: dict[str, Any], value: str, what: str) -> Any:
    if value not in table:
        raise ValueError(f"{what}: {value!r} is not one of {', '.join(table)}")
    return table[value]


def outcomes(results: Sequence[admin_pb2.WorkerResult]) -> list[WorkerOutcome]:
    return [WorkerOutcome(r.worker, r.success, status_code(r.code) if r.code else
                          (grpc.StatusCode.OK if r.success else grpc.StatusCode.UNKNOWN),
                          r.message, r.weight_version, r.left_out) for r in results]


def check_admin(response: admin_pb2.AdminResponse, method: str) -> admin_pb2.AdminResponse:
    """`response` when it succeeded; FleetError carrying every worker's result otherwise."""
    if response.success:
        return response
    results = outcomes(response.results)
    failed = [r for r in results if not r.success]
    code = failed[0].code if failed else grpc.StatusCode.UNKNOWN
    if code == grpc.StatusCode.OK:
        code = grpc.StatusCode.UNKNOWN
    message = response.message or (f"{len(failed)} of {len(results)} workers failed" if results
                                   else "the call failed")
    raise FleetError(code, message, method=method, results=results, response=response)


def check_checker(response: admin_pb2.WeightsCheckerResponse,
                  method: str = "WeightsChecker") -> admin_pb2.WeightsCheckerResponse:
    """WeightsChecker answers carry their own success flag (per worker through the router)."""
    failed = [w for w in response.workers if not w.result.success]
    if response.success and not failed:
        return response
    results = [WorkerOutcome(w.worker, w.result.success,
                             grpc.StatusCode.OK if w.result.success else grpc.StatusCode.UNKNOWN,
                             w.result.message) for w in response.workers]
    raise FleetError(grpc.StatusCode.UNKNOWN, response.message or "weights checker failed",
                     method=method, results=results, response=response)


def set_optional(message: Message, **fields: Any) -> None:
    """Sets every field whose value is not None (proto3 `optional` fields stay unset)."""
    for name, value in fields.items():
        if value is not None:
            setattr(message, name, value)


def pause_request(mode: str, drain_timeout_ms: Optional[int]
                  ) -> admin_pb2.PauseGenerationRequest:
    req = admin_pb2.PauseGenerationRequest(mode=pick(PAUSE_MODES, mode, "mode"))
    if drain_timeout_ms is not None:
        if mode != "drain":
            raise ValueError("drain_timeout_ms: only with mode='drain'")
        req.drain_timeout_ms = int(drain_timeout_ms)
    return req


def update_from_disk_request(model_path: str, weight_version: Optional[int],
                             abort_all_requests: bool, keep_pause: bool,
                             flush_cache: Optional[bool],
                             workers: Optional[Sequence[str]], keep_kv: bool = False
                             ) -> admin_pb2.UpdateWeightsFromDiskRequest:
    req = admin_pb2.UpdateWeightsFromDiskRequest(model_path=str(model_path),
                                                 abort_all_requests=abort_all_requests,
                                                 keep_pause=keep_pause, keep_kv=keep_kv,
                                                 workers=list(workers or []))
    set_optional(req, weight_version=weight_version, flush_cache=flush_cache)
    return req


def group_request(master_address: str, master_port: int, rank_offset: int, world_size: int,
                  group_name: str, backend: str,
                  timeout_ms: Optional[int]) -> admin_pb2.InitWeightsUpdateGroupRequest:
    req = admin_pb2.InitWeightsUpdateGroupRequest(
        master_address=master_address, master_port=int(master_port), rank_offset=int(rank_offset),
        world_size=int(world_size), group_name=group_name,
        backend=pick(BACKENDS, backend, "backend"))
    set_optional(req, timeout_ms=timeout_ms)
    return req


def distributed_request(names: Sequence[str], dtypes: Sequence[Any],
                        shapes: Sequence[Sequence[int]], group_name: str,
                        weight_version: Optional[int], flush_cache: Optional[bool],
                        abort_all_requests: bool) -> admin_pb2.UpdateWeightsFromDistributedRequest:
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"names, dtypes and shapes differ in length ({len(names)}, "
                         f"{len(dtypes)}, {len(shapes)})")
    req = admin_pb2.UpdateWeightsFromDistributedRequest(
        names=list(names), dtypes=[normalize_dtype(d) for d in dtypes], group_name=group_name,
        abort_all_requests=abort_all_requests)
    for s in shapes:
        req.shapes.add(dims=[int(d) for d in s])
    set_optional(req, weight_version=weight_version, flush_cache=flush_cache)
    return req


def set_delta(req: Any, parent_version: Optional[int],
              manifest: Optional[dict[str, Any]]) -> None:
    """Marks a Prepare / Receive request a delta receive of `parent_version` (issue 30),
    verified against `manifest` (manifest_of's dict) when given."""
    if parent_version is not None:
        req.parent_version = parent_version
    if manifest is not None:
        req.manifest_json = json.dumps(manifest)


def buckets_proto(buckets: Sequence[Any]) -> list[admin_pb2.WeightBucket]:
    """WeightBucket messages from Bucket objects, WeightBucket messages or (names, dtypes,
    shapes) triples."""
    out = []
    for b in buckets:
        if isinstance(b, admin_pb2.WeightBucket):
            out.append(b)
        elif hasattr(b, "to_proto"):
            out.append(b.to_proto())
        else:
            names, dtypes, shapes = b
            m = admin_pb2.WeightBucket(names=list(names),
                                       dtypes=[normalize_dtype(d) for d in dtypes])
            for s in shapes:
                m.shapes.add(dims=[int(d) for d in s])
            out.append(m)
    return out


class StreamSource:
    """The tensor stream's messages (`messages()`): every tensor in chunks of at most
    `chunk_bytes` (offset = the chunk's byte offset), the options on the first message (with the
    first chunk) and a last message with the stream's explicit end alone (TensorStreamEnd: the
    distinct tensor names and the data bytes sent), after which gRPC half-closes the stream:
    servers apply a stream only after both (docs/weight-updates.md). One chunk's bytes
    are copied into its message and nothing else is held, so a push costs about one chunk of
    memory beyond the caller's tensors (gRPC sends one message at a time).

    A list, tuple or mapping of tensors is checked whole before anything is sent (every dtype
    and shape; a checkpoint from read_safetensors by its header), so a bad tensor anywhere is an
    error before the stream starts; ValueError when there is no tensor. An error met while
    reading a later tensor of an iterator cuts the stream (the call is cancelled: servers apply
    no cut stream); it is kept in `error` for the client to raise instead of gRPC's generic
    one."""

    def __init__(self, named_tensors: NamedTensors, reporter: Reporter, chunk_bytes: int,
                 weight_version: Optional[int], flush_cache: Optional[bool],
                 abort_all_requests: bool, keep_pause: bool, keep_kv: bool = False,
                 stage: bool = False) -> None:
        if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in (0, {MAX_CHUNK_BYTES}], not {chunk_bytes}")
        if isinstance(named_tensors, SafetensorsFile):
            for name in named_tensors:
                dtype, _ = named_tensors.spec(name)
                if dtype not in DTYPE_SIZES:
                    _refuse(name, dtype)
            self._payloads: Iterator[TensorPayload] = iter_named_tensors(named_tensors)
        elif isinstance(named_tensors, (list, tuple, Mapping)):
            self._payloads = iter(list(iter_named_tensors(named_tensors)))
        else:
            self._payloads = iter_named_tensors(named_tensors)
        self._first = next(self._payloads, None)
        if self._first is None:
            raise ValueError("named_tensors is empty: nothing to update")
        self._reporter = reporter
        self._chunk_bytes = chunk_bytes
        self._options = dict(weight_version=weight_version, flush_cache=flush_cache)
        self._abort_all_requests = abort_all_requests
        self._keep_pause = keep_pause
        self._keep_kv = keep_kv
        self._stage = stage
        self.error: Optional[BaseException] = None

    def messages(self) -> Iterator[bytes]:
        """The encoded messages (send them with the `identity` serializer)."""
        try:
            yield from self._messages()
        except Exception as e:
            self.error = e
            raise

    def _messages(self) -> Iterator[bytes]:
        first = admin_pb2.UpdateWeightsFromTensorRequest(
            abort_all_requests=self._abort_all_requests, keep_pause=self._keep_pause,
            keep_kv=self._keep_kv, stage=self._stage)
        set_optional(first, **self._options)
        options: Optional[admin_pb2.UpdateWeightsFromTensorRequest] = first
        names: set[str] = set()  # the end counts distinct names, as the receiver does
        num_bytes = 0
        t = self._first
        while t is not None:
            offset = 0
            chunks = t.chunks(self._chunk_bytes) if t.nbytes else iter([memoryview(b"")])
            for data in chunks:
                header = admin_pb2.TensorChunk(name=t.name, dtype=t.dtype, shape=t.shape,
                                               offset=offset)
                yield encode_chunk(header, data, options)
                options = None  # the first message only
                offset += len(data)
                num_bytes += len(data)
                self._reporter.add(len(data), t.name, offset == t.nbytes)
            names.add(t.name)
            t = next(self._payloads, None)
        msg = admin_pb2.UpdateWeightsFromTensorRequest()
        msg.end.num_tensors = len(names)
        msg.end.num_bytes = num_bytes
        yield msg.SerializeToString()


def _refuse(name: str, dtype: str) -> None:
    raise TypeError(f"tensor {name!r}: checkpoint dtype {dtype} is not F32, BF16 or F16")


def stage_request(model_path: str, weight_version: Optional[int]) -> admin_pb2.StageWeightsRequest:
    req = admin_pb2.StageWeightsRequest(model_path=model_path)
    set_optional(req, weight_version=weight_version)
    return req


def activate_request(weight_version: Optional[int], abort_all_requests: bool,
                     keep_pause: bool, keep_kv: bool = False) -> admin_pb2.ActivateWeightsRequest:
    req = admin_pb2.ActivateWeightsRequest(abort_all_requests=abort_all_requests,
                                           keep_pause=keep_pause, keep_kv=keep_kv)
    set_optional(req, weight_version=weight_version)
    return req


def refit_request(model_path: str, weight_version: Optional[int], abort_all_requests: bool,
                  keep_pause: bool, keep_kv: bool = False) -> admin_pb2.RefitWeightsRequest:
    req = admin_pb2.RefitWeightsRequest(model_path=model_path,
                                        abort_all_requests=abort_all_requests,
                                        keep_pause=keep_pause, keep_kv=keep_kv)
    set_optional(req, weight_version=weight_version)
    return req
