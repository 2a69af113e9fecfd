"""WeightsGroup: a `tcp` weight-update group with the trainer's process as rank 0, driven end to
end from Python: the sender (rlfleet.TcpWeightSender) and the gRPC calls that make the workers
receive (through the router: every live worker), so in-memory tensors reach the fleet bucket by
bucket without a checkpoint on disk.

Three ways to push, as the workers offer them:
- `receive_weights` (default choice): one ReceiveWeights call; the workers pause (retract),
  receive every bucket, apply all atomically and bump the version once.
- `prepare_and_complete`: PrepareWeightsUpdate (the workers keep generating while the buckets
  arrive into host memory), then CompleteWeightsUpdate (a short pause to apply). One version.
- with `stage=True` (receive_weights, prepare_and_complete): the workers receive without
  pausing and keep the tensors as their staged version; activate_weights serves it (issue 30).
- deltas (issue 30): `send_delta(parent, new, weight_version, parent_version)`, or `parent=` /
  `parent_version=` on `receive_weights` and `prepare_and_complete`: only the changed words
  travel (rlfleet.publication.delta_tensors: per tensor encode_delta's overwrite or xor payload,
  sent as U8 bytes; a tensor without a counterpart whole; an unchanged one not at all). Every
  worker must serve `parent_version` (else FleetError FAILED_PRECONDITION naming both versions,
  before a byte is broadcast); it builds the new version on a copy of its weights, refuses NaN /
  Inf, verifies it against `manifest` when given, and applies or (with `stage`) stages it, or
  nothing at all.
- `update_weights_from_distributed`: SGLang's per-bucket call; each bucket is applied as it
  arrives and bumps the version (a failure leaves partial weights, the worker out of routing).
  `weight_version` goes on the last bucket.

Before any receive call the tensors are checked against the served weights (list_weights, read
when the group opens: names, shapes, no repeats), so a bad name fails at once instead of after a
stall (a fleet asleep at open cannot list its weights: the workers' own checks then apply). A
push whose
gRPC call fails while the broadcast runs closes the sender (the receivers' pending reads fail
promptly) and raises the call's error; after any failed push the group is unusable: close it and
open a new one.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import grpc

from rlfleet._progress import Progress, Reporter
from rlfleet._rpc import check_admin, distributed_request, set_delta
from rlfleet._stubs import admin_pb2, router_pb2
from rlfleet.errors import FleetError
from rlfleet.tensors import NamedTensors, TensorPayload, iter_named_tensors, total_bytes
from rlfleet.weight_sync import (DEFAULT_BUCKET_BYTES, BroadcastStats, Bucket, TcpWeightSender,
                                 listed_shape, plan_buckets)

if TYPE_CHECKING:
    from rlfleet.client import Client


def fleet_world_size(client: "Client") -> int:
    """1 + the workers that a group init through `client` reaches: the router's live workers
    (2 when `client` talks to one worker)."""
    if client.via == "worker":
        return 2
    live = [w for w in client.list_workers().workers if w.state == router_pb2.WORKER_STATE_LIVE]
    if not live:
        raise FleetError(grpc.StatusCode.UNAVAILABLE, "no live worker to join a weight group",
                         method="open_weights_group")
    return 1 + len(live)


def served_weights(client: "Client") -> Optional[admin_pb2.ListWeightsResponse]:
    """The served tensors, or None while the fleet sleeps (it cannot list them then)."""
    try:
        return client.list_weights()
    except FleetError as e:
        if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
            return None
        raise


def check_against_served(tensors: Sequence[TensorPayload],
                         served: admin_pb2.ListWeightsResponse) -> None:
    """FleetError INVALID_ARGUMENT naming the first tensor that is not a served weight with the
    same shape, or that repeats."""
    shapes = {w.name: tuple(w.shape) for w in served.weights}
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise FleetError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"tensor '{t.name}' is listed twice", method="weights group")
        seen.add(t.name)
        if t.name not in shapes:
            raise FleetError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"tensor '{t.name}' is not a served weight (list_weights())",
                             method="weights group")
        shape = listed_shape(t)
        if shapes[t.name] != shape:
            raise FleetError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"tensor '{t.name}' has shape {list(shape)}, the served weight "
                             f"{list(shapes[t.name])}", method="weights group")


def _check_delta_args(parent: Optional[NamedTensors], parent_version: Optional[int],
                      weight_version: Optional[int], manifest: Optional[dict[str, Any]]) -> None:
    """ValueError unless `parent` and `parent_version` come together (a delta), the new version
    is above the parent's, and a manifest only verifies a delta."""
    if (parent is None) != (parent_version is None):
        raise ValueError("a delta needs both parent (the tensors) and parent_version")
    if parent_version is None:
        if manifest is not None:
            raise ValueError("manifest verifies a delta: give parent and parent_version")
        return
    if parent_version < 0:
        raise ValueError("parent_version must be >= 0")
    if weight_version is not None and weight_version <= parent_version:
        raise ValueError("weight_version must be greater than parent_version")


