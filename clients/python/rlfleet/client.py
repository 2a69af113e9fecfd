"""Blocking and asyncio clients for rl-router / rl-worker.

Every call raises grpc.RpcError (grpc.aio.AioRpcError) on failure. `generate` returns a typed
GenerateResult (a list of them when sampling n > 1); `generate_stream` yields Chunk objects and
GenerateResult finals. Admin calls return the rl.v1 response messages.
"""

from __future__ import annotations

from typing import AsyncIterator, Iterator, Optional, Union

import grpc

from rlfleet._stubs import (admin_pb2, admin_pb2_grpc, router_pb2, router_pb2_grpc, worker_pb2,
                            worker_pb2_grpc)
from rlfleet.types import (Chunk, Episode, GenerateResult, Trajectory, build_generate_request,
                           chunk_from_proto)

_OPTIONS = [("grpc.max_receive_message_length", 512 << 20),
            ("grpc.max_send_message_length", 512 << 20)]
_PAUSE_MODES = {"abort": admin_pb2.PAUSE_MODE_ABORT, "in_place": admin_pb2.PAUSE_MODE_IN_PLACE,
                "retract": admin_pb2.PAUSE_MODE_RETRACT}


# The router's fair admission keys on this header (else on the connection's peer address).
CLIENT_ID_HEADER = "rl-client-id"
MAX_CLIENT_ID_BYTES = 128


def _metadata(api_key: Optional[str], client_id: Optional[str] = None):
    md = [("authorization", f"Bearer {api_key}")] if api_key else []
    if client_id:
        if not client_id.isascii() or not client_id.isprintable():
            raise ValueError(f"client_id: {client_id!r} must be printable ASCII")
        if len(client_id) > MAX_CLIENT_ID_BYTES:
            raise ValueError(f"client_id: {len(client_id)} bytes is more than "
                             f"{MAX_CLIENT_ID_BYTES}")
        md.append((CLIENT_ID_HEADER, client_id))
    return md


def _collect(messages) -> Union[GenerateResult, list[GenerateResult]]:
    finals = [GenerateResult.from_proto(m) for m in messages if m.HasField("final")]
    if not finals:
        raise RuntimeError("the generation stream ended without a final message")
    finals.sort(key=lambda r: r.index)
    return finals[0] if len(finals) == 1 else finals


def _update_request(path, weight_version, abort_all_requests, keep_pause, flush_cache):
    req = admin_pb2.UpdateWeightsFromDiskRequest(model_path=path,
                                                 abort_all_requests=abort_all_requests,
                                                 keep_pause=keep_pause)
    if weight_version is not None:
        req.weight_version = weight_version
    if flush_cache is not None:
        req.flush_cache = flush_cache
    return req


class Client:
    """Blocking client. `via="router"` (default) or `"worker"` picks the data-plane service.
    `client_id` (printable ASCII, at most 128 bytes) names this client to the router's fair
    admission (the `rl-client-id` header on every call); without it the router shares by
    connection, so clients behind one proxy or in one process share one queue."""

    def __init__(self, target: str, api_key: Optional[str] = None, timeout: float = 120.0,
                 via: str = "router", client_id: Optional[str] = None):
        self.channel = grpc.insecure_channel(target, options=_OPTIONS)
        self.metadata = _metadata(api_key, client_id)
        self.timeout = timeout
        self.via = via
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        self.router = router_pb2_grpc.RouterStub(self.channel)
        self.worker = worker_pb2_grpc.WorkerStub(self.channel)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_ready(self, timeout: float = 30.0):
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def _stub(self):
        return self.router if self.via == "router" else self.worker

    # Data plane ------------------------------------------------------------------------------
    def generate_stream(self, text=None, input_ids=None, **options) -> Iterator[Union[Chunk, GenerateResult]]:
        req = build_generate_request(text, input_ids, **options)
        for msg in self._stub().Generate(req, timeout=self.timeout, metadata=self.metadata):
            yield GenerateResult.from_proto(msg) if msg.HasField("final") else chunk_from_proto(msg)

    def generate(self, text=None, input_ids=None, **options):
        """Options: every GenerateRequest field (request_id, return_logprob, top_logprobs_num,
        logprob_start_len, logprobs_at_temperature_one, stream, return_trajectory,
        return_routed_experts, return_expert_weights, routed_experts_start_len) and every
        sampling field (`sampling=SamplingParams(...)` or keywords: max_new_tokens, ...)."""
        options.setdefault("stream", False)
        req = build_generate_request(text, input_ids, **options)
        return _collect(self._stub().Generate(req, timeout=self.timeout, metadata=self.metadata))

    def abort(self, request_id: Optional[str] = None, abort_all: bool = False) -> int:
        """Aborts one request by id (wherever it runs in the fleet, through the router) or every
        request (abort_all; needs the admin key when one is set). Returns the number aborted."""
        req = worker_pb2.AbortRequest(request_id=request_id or "", abort_all=abort_all)
        return self._stub().Abort(req, timeout=self.timeout, metadata=self.metadata).num_aborted

    def retrieve_from_text(self, text: str, tokenize_remainder: bool = False) -> Trajectory:
        r = self.router.RetrieveFromText(
            router_pb2.RetrieveFromTextRequest(text=text, tokenize_remainder=tokenize_remainder),
            timeout=self.timeout, metadata=self.metadata)
        return Trajectory.from_proto(r.trajectory)

    def get_episode(self, episode_id: str, remove: bool = False) -> Episode:
        """Router.GetEpisode: the agent episode's turns and one sample per branch (remove:
        forget it once exported). docs/episodes.md."""
        r = self.router.GetEpisode(
            router_pb2.GetEpisodeRequest(episode_id=episode_id, remove=remove),
            timeout=self.timeout, metadata=self.metadata)
        return Episode.from_proto(r)

    # Control plane ---------------------------------------------------------------------------
    def _admin(self, method, request):
        return getattr(self.admin, method)(request, timeout=self.timeout, metadata=self.metadata)

    def pause(self, mode: str = "retract"):
        return self._admin("PauseGeneration", admin_pb2.PauseGenerationRequest(mode=_PAUSE_MODES[mode]))

    def continue_generation(self):
        return self._admin("ContinueGeneration", admin_pb2.ContinueGenerationRequest())

    def flush_cache(self):
        return self._admin("FlushCache", admin_pb2.FlushCacheRequest())

    def update_weights_from_disk(self, path: str, weight_version: Optional[int] = None,
                                 abort_all_requests: bool = False, keep_pause: bool = False,
                                 flush_cache: Optional[bool] = None):
        return self._admin("UpdateWeightsFromDisk", _update_request(
            path, weight_version, abort_all_requests, keep_pause, flush_cache))

    def model_info(self):
        return self._admin("GetModelInfo", admin_pb2.GetModelInfoRequest())

    def server_info(self):
        return self._admin("GetServerInfo", admin_pb2.GetServerInfoRequest())

    def list_workers(self):
        return self.router.ListWorkers(router_pb2.ListWorkersRequest(), timeout=self.timeout,
                                       metadata=self.metadata)

    def metrics(self):
        return self.router.GetMetrics(router_pb2.GetMetricsRequest(), timeout=self.timeout,
                                      metadata=self.metadata)


