"""The blocking client of rl-router / rl-worker: every rl.v1 Router, Worker and Admin call, and
the health check, as typed methods named after SGLang's engine API where one exists
(`update_weights_from_tensor`, `init_weights_update_group`, `release_memory`, ...) and after our
protos elsewhere. The asyncio twin is rlfleet.AsyncClient (same methods, as coroutines).

Every call raises rlfleet.FleetError on failure: a gRPC error, and also an admin answer with
`success=false` (through the router: any worker failed; `FleetError.results` lists every
worker's outcome). A trainer that does not check never trains against weights that were not
loaded. Calls return the rl.v1 response messages (typed: rlfleet.proto) or plain values.

Timeouts: `timeout` (120 s) bounds ordinary calls; `load_timeout` (30 min) the calls that load
or move weights, join groups and sleep / wake; every method takes `timeout=` to override.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence, TypeVar, Union, cast

import grpc
from google.protobuf.message import Message

from rlfleet import _rpc
from rlfleet._progress import Progress, Reporter
from rlfleet._rpc import CLIENT_ID_HEADER, MAX_CLIENT_ID_BYTES  # noqa: F401  (re-exported)
from rlfleet._stubs import admin_pb2, generate_pb2, router_pb2, worker_pb2
from rlfleet.errors import FleetError
from rlfleet.publication import delta_messages
from rlfleet.tensors import DEFAULT_CHUNK_BYTES, NamedTensors, total_bytes
from rlfleet.types import (Chunk, Episode, GenerateResult, Generations, Trajectory,
                           build_generate_request, chunk_from_proto)

if TYPE_CHECKING:
    from rlfleet.weight_group import WeightsGroup

M = TypeVar("M", bound=Message)

ADMIN = "rl.v1.Admin"
ROUTER = "rl.v1.Router"
WORKER = "rl.v1.Worker"
DEFAULT_LOAD_TIMEOUT = 1800.0


class Client:
    """Blocking client of a router (`via="router"`, the default) or one worker
    (`via="worker"`: the data-plane calls go to rl.v1.Worker; Router-only calls then fail
    UNIMPLEMENTED). Admin calls go to whichever process `target` is: through the router they
    reach every live worker. `api_key` is sent as `authorization: Bearer KEY` (the admin key of
    Admin calls and abort_all). `client_id` (printable ASCII, at most 128 bytes) names this
    client to the router's fair admission (the `rl-client-id` header on every call); without it
    the router shares by connection. Thread-safe: one channel, shared by all calls."""

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
        self.channel = grpc.insecure_channel(target, options=_rpc.OPTIONS)
        self._calls: dict[str, Any] = {}
        self._calls_lock = threading.Lock()

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the channel is connected (FleetError UNAVAILABLE after `timeout`)."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise FleetError(grpc.StatusCode.UNAVAILABLE,
                             f"{self.target} not reachable within {timeout:g} s") from None

    # Plumbing ---------------------------------------------------------------------------

    def _callable(self, kind: str, service: str, method: str, response_cls: type[Message],
                  serializer: Any = _rpc.serialize) -> Any:
        key = f"{kind}:{service}/{method}"
        fn = self._calls.get(key)
        if fn is None:
            with self._calls_lock:
                make = getattr(self.channel, kind)
                fn = make(_rpc.path(service, method), request_serializer=serializer,
                          response_deserializer=response_cls.FromString)
                self._calls[key] = fn
        return fn

    def _unary(self, service: str, method: str, request: Message, response_cls: type[M],
               timeout: Optional[float] = None) -> M:
        fn = self._callable("unary_unary", service, method, response_cls)
        try:
            return cast(M, fn(request, timeout=timeout or self.timeout, metadata=self.metadata))
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, method) from e

    def _unary_future(self, service: str, method: str, request: Message,
                      response_cls: type[Message], timeout: Optional[float] = None) -> Any:
        fn = self._callable("unary_unary", service, method, response_cls)
        return fn.future(request, timeout=timeout or self.timeout, metadata=self.metadata)

    def _admin(self, method: str, request: Message, timeout: Optional[float] = None,
               load: bool = False) -> admin_pb2.AdminResponse:
        t = timeout or (self.load_timeout if load else self.timeout)
        return _rpc.check_admin(self._unary(ADMIN, method, request, admin_pb2.AdminResponse, t),
                                method)

    def _data_service(self) -> str:
        return ROUTER if self.via == "router" else WORKER

    # Data plane -------------------------------------------------------------------------

    def generate_stream(self, text: Optional[str] = None,
                        input_ids: Optional[Sequence[int]] = None,
                        **options: Any) -> Iterator[Union[Chunk, GenerateResult]]:
        """Streams a generation: Chunk objects (incremental tokens, text, logprobs; `index` the
        sample for n > 1), then one GenerateResult per sample. Options as `generate`."""
        req = build_generate_request(text, input_ids, **options)
        fn = self._callable("unary_stream", self._data_service(), "Generate",
                            generate_pb2.GenerateResponse)
        try:
            for msg in fn(req, timeout=self.timeout, metadata=self.metadata):
                yield (GenerateResult.from_proto(msg) if msg.HasField("final")
                       else chunk_from_proto(msg))
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, "Generate") from e

    def generate(self, text: Optional[str] = None, input_ids: Optional[Sequence[int]] = None,
                 **options: Any) -> Generations:
        """Generates from a text or token-id prompt and returns the samples (Generations: a
        list ordered by sample index; `.one()` for the single sample of n = 1).

        Options: every GenerateRequest field (request_id, return_logprob, top_logprobs_num,
        logprob_start_len, logprobs_at_temperature_one, stream, return_trajectory,
        return_routed_experts, return_expert_weights, routed_experts_start_len,
        min_weight_version, exact_weight_version, max_version_lag, resume_from; routing_key,
        group_id, episode_id for the router) and every
        sampling field (`sampling=SamplingParams(...)` or keywords: max_new_tokens,
        temperature, top_p, top_k, min_p, seed, n, stop, stop_token_ids, ignore_eos, ...)."""
        options.setdefault("stream", False)
        req = build_generate_request(text, input_ids, **options)
        fn = self._callable("unary_stream", self._data_service(), "Generate",
                            generate_pb2.GenerateResponse)
        try:
            messages = list(fn(req, timeout=self.timeout, metadata=self.metadata))
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, "Generate") from e
        return _collect(messages)

    def resume(self, partial: Any, text: Optional[str] = None,
               input_ids: Optional[Sequence[int]] = None, **options: Any) -> GenerateResult:
        """Continues an aborted or stale sample within its original budget and returns the
        whole sample (earlier tokens first; `resumed_tokens` says how many): `partial` is the
        request id the router keeps (no prompt), or the earlier GenerateResult with the
        original prompt and sampling (max_new_tokens the ORIGINAL budget). Raises FleetError
        on refusal: INVALID_ARGUMENT when nothing is left of the budget or prompt + earlier
        output + the rest exceeds the context, NOT_FOUND for an id the router does not keep."""
        if isinstance(partial, GenerateResult) and partial.finish_reason not in ("abort", "stale"):
            raise ValueError(f"resume: a {partial.finish_reason!r} sample is not resumable (only "
                             "aborted or stale ones are)")
        return self.generate(text, input_ids, resume_from=partial, **options).one()

    def abort(self, request_id: Optional[str] = None, abort_all: bool = False,
              group_id: Optional[str] = None) -> int:
        """Aborts one request by id (wherever it runs in the fleet, through the router), every
        request of a GRPO group (group_id, router only: their finals carry what they
        generated), or every request (abort_all; needs the admin key when one is set). Returns
        the number aborted; FleetError NOT_FOUND for an id not in flight (router)."""
        req = worker_pb2.AbortRequest(request_id=request_id or "", abort_all=abort_all,
                                      group_id=group_id or "")
        return self._unary(self._data_service(), "Abort", req, worker_pb2.AbortResponse).num_aborted

    def retrieve_from_text(self, text: str, tokenize_remainder: bool = False) -> Trajectory:
        """The router's cached trajectory for `text`: tokens, loss mask, rollout logprobs and
        per-token weight versions (Router.RetrieveFromText)."""
        r = self._unary(ROUTER, "RetrieveFromText",
                        router_pb2.RetrieveFromTextRequest(text=text,
                                                           tokenize_remainder=tokenize_remainder),
                        router_pb2.RetrieveFromTextResponse)
        return Trajectory.from_proto(r.trajectory)

    def get_episode(self, episode_id: str, remove: bool = False,
                    return_routed_experts: bool = False,
                    return_expert_weights: bool = False) -> Episode:
        """Router.GetEpisode: the agent episode's turns and one sample per branch (remove:
        forget it once exported). FleetError NOT_FOUND for an unknown episode. R3: with
        return_routed_experts each sample carries its branch's routed experts (and with
        return_expert_weights their weights); FAILED_PRECONDITION naming the turn when a turn of
        a branch was recorded without routing. docs/episodes.md."""
        r = self._unary(ROUTER, "GetEpisode",
                        router_pb2.GetEpisodeRequest(
                            episode_id=episode_id, remove=remove,
                            return_routed_experts=return_routed_experts,
                            return_expert_weights=return_expert_weights),
                        router_pb2.GetEpisodeResponse)
        return Episode.from_proto(r)

    def get_load(self) -> worker_pb2.GetLoadResponse:
        """A worker's load (Worker.GetLoad; `via="worker"` clients)."""
        return self._unary(WORKER, "GetLoad", worker_pb2.GetLoadRequest(),
                           worker_pb2.GetLoadResponse)

    # Pause, continue, flush -------------------------------------------------------------

    def pause_generation(self, mode: str = "retract",
                         drain_timeout_ms: Optional[int] = None) -> admin_pb2.AdminResponse:
        """Pauses scheduling: "abort" (every request ends now, finish reason abort),
        "in_place" (running requests keep their KV), "retract" (running requests go back to
        waiting, their KV freed; resumed from where they were) or "drain" (running and queued
        requests finish, new ones wait for the continue; returns once drained, or after
        `drain_timeout_ms` (server default 60000) with `drained` false and what still runs in
        `num_still_active` / `still_active_ids`; `num_held`: arrivals waiting)."""
        req = _rpc.pause_request(mode, drain_timeout_ms)
        timeout = None if drain_timeout_ms is None else self.timeout + drain_timeout_ms / 1000
        if mode == "drain" and drain_timeout_ms is None:
            timeout = self.timeout + 60
        return self._admin("PauseGeneration", req, timeout)

    pause = pause_generation

    def continue_generation(self) -> admin_pb2.AdminResponse:
        """Resumes scheduling after a pause."""
        return self._admin("ContinueGeneration", admin_pb2.ContinueGenerationRequest())

    def flush_cache(self) -> admin_pb2.AdminResponse:
        """Empties the prefix cache and KV pool (FAILED_PRECONDITION while requests are active,
        unless paused with retract)."""
        return self._admin("FlushCache", admin_pb2.FlushCacheRequest())

    # Weights from disk and from memory --------------------------------------------------

    def update_weights_from_disk(self, model_path: str, weight_version: Optional[int] = None,
                                 abort_all_requests: bool = False, keep_pause: bool = False,
                                 flush_cache: Optional[bool] = None,
                                 workers: Optional[Sequence[str]] = None,
                                 timeout: Optional[float] = None,
                                 keep_kv: bool = False) -> admin_pb2.AdminResponse:
        """Loads a checkpoint folder (config.json + *.safetensors of the served architecture):
        pause → load → atomic swap → flush → version = `weight_version` (default current+1)
        → resume unless `keep_pause`. Refused while requests are active unless
        `abort_all_requests` or paused with retract; a failed load leaves the old weights
        serving. `workers` (router only): only those workers, the resync call (see
        resync_workers). `keep_kv`: an in-flight update, the running requests keep their KV
        (computed by the old weights) and go on decoding with the new ones, no retract or
        recompute; their results say kv_from_older_version (docs/weight-updates.md)."""
        req = _rpc.update_from_disk_request(model_path, weight_version, abort_all_requests,
                                            keep_pause, flush_cache, workers, keep_kv)
        return self._admin("UpdateWeightsFromDisk", req, timeout, load=True)

    def update_weights_from_tensor(self, named_tensors: NamedTensors, *,
                                   weight_version: Optional[int] = None,
                                   flush_cache: Optional[bool] = None,
                                   abort_all_requests: bool = False, keep_pause: bool = False,
                                   keep_kv: bool = False,
                                   chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                                   progress: Progress = None, stage: bool = False,
                                   timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Pushes in-memory tensors to the fleet over the tensor stream (SGLang's
        update_weights_from_tensor): every tensor travels in chunks of at most `chunk_bytes`
        and the update is applied atomically when the stream ends (through the router: on
        every live worker; a worker that fails is left out of routing, see FleetError.results).

        `named_tensors`: (name, tensor) pairs, a mapping, a safetensors handle or
        rlfleet.read_safetensors(...); a tensor is a NumPy array (float32, float16,
        ml_dtypes bfloat16), a torch tensor (CPU or CUDA; float32, float16, bfloat16) or
        WeightTensor(values, "BF16") for raw values. Names and shapes must be the served
        model's (list_weights()); the dtype may differ (the worker converts).
        Memory: about one chunk beyond the caller's tensors. `progress`: True for a bar on
        stderr, or a callable taking rlfleet.PushProgress. `stage`: stage instead of apply
        (served once activate_weights is called; abort_all_requests / keep_pause then belong to
        activate_weights); through the router all or none."""
        with Reporter(progress, "update_weights_from_tensor", total_bytes(named_tensors)) as rep:
            source = _rpc.StreamSource(named_tensors, rep, chunk_bytes, weight_version,
                                       flush_cache, abort_all_requests, keep_pause, keep_kv, stage)
            fn = self._callable("stream_unary", ADMIN, "UpdateWeightsFromTensor",
                                admin_pb2.AdminResponse, _rpc.identity)
            try:
                resp = fn(source.messages(), timeout=timeout or self.load_timeout,
                          metadata=self.metadata)
            except grpc.RpcError as e:
                if source.error is not None:
                    raise source.error from e
                raise FleetError.from_rpc_error(e, "UpdateWeightsFromTensor") from e
        return _rpc.check_admin(resp, "UpdateWeightsFromTensor")

    # Staged refits (issue 30: stage while serving, then a short activate) ------------------

    def stage_weights(self, model_path: str, weight_version: Optional[int] = None,
                      timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Reads a checkpoint folder into host memory the worker owns while it keeps serving the
        old weights; one staged version per worker (this replaces a staged one). It serves as
        `weight_version` (default current + 1) once activate_weights is called. A stage that
        fails or is cut leaves nothing staged. Through the router: on every live worker."""
        return self._admin("StageWeights", _rpc.stage_request(model_path, weight_version),
                           timeout, load=True)

    def activate_weights(self, weight_version: Optional[int] = None,
                         abort_all_requests: bool = False, keep_pause: bool = False,
                         keep_kv: bool = False,
                         timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Serves the staged version (from disk, a staged tensor push or a staged group
        receive): the pause is the swap and the prefix-cache flush; running requests are
        retracted and go on with the new weights (or aborted with abort_all_requests).
        `weight_version`, when given, must be the staged one. Through the router: all or none
        (every live worker must have the same version staged). `keep_kv`: an in-flight update,
        the running requests keep their KV (no recompute)."""
        return self._admin("ActivateWeights",
                           _rpc.activate_request(weight_version, abort_all_requests, keep_pause,
                                                 keep_kv),
                           timeout, load=True)

    def drop_staged_weights(self, timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Frees the staged version (OK when there is none)."""
        return self._admin("DropStagedWeights", admin_pb2.DropStagedWeightsRequest(), timeout)

    def refit_weights(self, model_path: str, weight_version: Optional[int] = None,
                      abort_all_requests: bool = False, keep_pause: bool = False,
                      keep_kv: bool = False,
                      timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Router only: the transactional fleet refit from a checkpoint folder. Stages on every
        live worker, then activates them all; if any fails to stage none activates, the staged
        copies are dropped and the fleet keeps its version (FleetError with each worker's
        reason). For in-memory tensors: push_weights(..., stage=True), then activate_weights."""
        return self._admin("RefitWeights",
                           _rpc.refit_request(model_path, weight_version, abort_all_requests,
                                              keep_pause, keep_kv), timeout, load=True)

    def push_weights(self, named_tensors: NamedTensors, *, stage: bool = False,
                     group: Optional["WeightsGroup"] = None,
                     weight_version: Optional[int] = None, progress: Progress = None,
                     timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Pushes in-memory tensors over the tensor stream (default) or over an open tcp
        `group` (open_weights_group; one ReceiveWeights call). With `stage`, the workers stage
        them while serving (nothing changes until activate_weights; through the router all or
        none: when one worker refuses, the others drop theirs and FleetError says why);
        without, they apply at once (one version bump)."""
        if group is not None:
            return group.receive_weights(named_tensors, weight_version=weight_version,
                                         stage=stage, progress=progress, timeout=timeout)
        return self.update_weights_from_tensor(named_tensors, weight_version=weight_version,
                                               stage=stage, progress=progress, timeout=timeout)

    def push_delta(self, parent_tensors: NamedTensors, new_tensors: NamedTensors,
                   weight_version: int, parent_version: int, *, stage: bool = False,
                   manifest: Optional[dict[str, Any]] = None,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   group: Optional["WeightsGroup"] = None,
                   timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Pushes `new_tensors` as a delta of `parent_tensors` (the weights of `parent_version`,
        which every worker must serve) over the tensor stream (issue 30): only the changed words
        travel (rlfleet.publication.delta_messages). The workers apply each payload to a copy of
        their weights, refuse NaN / Inf, verify the result against `manifest` when given
        (manifest_of's dict), then apply it as `weight_version` or, with `stage`, stage it for
        activate_weights (through the router: all or none). A worker not at `parent_version`
        refuses (FAILED_PRECONDITION naming both versions): FleetError. With `group` (an open
        tcp group), over the group instead: WeightsGroup.send_delta (one ReceiveWeights call)."""
        if group is not None:
            return group.send_delta(parent_tensors, new_tensors, weight_version, parent_version,
                                    stage=stage, manifest=manifest, timeout=timeout)
        messages = delta_messages(parent_tensors, new_tensors, weight_version, parent_version,
                                  stage=stage, manifest=manifest, chunk_bytes=chunk_bytes)
        fn = self._callable("stream_unary", ADMIN, "UpdateWeightsFromTensor",
                            admin_pb2.AdminResponse, _rpc.identity)
        try:
            resp = fn(iter(messages), timeout=timeout or self.load_timeout,
                      metadata=self.metadata)
        except grpc.RpcError as e:
            raise FleetError.from_rpc_error(e, "UpdateWeightsFromTensor") from e
        return _rpc.check_admin(resp, "UpdateWeightsFromTensor")

    # Weight-update groups ---------------------------------------------------------------

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                  world_size: int, group_name: str, backend: str = "auto",
                                  timeout_ms: Optional[int] = None,
                                  timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Makes the workers join a weight-update group whose rank 0 (the trainer's sender)
        listens on master_address:master_port. Through the router, the i-th live worker (by
        address) joins as rank `rank_offset + i`. `backend`: "tcp", "nccl" or "auto" (nccl
        when the worker has a GPU, else tcp). Returns once every worker joined, so the sender
        must accept meanwhile (open_weights_group does both)."""
        req = _rpc.group_request(master_address, master_port, rank_offset, world_size,
                                 group_name, backend, timeout_ms)
        return self._admin("InitWeightsUpdateGroup", req, timeout, load=True)

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[Any],
                                        shapes: Sequence[Sequence[int]], group_name: str,
                                        weight_version: Optional[int] = None,
                                        flush_cache: Optional[bool] = None,
                                        abort_all_requests: bool = False,
                                        timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Receives one bucket that rank 0 broadcasts on the group and applies it (each call
        bumps the version; a failure leaves the engine paused with partial weights). Returns
        once the bucket is applied, so the broadcast must run meanwhile. dtypes: "F32"/"BF16"/
        "F16" or NumPy / torch spellings."""
        req = _rpc.distributed_request(names, dtypes, shapes, group_name, weight_version,
                                       flush_cache, abort_all_requests)
        return self._admin("UpdateWeightsFromDistributed", req, timeout, load=True)

    def prepare_weights_update(self, group_name: str, buckets: Sequence[Any],
                               parent_version: Optional[int] = None,
                               manifest: Optional[dict[str, Any]] = None,
                               timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Two-phase receive, first half: checks the listed tensors and posts the receive of
        every bucket (Bucket objects from rlfleet.plan_buckets, WeightBucket messages or
        (names, dtypes, shapes) triples); `ready` is true once every worker listens, then the
        trainer broadcasts. Generation goes on meanwhile. `parent_version`: a delta receive
        (buckets naming encodings, e.g. of rlfleet.publication.delta_tensors), verified against
        `manifest` when given (issue 30)."""
        req = admin_pb2.PrepareWeightsUpdateRequest(group_name=group_name,
                                                    buckets=_rpc.buckets_proto(buckets))
        _rpc.set_delta(req, parent_version, manifest)
        return self._admin("PrepareWeightsUpdate", req, timeout, load=True)

    def complete_weights_update(self, group_name: str, weight_version: Optional[int] = None,
                                flush_cache: Optional[bool] = None,
                                abort_all_requests: bool = False, keep_pause: bool = False,
                                keep_kv: bool = False, stage: bool = False,
                                timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Two-phase receive, second half: waits for the data, then pause (retract) → apply
        every tensor atomically → flush → bump → resume unless keep_pause. `stage`: keep the
        received tensors as the staged version instead (no pause; activate_weights serves it)."""
        req = admin_pb2.CompleteWeightsUpdateRequest(group_name=group_name,
                                                     abort_all_requests=abort_all_requests,
                                                     keep_pause=keep_pause, keep_kv=keep_kv,
                                              stage=stage)
        _rpc.set_optional(req, weight_version=weight_version, flush_cache=flush_cache)
        return self._admin("CompleteWeightsUpdate", req, timeout, load=True)

    def receive_weights(self, group_name: str, buckets: Sequence[Any],
                        weight_version: Optional[int] = None,
                        flush_cache: Optional[bool] = None, abort_all_requests: bool = False,
                        keep_pause: bool = False, keep_kv: bool = False, stage: bool = False,
                        parent_version: Optional[int] = None,
                        manifest: Optional[dict[str, Any]] = None,
                        timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Single-call receive: pause (retract) → receive every listed bucket → apply atomically
        → flush → bump → resume unless keep_pause. The broadcast runs while the call waits.
        `stage`: receive without pausing and keep the tensors as the staged version
        (activate_weights serves it). `parent_version` / `manifest`: a delta receive, as for
        prepare_weights_update."""
        req = admin_pb2.ReceiveWeightsRequest(group_name=group_name,
                                              buckets=_rpc.buckets_proto(buckets),
                                              abort_all_requests=abort_all_requests,
                                              keep_pause=keep_pause, keep_kv=keep_kv,
                                              stage=stage)
        _rpc.set_optional(req, weight_version=weight_version, flush_cache=flush_cache)
        _rpc.set_delta(req, parent_version, manifest)
        return self._admin("ReceiveWeights", req, timeout, load=True)

    def destroy_weights_update_group(self, group_name: str,
                                     timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Leaves the group on every worker (a receive in flight fails promptly)."""
        return self._admin("DestroyWeightsUpdateGroup",
                           admin_pb2.DestroyWeightsUpdateGroupRequest(group_name=group_name),
                           timeout)

    def open_weights_group(self, group_name: str = "rlfleet", *,
                           master_address: str = "127.0.0.1", listen_host: Optional[str] = None,
                           port: int = 0, world_size: Optional[int] = None,
                           rank_offset: int = 1, timeout: float = 60.0,
                           stall_timeout: Optional[float] = None) -> "WeightsGroup":
        """A `tcp` weight-update group with this process as rank 0: listens (a TcpWeightSender
        on `listen_host`, default master_address; port 0 = any), makes the fleet join
        (init_weights_update_group at master_address:port) and returns a WeightsGroup whose
        receive_weights / prepare_and_complete / update_weights_from_distributed push in-memory
        tensors bucket by bucket. `world_size` defaults to 1 + the router's live workers (2 for
        a worker). Use as a context manager: close() destroys the group on the workers and
        stops the sender."""
        from rlfleet.weight_group import WeightsGroup
        return WeightsGroup.open(self, group_name, master_address=master_address,
                                 listen_host=listen_host, port=port, world_size=world_size,
                                 rank_offset=rank_offset, timeout=timeout,
                                 stall_timeout=stall_timeout)

    # Sleep and wake ---------------------------------------------------------------------

    def release_memory(self, timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Sleep: frees weights and KV; generation is refused until resume_memory. Weight updates
        are accepted while asleep and served after waking."""
        return self._admin("ReleaseMemory", admin_pb2.ReleaseMemoryRequest(), timeout, load=True)

    def resume_memory(self, timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Wake: reloads (or re-materializes) the weights and KV, then resumes."""
        return self._admin("ResumeMemory", admin_pb2.ResumeMemoryRequest(), timeout, load=True)

    release_memory_occupation = release_memory  # SGLang's names
    resume_memory_occupation = resume_memory

    # Inspection -------------------------------------------------------------------------

    def get_model_info(self) -> admin_pb2.GetModelInfoResponse:
        """The served model (architecture, sizes, dtype, weight version; per worker through the
        router)."""
        return self._unary(ADMIN, "GetModelInfo", admin_pb2.GetModelInfoRequest(),
                           admin_pb2.GetModelInfoResponse)

    model_info = get_model_info

    def get_server_info(self) -> admin_pb2.GetServerInfoResponse:
        """Pause / sleep state, queues, KV usage, counters, weight version (per worker through
        the router)."""
        return self._unary(ADMIN, "GetServerInfo", admin_pb2.GetServerInfoRequest(),
                           admin_pb2.GetServerInfoResponse)

    server_info = get_server_info

    def list_weights(self) -> admin_pb2.ListWeightsResponse:
        """Every served tensor's name, dtype and shape (what an update must name)."""
        return self._unary(ADMIN, "ListWeights", admin_pb2.ListWeightsRequest(),
                           admin_pb2.ListWeightsResponse)

    def weights_checker(self, action: str = "checksum") -> admin_pb2.WeightsCheckerResponse:
        """"snapshot", "reset_tensors", "compare" (missing / unexpected / changed since the
        snapshot) or "checksum" (SHA-256 per tensor, as rlfleet.tensor_sha256 computes it, and
        the rank digest; per worker through the router). FleetError when any worker failed."""
        req = admin_pb2.WeightsCheckerRequest(
            action=_rpc.pick(_rpc.CHECKER_ACTIONS, action, "action"))
        return _rpc.check_checker(self._unary(ADMIN, "WeightsChecker", req,
                                              admin_pb2.WeightsCheckerResponse,
                                              self.load_timeout))

    def health_check(self, service: str = "") -> str:
        """grpc.health.v1 status name of `service`. "" = the overall status, liveness: "SERVING"
        while the process is sound (asleep and during updates included); "rl.v1.Worker" /
        "rl.v1.Router" = readiness: "NOT_SERVING" while a worker sleeps, holds a weight update
        or drains, and while a router drains."""
        from grpc_health.v1 import health_pb2  # type: ignore[import-untyped]
        r = self._unary("grpc.health.v1.Health", "Check",
                        health_pb2.HealthCheckRequest(service=service),
                        health_pb2.HealthCheckResponse)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))

    # Router: the worker pool ------------------------------------------------------------

    def list_workers(self) -> router_pb2.WorkerListResponse:
        """Every worker: state (LIVE, DEAD, STALE, SYNCING), enabled, weight version, reason
        when out of routing; and the fleet's weight version and source."""
        return self._unary(ROUTER, "ListWorkers", router_pb2.ListWorkersRequest(),
                           router_pb2.WorkerListResponse)

    def add_worker(self, address: str) -> router_pb2.WorkerListResponse:
        """Adds a worker to the router's pool (it is caught up to the fleet's version before it
        is routed)."""
        return self._unary(ROUTER, "AddWorker", router_pb2.AddWorkerRequest(address=address),
                           router_pb2.WorkerListResponse)

    def remove_worker(self, address: str) -> router_pb2.WorkerListResponse:
        return self._unary(ROUTER, "RemoveWorker",
                           router_pb2.RemoveWorkerRequest(address=address),
                           router_pb2.WorkerListResponse)

    def set_worker_enabled(self, address: str, enabled: bool) -> router_pb2.WorkerListResponse:
        """Puts a worker back into routing (enabled=True, e.g. after a failed update left it
        out) or takes it out."""
        return self._unary(ROUTER, "SetWorkerEnabled",
                           router_pb2.SetWorkerEnabledRequest(address=address, enabled=enabled),
                           router_pb2.WorkerListResponse)

    def enable_worker(self, address: str) -> router_pb2.WorkerListResponse:
        return self.set_worker_enabled(address, True)

    def disable_worker(self, address: str) -> router_pb2.WorkerListResponse:
        return self.set_worker_enabled(address, False)

    def resync_workers(self, workers: Sequence[str], model_path: str,
                       weight_version: Optional[int] = None,
                       timeout: Optional[float] = None) -> admin_pb2.AdminResponse:
        """Loads `model_path` on those workers only (stale or disabled ones too), at the
        fleet's version unless `weight_version` is given, and puts them back into routing
        (rlctl workers resync). FleetError with each worker's result when any failed."""
        if not workers:
            raise ValueError("resync_workers: no workers named")
        return self.update_weights_from_disk(model_path, weight_version=weight_version,
                                             workers=workers, timeout=timeout)

    def stale_workers(self) -> list[str]:
        """Addresses of the workers the router lists STALE: behind the fleet after an update
        it cannot replay (a tensor stream or a weight group)."""
        return [w.address for w in self.list_workers().workers
                if w.state == router_pb2.WORKER_STATE_STALE]

    def recover_stale_workers(self, *, from_disk: Optional[str] = None,
                              weight_version: Optional[int] = None
                              ) -> Optional[admin_pb2.AdminResponse]:
        """The one call a trainer makes to bring back workers that missed an in-memory update
        (restarted, or joined later): resyncs every STALE worker. None when there is none.

        The router catches such workers up by itself from a live worker at the fleet's version
        (peer catch-up, issue 30); a worker is STALE only when no live worker serves that version
        any more, so the source here is a checkpoint folder holding the fleet's weights
        (`from_disk`, required while any worker is stale)."""
        stale = self.stale_workers()
        if not stale:
            return None
        if from_disk is None:
            raise FleetError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"workers {stale} are STALE after an in-memory update; resync them "
                             "from a checkpoint of the fleet's weights "
                             "(recover_stale_workers(from_disk=DIR)): no live worker serves the "
                             "fleet's version to catch them up from",
                             method="recover_stale_workers")
        return self.resync_workers(stale, from_disk, weight_version=weight_version)

    def get_metrics(self) -> router_pb2.GetMetricsResponse:
        """Router and text-cache metrics (also as Prometheus text)."""
        return self._unary(ROUTER, "GetMetrics", router_pb2.GetMetricsRequest(),
                           router_pb2.GetMetricsResponse)

    metrics = get_metrics


def _collect(messages: Sequence[generate_pb2.GenerateResponse]) -> Generations:
    finals = [GenerateResult.from_proto(m) for m in messages if m.HasField("final")]
    if not finals:
        raise FleetError(grpc.StatusCode.INTERNAL,
                         "the generation stream ended without a final message", method="Generate")
    return Generations.of(finals)