def _sent_bytes(buckets: Sequence[Bucket]) -> int:
    return sum(b.nbytes for b in buckets)


class WeightsGroup:
    """An open `tcp` group: `sender` is rank 0, the fleet's workers ranks 1.. (see the module
    docstring). Not reentrant: one push at a time."""

    def __init__(self, client: "Client", sender: TcpWeightSender, group_name: str,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.client = client
        self.sender = sender
        self.group_name = group_name
        self.bucket_bytes = bucket_bytes
        self._served = served_weights(client)
        self._closed = False

    @staticmethod
    def open(client: "Client", group_name: str, *, master_address: str = "127.0.0.1",
             listen_host: Optional[str] = None, port: int = 0,
             world_size: Optional[int] = None, rank_offset: int = 1, timeout: float = 60.0,
             stall_timeout: Optional[float] = None) -> "WeightsGroup":
        """Listens, makes the fleet join, waits for every rank (see Client.open_weights_group)."""
        world = world_size if world_size is not None else fleet_world_size(client)
        sender = TcpWeightSender(group_name, world, host=listen_host or master_address,
                                 port=port, timeout=timeout, stall_timeout=stall_timeout)
        try:
            sender.start()
            client.init_weights_update_group(master_address, sender.port, rank_offset, world,
                                             group_name, backend="tcp",
                                             timeout_ms=int(timeout * 1000))
            sender.wait_for_receivers()
        except BaseException:
            sender.close()
            raise
        return WeightsGroup(client, sender, group_name)

    # Pushes -------------------------------------------------------------------------------

    def _plan(self, named_tensors: NamedTensors, bucket_bytes: Optional[int],
              parent: Optional[NamedTensors] = None) -> list[Bucket]:
        tensors = list(iter_named_tensors(named_tensors))
        if not tensors:
            raise ValueError("named_tensors is empty: nothing to update")
        if self._served is not None:
            check_against_served(tensors, self._served)
        if parent is not None:
            from rlfleet.publication import delta_tensors
            tensors = delta_tensors(parent, [(t.name, t) for t in tensors])
            if not tensors:
                raise ValueError("no tensor differs from the parent's: nothing to update")
        return plan_buckets(tensors, bucket_bytes or self.bucket_bytes)

    def _broadcast_all(self, buckets: Sequence[Bucket], call: Any, method: str,
                       reporter: Reporter) -> list[BroadcastStats]:
        """Broadcasts every bucket while `call` (a gRPC future) runs; closes the sender if the
        call fails first, so the broadcast stops instead of waiting for a stall."""
        failed_early = threading.Event()

        def on_done(f: Any) -> None:
            if f.cancelled():
                return
            if f.exception() is not None or not f.result().success:
                failed_early.set()
                self.sender.close()

        call.add_done_callback(on_done)
        stats: list[BroadcastStats] = []
        try:
            for b in buckets:
                stats.append(self.sender.broadcast(b))
                for t in b.tensors:
                    reporter.add(t.nbytes, t.name, True)
        except FleetError:
            if not failed_early.is_set():
                call.cancel()
                raise
        return stats

    def _finish(self, call: Any, method: str) -> admin_pb2.AdminResponse:
        try:
            resp = call.result()
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, method) from e
        return check_admin(resp, method)

    def receive_weights(self, named_tensors: NamedTensors, *,
                        weight_version: Optional[int] = None, flush_cache: Optional[bool] = None,
                        abort_all_requests: bool = False, keep_pause: bool = False,
                        bucket_bytes: Optional[int] = None, progress: Progress = None,
                        stage: bool = False, parent: Optional[NamedTensors] = None,
                        parent_version: Optional[int] = None,
                        manifest: Optional[dict[str, Any]] = None,
                        timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Pushes the tensors with one ReceiveWeights call (atomic, one version bump); with
        `stage`, staged instead (no pause; activate_weights serves them). With `parent` (the
        tensors of `parent_version`), a delta of it (the module docstring)."""
        _check_delta_args(parent, parent_version, weight_version, manifest)
        buckets = self._plan(named_tensors, bucket_bytes, parent)
        req = admin_pb2.ReceiveWeightsRequest(group_name=self.group_name,
                                              buckets=[b.to_proto() for b in buckets],
                                              abort_all_requests=abort_all_requests,
                                              keep_pause=keep_pause, stage=stage)
        if weight_version is not None:
            req.weight_version = weight_version
        if flush_cache is not None:
            req.flush_cache = flush_cache
        set_delta(req, parent_version, manifest)
        with Reporter(progress, "receive_weights", _sent_bytes(buckets)) as rep:
            call = self.client._unary_future("rl.v1.Admin", "ReceiveWeights", req,
                                             admin_pb2.AdminResponse,
                                             timeout or self.client.load_timeout)
            self._broadcast_all(buckets, call, "ReceiveWeights", rep)
            return self._finish(call, "ReceiveWeights")

    def prepare_and_complete(self, named_tensors: NamedTensors, *,
                             weight_version: Optional[int] = None,
                             flush_cache: Optional[bool] = None,
                             abort_all_requests: bool = False, keep_pause: bool = False,
                             bucket_bytes: Optional[int] = None, progress: Progress = None,
                             before_complete: Optional[Callable[[], None]] = None,
                             stage: bool = False, parent: Optional[NamedTensors] = None,
                             parent_version: Optional[int] = None,
                             manifest: Optional[dict[str, Any]] = None,
                             timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """The two-phase receive: PrepareWeightsUpdate (generation goes on), the broadcast,
        `before_complete()` if given (e.g. the trainer's own bookkeeping), then
        CompleteWeightsUpdate (a short pause: apply atomically, one version bump; with `stage`,
        no pause: the tensors become the staged version, served by activate_weights). With
        `parent` (the tensors of `parent_version`), a delta of it (the module docstring): a
        worker that does not serve the parent refuses at Prepare, before the broadcast."""
        _check_delta_args(parent, parent_version, weight_version, manifest)
        buckets = self._plan(named_tensors, bucket_bytes, parent)
        prep = self.client.prepare_weights_update(self.group_name, buckets,
                                                  parent_version=parent_version,
                                                  manifest=manifest, timeout=timeout)
        if not prep.ready:
            raise FleetError(grpc.StatusCode.FAILED_PRECONDITION,
                             "PrepareWeightsUpdate answered without ready", method="prepare",
                             response=prep)
        with Reporter(progress, "prepare_and_complete", _sent_bytes(buckets)) as rep:
            for b in buckets:
                self.sender.broadcast(b)
                for t in b.tensors:
                    rep.add(t.nbytes, t.name, True)
        if before_complete is not None:
            before_complete()
        return self.client.complete_weights_update(
            self.group_name, weight_version=weight_version, flush_cache=flush_cache,
            abort_all_requests=abort_all_requests, keep_pause=keep_pause, stage=stage,
            timeout=timeout)

    def send_delta(self, parent_tensors: NamedTensors, new_tensors: NamedTensors,
                   weight_version: int, parent_version: int, *, two_phase: bool = False,
                   stage: bool = False, manifest: Optional[dict[str, Any]] = None,
                   **kwargs: Any) -> admin_pb2.AdminResponse:
        """Sends `new_tensors` as a delta of `parent_tensors` (the weights of `parent_version`,
        which every worker must serve) over the group: one ReceiveWeights call, or with
        `two_phase` PrepareWeightsUpdate / CompleteWeightsUpdate (generation goes on while the
        payloads arrive). `stage`: staged for activate_weights (through the router all or none);
        `manifest` (manifest_of's dict of the new version): verified before it is applied or
        staged. Other keyword arguments go to receive_weights / prepare_and_complete. FleetError
        when refused (FAILED_PRECONDITION naming both versions for a parent not served)."""
        push = self.prepare_and_complete if two_phase else self.receive_weights
        return push(new_tensors, weight_version=weight_version, stage=stage,
                    parent=parent_tensors, parent_version=parent_version, manifest=manifest,
                    **kwargs)

    def update_weights_from_distributed(self, named_tensors: NamedTensors, *,
                                        weight_version: Optional[int] = None,
                                        abort_all_requests: bool = False,
                                        bucket_bytes: Optional[int] = None,
                                        progress: Progress = None,
                                        timeout: Optional[float] = None
                                        ) -> list[admin_pb2.AdminResponse]:
        """SGLang's per-bucket path: per bucket, one UpdateWeightsFromDistributed call while
        the bucket is broadcast; each applies as it arrives and bumps the version
        (`weight_version` is sent with the last bucket). Returns every bucket's answer."""
        buckets = self._plan(named_tensors, bucket_bytes)
        answers = []
        with Reporter(progress, "update_weights_from_distributed",
                      total_bytes(named_tensors)) as rep:
            for i, b in enumerate(buckets):
                last = i == len(buckets) - 1
                req = distributed_request(b.names, b.dtypes, b.shapes, self.group_name,
                                          weight_version if last else None, None,
                                          abort_all_requests)
                call = self.client._unary_future("rl.v1.Admin", "UpdateWeightsFromDistributed",
                                                 req, admin_pb2.AdminResponse,
                                                 timeout or self.client.load_timeout)
                self._broadcast_all([b], call, "UpdateWeightsFromDistributed", rep)
                answers.append(self._finish(call, "UpdateWeightsFromDistributed"))
        return answers

    # Close --------------------------------------------------------------------------------

    def close(self) -> None:
        """Destroys the group on the workers and stops the sender. Idempotent; a failing destroy
        is raised after the sender is closed."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.destroy_weights_update_group(self.group_name)
        finally:
            self.sender.close()

    def __enter__(self) -> "WeightsGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