class AsyncClient:
    """asyncio client (grpc.aio) with the same methods and options as Client, as coroutines."""

    def __init__(self, target: str, api_key: Optional[str] = None, timeout: float = 120.0,
                 via: str = "router", client_id: Optional[str] = None):
        self.channel = grpc.aio.insecure_channel(target, options=_OPTIONS)
        self.metadata = _metadata(api_key, client_id)
        self.timeout = timeout
        self.via = via
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        self.router = router_pb2_grpc.RouterStub(self.channel)
        self.worker = worker_pb2_grpc.WorkerStub(self.channel)

    async def close(self):
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _stub(self):
        return self.router if self.via == "router" else self.worker

    async def generate_stream(self, text=None, input_ids=None, **options) -> AsyncIterator[Union[Chunk, GenerateResult]]:
        req = build_generate_request(text, input_ids, **options)
        async for msg in self._stub().Generate(req, timeout=self.timeout, metadata=self.metadata):
            yield GenerateResult.from_proto(msg) if msg.HasField("final") else chunk_from_proto(msg)

    async def generate(self, text=None, input_ids=None, **options):
        options.setdefault("stream", False)
        req = build_generate_request(text, input_ids, **options)
        call = self._stub().Generate(req, timeout=self.timeout, metadata=self.metadata)
        return _collect([m async for m in call])

    async def abort(self, request_id: Optional[str] = None, abort_all: bool = False) -> int:
        req = worker_pb2.AbortRequest(request_id=request_id or "", abort_all=abort_all)
        r = await self._stub().Abort(req, timeout=self.timeout, metadata=self.metadata)
        return r.num_aborted

    async def retrieve_from_text(self, text: str, tokenize_remainder: bool = False) -> Trajectory:
        r = await self.router.RetrieveFromText(
            router_pb2.RetrieveFromTextRequest(text=text, tokenize_remainder=tokenize_remainder),
            timeout=self.timeout, metadata=self.metadata)
        return Trajectory.from_proto(r.trajectory)

    async def get_episode(self, episode_id: str, remove: bool = False) -> Episode:
        r = await self.router.GetEpisode(
            router_pb2.GetEpisodeRequest(episode_id=episode_id, remove=remove),
            timeout=self.timeout, metadata=self.metadata)
        return Episode.from_proto(r)

    async def _admin(self, method, request):
        return await getattr(self.admin, method)(request, timeout=self.timeout,
                                                 metadata=self.metadata)

    async def pause(self, mode: str = "retract"):
        return await self._admin("PauseGeneration",
                                 admin_pb2.PauseGenerationRequest(mode=_PAUSE_MODES[mode]))

    async def continue_generation(self):
        return await self._admin("ContinueGeneration", admin_pb2.ContinueGenerationRequest())

    async def flush_cache(self):
        return await self._admin("FlushCache", admin_pb2.FlushCacheRequest())

    async def update_weights_from_disk(self, path: str, weight_version: Optional[int] = None,
                                       abort_all_requests: bool = False, keep_pause: bool = False,
                                       flush_cache: Optional[bool] = None):
        return await self._admin("UpdateWeightsFromDisk", _update_request(
            path, weight_version, abort_all_requests, keep_pause, flush_cache))

    async def model_info(self):
        return await self._admin("GetModelInfo", admin_pb2.GetModelInfoRequest())

    async def server_info(self):
        return await self._admin("GetServerInfo", admin_pb2.GetServerInfoRequest())

    async def list_workers(self):
        return await self.router.ListWorkers(router_pb2.ListWorkersRequest(),
                                             timeout=self.timeout, metadata=self.metadata)

    async def metrics(self):
        return await self.router.GetMetrics(router_pb2.GetMetricsRequest(),
                                            timeout=self.timeout, metadata=self.metadata)
