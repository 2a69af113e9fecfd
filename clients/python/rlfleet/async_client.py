"""The asyncio client (grpc.aio): the same calls, arguments, results and errors as
rlfleet.Client, as coroutines (see client.py for each call's contract). Every failure raises
rlfleet.FleetError, `success=false` answers included.

Reading tensors for a push (disk reads, device-to-host copies) runs in worker threads
(asyncio.to_thread), one chunk at a time, so the event loop is not blocked by it.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional, Sequence, TypeVar, Union, cast

import grpc
from google.protobuf.message import Message

from rlfleet import _rpc
from rlfleet._progress import Progress, Reporter
from rlfleet._stubs import admin_pb2, generate_pb2, router_pb2, worker_pb2
from rlfleet.client import ADMIN, DEFAULT_LOAD_TIMEOUT, ROUTER, WORKER, _collect
from rlfleet.errors import FleetError
from rlfleet.publication import delta_messages
from rlfleet.tensors import DEFAULT_CHUNK_BYTES, NamedTensors, total_bytes
from rlfleet.types import (Chunk, Episode, GenerateResult, Generations, Trajectory,
                           build_generate_request, chunk_from_proto)
from rlfleet.weight_group import _check_delta_args, _sent_bytes, check_against_served
from rlfleet.weight_sync import (DEFAULT_BUCKET_BYTES, BroadcastStats, Bucket, TcpWeightSender,
                                 plan_buckets)

M = TypeVar("M", bound=Message)
_END = object()


class AsyncClient:
    """asyncio client with the same methods and options as Client, as coroutines."""

    def __init__(self, target: str, api_key: Optional[str] = None, timeout: float = 120.0,
                 via: str = "router", client_id: Optional[str] = None,
                 load_timeout: float = DEFAULT_LOAD_TIMEOUT) -> None:
        if via not in ("router", "worker"):
            raise ValueError(f"via: {via!r} is not 'router' or 'worker'")
        self.target = target
        self.metadata = tuple(_rpc.metadata(api_key, client_id))
        self.timeout = timeout
        self.load_timeout = load_timeout
        self.via = via
        self.channel = grpc.aio.insecure_channel(target, options=_rpc.OPTIONS)
        self._calls: dict[str, Any] = {}

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise FleetError(grpc.StatusCode.UNAVAILABLE,
                             f"{self.target} not reachable within {timeout:g} s") from None

    # Plumbing ---------------------------------------------------------------------------

    def _callable(self, kind: str, service: str, method: str, response_cls: type[Message],
                  serializer: Any = _rpc.serialize) -> Any:
        key = f"{kind}:{service}/{method}"
        fn = self._calls.get(key)
        if fn is None:
            fn = getattr(self.channel, kind)(_rpc.path(service, method),
                                             request_serializer=serializer,
                                             response_deserializer=response_cls.FromString)
            self._calls[key] = fn
        return fn

    async def _unary(self, service: str, method: str, request: Message, response_cls: type[M],
                     timeout: Optional[float] = None) -> M:
        fn = self._callable("unary_unary", service, method, response_cls)
        try:
            return cast(M, await fn(request, timeout=timeout or self.timeout,
                                    metadata=self.metadata))
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, method) from e

    async def _admin(self, method: str, request: Message, timeout: Optional[float] = None,
                     load: bool = False) -> admin_pb2.AdminResponse:
        t = timeout or (self.load_timeout if load else self.timeout)
        return _rpc.check_admin(await self._unary(ADMIN, method, request,
                                                  admin_pb2.AdminResponse, t), method)

    def _data_service(self) -> str:
        return ROUTER if self.via == "router" else WORKER

    # Data plane -------------------------------------------------------------------------

    async def generate_stream(self, text: Optional[str] = None,
                              input_ids: Optional[Sequence[int]] = None,
                              **options: Any) -> AsyncIterator[Union[Chunk, GenerateResult]]:
        req = build_generate_request(text, input_ids, **options)
        fn = self._callable("unary_stream", self._data_service(), "Generate",
                            generate_pb2.GenerateResponse)
        try:
            async for msg in fn(req, timeout=self.timeout, metadata=self.metadata):
                yield (GenerateResult.from_proto(msg) if msg.HasField("final")
                       else chunk_from_proto(msg))
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, "Generate") from e

    async def generate(self, text: Optional[str] = None,
                       input_ids: Optional[Sequence[int]] = None, **options: Any) -> Generations:
        options.setdefault("stream", False)
        req = build_generate_request(text, input_ids, **options)
        fn = self._callable("unary_stream", self._data_service(), "Generate",
                            generate_pb2.GenerateResponse)
        try:
            messages = [m async for m in fn(req, timeout=self.timeout, metadata=self.metadata)]
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, "Generate") from e
        return _collect(messages)

    async def resume(self, partial: Any, text: Optional[str] = None,
                     input_ids: Optional[Sequence[int]] = None, **options: Any) -> GenerateResult:
        """Client.resume as a coroutine."""
        if isinstance(partial, GenerateResult) and partial.finish_reason not in ("abort", "stale"):
            raise ValueError(f"resume: a {partial.finish_reason!r} sample is not resumable (only "
                             "aborted or stale ones are)")
        return (await self.generate(text, input_ids, resume_from=partial, **options)).one()

    async def abort(self, request_id: Optional[str] = None, abort_all: bool = False,
                    group_id: Optional[str] = None) -> int:
        req = worker_pb2.AbortRequest(request_id=request_id or "", abort_all=abort_all,
                                      group_id=group_id or "")
        r = await self._unary(self._data_service(), "Abort", req, worker_pb2.AbortResponse)
        return r.num_aborted

    async def retrieve_from_text(self, text: str, tokenize_remainder: bool = False) -> Trajectory:
        r = await self._unary(ROUTER, "RetrieveFromText",
                              router_pb2.RetrieveFromTextRequest(
                                  text=text, tokenize_remainder=tokenize_remainder),
                              router_pb2.RetrieveFromTextResponse)
        return Trajectory.from_proto(r.trajectory)

    async def get_episode(self, episode_id: str, remove: bool = False,
                          return_routed_experts: bool = False,
                          return_expert_weights: bool = False) -> Episode:
        r = await self._unary(ROUTER, "GetEpisode",
                              router_pb2.GetEpisodeRequest(
                                  episode_id=episode_id, remove=remove,
                                  return_routed_experts=return_routed_experts,
                                  return_expert_weights=return_expert_weights),
                              router_pb2.GetEpisodeResponse)
        return Episode.from_proto(r)

    async def get_load(self) -> worker_pb2.GetLoadResponse:
        return await self._unary(WORKER, "GetLoad", worker_pb2.GetLoadRequest(),
                                 worker_pb2.GetLoadResponse)

    # Pause, continue, flush -------------------------------------------------------------

    async def pause_generation(self, mode: str = "retract",
                               drain_timeout_ms: Optional[int] = None
                               ) -> admin_pb2.AdminResponse:
        req = _rpc.pause_request(mode, drain_timeout_ms)
        timeout = None if drain_timeout_ms is None else self.timeout + drain_timeout_ms / 1000
        if mode == "drain" and drain_timeout_ms is None:
            timeout = self.timeout + 60
        return await self._admin("PauseGeneration", req, timeout)

    pause = pause_generation

    async def continue_generation(self) -> admin_pb2.AdminResponse:
        return await self._admin("ContinueGeneration", admin_pb2.ContinueGenerationRequest())

    async def flush_cache(self) -> admin_pb2.AdminResponse:
        return await self._admin("FlushCache", admin_pb2.FlushCacheRequest())

    # Weights ----------------------------------------------------------------------------

    async def update_weights_from_disk(self, model_path: str,
                                       weight_version: Optional[int] = None,
                                       abort_all_requests: bool = False,
                                       keep_pause: bool = False,
                                       flush_cache: Optional[bool] = None,
                                       workers: Optional[Sequence[str]] = None,
                                       timeout: Optional[float] = None,
                                       keep_kv: bool = False
                                       ) -> admin_pb2.AdminResponse:
        req = _rpc.update_from_disk_request(model_path, weight_version, abort_all_requests,
                                            keep_pause, flush_cache, workers, keep_kv)
        return await self._admin("UpdateWeightsFromDisk", req, timeout, load=True)

    async def update_weights_from_tensor(self, named_tensors: NamedTensors, *,
                                         weight_version: Optional[int] = None,
                                         flush_cache: Optional[bool] = None,
                                         abort_all_requests: bool = False,
                                         keep_pause: bool = False, keep_kv: bool = False,
                                         chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                                         progress: Progress = None, stage: bool = False,
                                         timeout: Optional[float] = None
                                         ) -> admin_pb2.AdminResponse:
        with Reporter(progress, "update_weights_from_tensor", total_bytes(named_tensors)) as rep:
            source = await asyncio.to_thread(
                _rpc.StreamSource, named_tensors, rep, chunk_bytes, weight_version, flush_cache,
                abort_all_requests, keep_pause, keep_kv, stage)
            messages = source.messages()

            async def requests() -> AsyncIterator[bytes]:
                while True:
                    msg = await asyncio.to_thread(next, messages, _END)
                    if msg is _END:
                        return
                    yield cast(bytes, msg)

            fn = self._callable("stream_unary", ADMIN, "UpdateWeightsFromTensor",
                                admin_pb2.AdminResponse, _rpc.identity)
            try:
                resp = await fn(requests(), timeout=timeout or self.load_timeout,
                                metadata=self.metadata)
            except grpc.RpcError as e:
                if source.error is not None:
                    raise source.error from e
                raise FleetError.from_rpc_error(e, "UpdateWeightsFromTensor") from e
            except (Exception, asyncio.CancelledError):
                # grpc.aio cancels the call when the request iterator raises: report the
                # iterator's error; a cancellation of this task itself is re-raised.
                if source.error is not None:
                    raise source.error from None
                raise
        return _rpc.check_admin(resp, "UpdateWeightsFromTensor")

    # Staged refits (Client has the semantics) ----------------------------------------------

    async def stage_weights(self, model_path: str, weight_version: Optional[int] = None,
                            timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        return await self._admin("StageWeights", _rpc.stage_request(model_path, weight_version),
                                 timeout, load=True)

    async def activate_weights(self, weight_version: Optional[int] = None,
                               abort_all_requests: bool = False, keep_pause: bool = False,
                               keep_kv: bool = False,
                               timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        return await self._admin("ActivateWeights",
                                 _rpc.activate_request(weight_version, abort_all_requests,
                                                       keep_pause, keep_kv), timeout, load=True)

    async def drop_staged_weights(self,
                                  timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        return await self._admin("DropStagedWeights", admin_pb2.DropStagedWeightsRequest(),
                                 timeout)

    async def refit_weights(self, model_path: str, weight_version: Optional[int] = None,
                            abort_all_requests: bool = False, keep_pause: bool = False,
                            keep_kv: bool = False,
                            timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        return await self._admin("RefitWeights",
                                 _rpc.refit_request(model_path, weight_version,
                                                    abort_all_requests, keep_pause, keep_kv),
                                 timeout, load=True)

    async def push_weights(self, named_tensors: NamedTensors, *, stage: bool = False,
                           group: Optional["AsyncWeightsGroup"] = None,
                           weight_version: Optional[int] = None, progress: Progress = None,
                           timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        if group is not None:
            return await group.receive_weights(named_tensors, weight_version=weight_version,
                                               stage=stage, progress=progress, timeout=timeout)
        return await self.update_weights_from_tensor(named_tensors, weight_version=weight_version,
                                                     stage=stage, progress=progress,
                                                     timeout=timeout)

    async def push_delta(self, parent_tensors: NamedTensors, new_tensors: NamedTensors,
                         weight_version: int, parent_version: int, *, stage: bool = False,
                         manifest: Optional[dict[str, Any]] = None,
                         chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                         timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        messages = await asyncio.to_thread(
            delta_messages, parent_tensors, new_tensors, weight_version, parent_version,
            stage=stage, manifest=manifest, chunk_bytes=chunk_bytes)

        async def requests() -> AsyncIterator[bytes]:
            for m in messages:
                yield m

        fn = self._callable("stream_unary", ADMIN, "UpdateWeightsFromTensor",
                            admin_pb2.AdminResponse, _rpc.identity)
        try:
            resp = await fn(requests(), timeout=timeout or self.load_timeout,
                            metadata=self.metadata)
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, "UpdateWeightsFromTensor") from e
        return _rpc.check_admin(resp, "UpdateWeightsFromTensor")

    async def init_weights_update_group(self, master_address: str, master_port: int,
                                        rank_offset: int, world_size: int, group_name: str,
                                        backend: str = "auto", timeout_ms: Optional[int] = None,
                                        timeout: Optional[float] = None
                                        ) -> admin_pb2.AdminResponse:
        req = _rpc.group_request(master_address, master_port, rank_offset, world_size,
                                 group_name, backend, timeout_ms)
        return await self._admin("InitWeightsUpdateGroup", req, timeout, load=True)

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[Any],
                                              shapes: Sequence[Sequence[int]], group_name: str,
                                              weight_version: Optional[int] = None,
                                              flush_cache: Optional[bool] = None,
                                              abort_all_requests: bool = False,
                                              timeout: Optional[float] = None
                                              ) -> admin_pb2.AdminResponse:
        req = _rpc.distributed_request(names, dtypes, shapes, group_name, weight_version,
                                       flush_cache, abort_all_requests)
        return await self._admin("UpdateWeightsFromDistributed", req, timeout, load=True)

    async def prepare_weights_update(self, group_name: str, buckets: Sequence[Any],
                                     parent_version: Optional[int] = None,
                                     manifest: Optional[dict[str, Any]] = None,
                                     timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        req = admin_pb2.PrepareWeightsUpdateRequest(group_name=group_name,
                                                    buckets=_rpc.buckets_proto(buckets))
        _rpc.set_delta(req, parent_version, manifest)
        return await self._admin("PrepareWeightsUpdate", req, timeout, load=True)

    async def complete_weights_update(self, group_name: str,
                                      weight_version: Optional[int] = None,
                                      flush_cache: Optional[bool] = None,
                                      abort_all_requests: bool = False, keep_pause: bool = False,
                                      keep_kv: bool = False, stage: bool = False,
                                      timeout: Optional[float] = None
                                      ) -> admin_pb2.AdminResponse:
        req = admin_pb2.CompleteWeightsUpdateRequest(group_name=group_name,
                                                     abort_all_requests=abort_all_requests,
                                                     keep_pause=keep_pause, keep_kv=keep_kv,
                                              stage=stage)
        _rpc.set_optional(req, weight_version=weight_version, flush_cache=flush_cache)
        return await self._admin("CompleteWeightsUpdate", req, timeout, load=True)

    async def receive_weights(self, group_name: str, buckets: Sequence[Any],
                              weight_version: Optional[int] = None,
                              flush_cache: Optional[bool] = None,
                              abort_all_requests: bool = False, keep_pause: bool = False,
                              keep_kv: bool = False, stage: bool = False,
                              parent_version: Optional[int] = None,
                              manifest: Optional[dict[str, Any]] = None,
                              timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        req = admin_pb2.ReceiveWeightsRequest(group_name=group_name,
                                              buckets=_rpc.buckets_proto(buckets),
                                              abort_all_requests=abort_all_requests,
                                              keep_pause=keep_pause, keep_kv=keep_kv,
                                              stage=stage)
        _rpc.set_optional(req, weight_version=weight_version, flush_cache=flush_cache)
        _rpc.set_delta(req, parent_version, manifest)
        return await self._admin("ReceiveWeights", req, timeout, load=True)

    async def destroy_weights_update_group(self, group_name: str,
                                           timeout: Optional[float] = None
                                           ) -> admin_pb2.AdminResponse:
        return await self._admin(
            "DestroyWeightsUpdateGroup",
            admin_pb2.DestroyWeightsUpdateGroupRequest(group_name=group_name), timeout)

    async def open_weights_group(self, group_name: str = "rlfleet", *,
                                 master_address: str = "127.0.0.1",
                                 listen_host: Optional[str] = None, port: int = 0,
                                 world_size: Optional[int] = None, rank_offset: int = 1,
                                 timeout: float = 60.0,
                                 stall_timeout: Optional[float] = None) -> "AsyncWeightsGroup":
        """Client.open_weights_group for asyncio: an AsyncWeightsGroup (async with)."""
        if world_size is None:
            if self.via == "worker":
                world_size = 2
            else:
                live = [w for w in (await self.list_workers()).workers
                        if w.state == router_pb2.WORKER_STATE_LIVE]
                if not live:
                    raise FleetError(grpc.StatusCode.UNAVAILABLE,
                                     "no live worker to join a weight group",
                                     method="open_weights_group")
                world_size = 1 + len(live)
        sender = TcpWeightSender(group_name, world_size, host=listen_host or master_address,
                                 port=port, timeout=timeout, stall_timeout=stall_timeout)
        try:
            sender.start()
            await self.init_weights_update_group(master_address, sender.port, rank_offset,
                                                 world_size, group_name, backend="tcp",
                                                 timeout_ms=int(timeout * 1000))
            await asyncio.to_thread(sender.wait_for_receivers)
        except BaseException:
            sender.close()
            raise
        try:
            served: Optional[admin_pb2.ListWeightsResponse] = await self.list_weights()
        except FleetError as e:
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                sender.close()
                raise
            served = None  # asleep: the workers' own checks apply
        return AsyncWeightsGroup(self, sender, group_name, served)

    # Sleep and wake ---------------------------------------------------------------------

    async def release_memory(self, timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        return await self._admin("ReleaseMemory", admin_pb2.ReleaseMemoryRequest(), timeout,
                                 load=True)

    async def resume_memory(self, timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        return await self._admin("ResumeMemory", admin_pb2.ResumeMemoryRequest(), timeout,
                                 load=True)

    release_memory_occupation = release_memory
    resume_memory_occupation = resume_memory

    # Inspection -------------------------------------------------------------------------

    async def get_model_info(self) -> admin_pb2.GetModelInfoResponse:
        return await self._unary(ADMIN, "GetModelInfo", admin_pb2.GetModelInfoRequest(),
                                 admin_pb2.GetModelInfoResponse)

    model_info = get_model_info

    async def get_server_info(self) -> admin_pb2.GetServerInfoResponse:
        return await self._unary(ADMIN, "GetServerInfo", admin_pb2.GetServerInfoRequest(),
                                 admin_pb2.GetServerInfoResponse)

    server_info = get_server_info

    async def list_weights(self) -> admin_pb2.ListWeightsResponse:
        return await self._unary(ADMIN, "ListWeights", admin_pb2.ListWeightsRequest(),
                                 admin_pb2.ListWeightsResponse)

    async def weights_checker(self, action: str = "checksum"
                              ) -> admin_pb2.WeightsCheckerResponse:
        req = admin_pb2.WeightsCheckerRequest(
            action=_rpc.pick(_rpc.CHECKER_ACTIONS, action, "action"))
        return _rpc.check_checker(await self._unary(ADMIN, "WeightsChecker", req,
                                                    admin_pb2.WeightsCheckerResponse,
                                                    self.load_timeout))

    async def health_check(self, service: str = "") -> str:
        from grpc_health.v1 import health_pb2  # type: ignore[import-untyped]
        r = await self._unary("grpc.health.v1.Health", "Check",
                              health_pb2.HealthCheckRequest(service=service),
                              health_pb2.HealthCheckResponse)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))

    # Router: the worker pool ------------------------------------------------------------

    async def list_workers(self) -> router_pb2.WorkerListResponse:
        return await self._unary(ROUTER, "ListWorkers", router_pb2.ListWorkersRequest(),
                                 router_pb2.WorkerListResponse)

    async def add_worker(self, address: str) -> router_pb2.WorkerListResponse:
        return await self._unary(ROUTER, "AddWorker",
                                 router_pb2.AddWorkerRequest(address=address),
                                 router_pb2.WorkerListResponse)

    async def remove_worker(self, address: str) -> router_pb2.WorkerListResponse:
        return await self._unary(ROUTER, "RemoveWorker",
                                 router_pb2.RemoveWorkerRequest(address=address),
                                 router_pb2.WorkerListResponse)

    async def set_worker_enabled(self, address: str,
                                 enabled: bool) -> router_pb2.WorkerListResponse:
        return await self._unary(ROUTER, "SetWorkerEnabled",
                                 router_pb2.SetWorkerEnabledRequest(address=address,
                                                                    enabled=enabled),
                                 router_pb2.WorkerListResponse)

    async def enable_worker(self, address: str) -> router_pb2.WorkerListResponse:
        return await self.set_worker_enabled(address, True)

    async def disable_worker(self, address: str) -> router_pb2.WorkerListResponse:
        return await self.set_worker_enabled(address, False)

    async def resync_workers(self, workers: Sequence[str], model_path: str,
                             weight_version: Optional[int] = None,
                             timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        if not workers:
            raise ValueError("resync_workers: no workers named")
        return await self.update_weights_from_disk(model_path, weight_version=weight_version,
                                                   workers=workers, timeout=timeout)

    async def stale_workers(self) -> list[str]:
        return [w.address for w in (await self.list_workers()).workers
                if w.state == router_pb2.WORKER_STATE_STALE]

    async def recover_stale_workers(self, *, from_disk: Optional[str] = None,
                                    weight_version: Optional[int] = None
                                    ) -> Optional[admin_pb2.AdminResponse]:
        """Client.recover_stale_workers."""
        stale = await self.stale_workers()
        if not stale:
            return None
        if from_disk is None:
            raise FleetError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"workers {stale} are STALE after an in-memory update; resync them "
                             "from a checkpoint of the fleet's weights "
                             "(recover_stale_workers(from_disk=DIR)): no live worker serves the "
                             "fleet's version to catch them up from",
                             method="recover_stale_workers")
        return await self.resync_workers(stale, from_disk, weight_version=weight_version)

    async def get_metrics(self) -> router_pb2.GetMetricsResponse:
        return await self._unary(ROUTER, "GetMetrics", router_pb2.GetMetricsRequest(),
                                 router_pb2.GetMetricsResponse)

    metrics = get_metrics


class AsyncWeightsGroup:
    """rlfleet.WeightsGroup for asyncio: the same pushes as coroutines (the sender's socket
    work runs in a thread)."""

    def __init__(self, client: AsyncClient, sender: TcpWeightSender, group_name: str,
                 served: Optional[admin_pb2.ListWeightsResponse],
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.client = client
        self.sender = sender
        self.group_name = group_name
        self.bucket_bytes = bucket_bytes
        self._served = served
        self._closed = False

    async def _plan(self, named_tensors: NamedTensors, bucket_bytes: Optional[int],
                    parent: Optional[NamedTensors] = None) -> list[Bucket]:
        from rlfleet.tensors import iter_named_tensors
        tensors = await asyncio.to_thread(lambda: list(iter_named_tensors(named_tensors)))
        if not tensors:
            raise ValueError("named_tensors is empty: nothing to update")
        if self._served is not None:
            check_against_served(tensors, self._served)
        if parent is not None:
            from rlfleet.publication import delta_tensors
            pairs = [(t.name, t) for t in tensors]
            tensors = await asyncio.to_thread(delta_tensors, parent, pairs)
            if not tensors:
                raise ValueError("no tensor differs from the parent's: nothing to update")
        return plan_buckets(tensors, bucket_bytes or self.bucket_bytes)

    async def _push(self, buckets: Sequence[Bucket], call: "asyncio.Task[Any]",
                    reporter: Reporter) -> list[BroadcastStats]:
        def on_done(task: "asyncio.Task[Any]") -> None:
            if not task.cancelled() and task.exception() is not None:
                self.sender.close()

        call.add_done_callback(on_done)
        stats = []
        try:
            for b in buckets:
                stats.append(await asyncio.to_thread(self.sender.broadcast, b))
                for t in b.tensors:
                    reporter.add(t.nbytes, t.name, True)
        except FleetError:
            if not call.done():
                call.cancel()
                raise
        return stats

    async def receive_weights(self, named_tensors: NamedTensors, *,
                              weight_version: Optional[int] = None,
                              flush_cache: Optional[bool] = None,
                              abort_all_requests: bool = False, keep_pause: bool = False,
                              bucket_bytes: Optional[int] = None, progress: Progress = None,
                              stage: bool = False, parent: Optional[NamedTensors] = None,
                              parent_version: Optional[int] = None,
                              manifest: Optional[dict[str, Any]] = None,
                              timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        _check_delta_args(parent, parent_version, weight_version, manifest)
        buckets = await self._plan(named_tensors, bucket_bytes, parent)
        with Reporter(progress, "receive_weights", _sent_bytes(buckets)) as rep:
            call = asyncio.ensure_future(self.client.receive_weights(
                self.group_name, buckets, weight_version=weight_version, flush_cache=flush_cache,
                abort_all_requests=abort_all_requests, keep_pause=keep_pause, stage=stage,
                parent_version=parent_version, manifest=manifest, timeout=timeout))
            await self._push(buckets, call, rep)
            return await call

    async def prepare_and_complete(self, named_tensors: NamedTensors, *,
                                   weight_version: Optional[int] = None,
                                   flush_cache: Optional[bool] = None,
                                   abort_all_requests: bool = False, keep_pause: bool = False,
                                   bucket_bytes: Optional[int] = None, progress: Progress = None,
                                   stage: bool = False, parent: Optional[NamedTensors] = None,
                                   parent_version: Optional[int] = None,
                                   manifest: Optional[dict[str, Any]] = None,
                                   timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        _check_delta_args(parent, parent_version, weight_version, manifest)
        buckets = await self._plan(named_tensors, bucket_bytes, parent)
        prep = await self.client.prepare_weights_update(self.group_name, buckets,
                                                        parent_version=parent_version,
                                                        manifest=manifest, timeout=timeout)
        if not prep.ready:
            raise FleetError(grpc.StatusCode.FAILED_PRECONDITION,
                             "PrepareWeightsUpdate answered without ready", method="prepare",
                             response=prep)
        with Reporter(progress, "prepare_and_complete", _sent_bytes(buckets)) as rep:
            for b in buckets:
                await asyncio.to_thread(self.sender.broadcast, b)
                for t in b.tensors:
                    rep.add(t.nbytes, t.name, True)
        return await self.client.complete_weights_update(
            self.group_name, weight_version=weight_version, flush_cache=flush_cache,
            abort_all_requests=abort_all_requests, keep_pause=keep_pause, stage=stage,
            timeout=timeout)

    async def send_delta(self, parent_tensors: NamedTensors, new_tensors: NamedTensors,
                         weight_version: int, parent_version: int, *, two_phase: bool = False,
                         stage: bool = False, manifest: Optional[dict[str, Any]] = None,
                         **kwargs: Any) -> admin_pb2.AdminResponse:
        """WeightsGroup.send_delta for asyncio."""
        push = self.prepare_and_complete if two_phase else self.receive_weights
        return await push(new_tensors, weight_version=weight_version, stage=stage,
                          parent=parent_tensors, parent_version=parent_version,
                          manifest=manifest, **kwargs)

    async def update_weights_from_distributed(self, named_tensors: NamedTensors, *,
                                              weight_version: Optional[int] = None,
                                              abort_all_requests: bool = False,
                                              bucket_bytes: Optional[int] = None,
                                              progress: Progress = None,
                                              timeout: Optional[float] = None
                                              ) -> list[admin_pb2.AdminResponse]:
        buckets = await self._plan(named_tensors, bucket_bytes)
        answers = []
        with Reporter(progress, "update_weights_from_distributed",
                      total_bytes(named_tensors)) as rep:
            for i, b in enumerate(buckets):
                last = i == len(buckets) - 1
                call = asyncio.ensure_future(self.client.update_weights_from_distributed(
                    b.names, b.dtypes, b.shapes, self.group_name,
                    weight_version=weight_version if last else None,
                    abort_all_requests=abort_all_requests, timeout=timeout))
                await self._push([b], call, rep)
                answers.append(await call)
        return answers

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.client.destroy_weights_update_group(self.group_name)
        finally:
            await asyncio.to_thread(self.sender.close)

    async def __aenter__(self) -> "AsyncWeightsGroup":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
