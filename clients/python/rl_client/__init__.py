"""Trainer-side Python client for the rollout fleet (rl-router / rl-worker).

The gRPC stubs are generated on first use from the repository's protos/ with grpcio-tools into
a cache folder, so the client needs only the pinned requirements.txt.

    from rl_client import Client
    c = Client("127.0.0.1:50051", api_key=None)
    out = c.generate(text="Once upon a time", max_new_tokens=16, return_logprob=True)
    c.pause("retract"); c.update_weights_from_disk("/ckpt/step-10"); c.continue_generation()
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
from pathlib import Path

_PROTO_ROOT = Path(__file__).resolve().parents[3] / "protos"
_PROTOS = ["rl/v1/generate.proto", "rl/v1/worker.proto", "rl/v1/admin.proto",
           "rl/v1/router.proto"]


def _generated_dir() -> Path:
    digest = hashlib.sha256()
    for p in _PROTOS:
        digest.update((_PROTO_ROOT / p).read_bytes())
    out = Path(os.environ.get("RL_CLIENT_CACHE", tempfile.gettempdir())) / (
        "rl_client_" + digest.hexdigest()[:16])
    if not (out / "rl" / "v1" / "router_pb2_grpc.py").exists():
        from grpc_tools import protoc
        tmp = Path(tempfile.mkdtemp(dir=out.parent if out.parent.exists() else None))
        args = ["protoc", f"-I{_PROTO_ROOT}", f"--python_out={tmp}", f"--grpc_python_out={tmp}"]
        if protoc.main(args + _PROTOS) != 0:
            raise RuntimeError("rl_client: protoc failed on " + str(_PROTO_ROOT))
        try:
            tmp.rename(out)
        except OSError:  # another process won the race
            pass
    return out


def _load():
    gen = str(_generated_dir())
    if gen not in sys.path:
        sys.path.insert(0, gen)
    mods = {}
    for name in ["generate_pb2", "worker_pb2", "worker_pb2_grpc", "admin_pb2", "admin_pb2_grpc",
                 "router_pb2", "router_pb2_grpc"]:
        mods[name] = importlib.import_module("rl.v1." + name)
    # The standard health service stubs ship in grpcio-health-checking.
    mods["health_pb2"] = importlib.import_module("grpc_health.v1.health_pb2")
    mods["health_pb2_grpc"] = importlib.import_module("grpc_health.v1.health_pb2_grpc")
    return mods


pb = _load()


class Client:
    """Blocking client for a worker or the router. Every call raises grpc.RpcError on failure.
    `client_id` (printable ASCII, at most 128 bytes) names this client to the router's fair
    admission (the `rl-client-id` header); without it the router shares by connection."""

    def __init__(self, target: str, api_key: str | None = None, timeout: float = 120.0,
                 client_id: str | None = None):
        import grpc
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", 512 << 20),
            ("grpc.max_send_message_length", 512 << 20)])
        self.metadata = [("authorization", f"Bearer {api_key}")] if api_key else []
        if client_id:
            if not client_id.isascii() or not client_id.isprintable() or len(client_id) > 128:
                raise ValueError(f"client_id: {client_id!r} must be printable ASCII of at most "
                                 "128 bytes")
            self.metadata.append(("rl-client-id", client_id))
        self.timeout = timeout
        self.admin = pb["admin_pb2_grpc"].AdminStub(self.channel)
        self.worker = pb["worker_pb2_grpc"].WorkerStub(self.channel)
        self.router = pb["router_pb2_grpc"].RouterStub(self.channel)
        self.health = pb["health_pb2_grpc"].HealthStub(self.channel)

    def _call(self, fn, request):
        return fn(request, timeout=self.timeout, metadata=self.metadata)

    # Data plane -----------------------------------------------------------------------------
    def generate_stream(self, text=None, input_ids=None, via_router=True, **params):
        """Yields GenerateResponse messages (chunks, then the final one). `request_id` (optional)
        names the request for abort()."""
        g = pb["generate_pb2"]
        req = g.GenerateRequest(return_logprob=params.pop("return_logprob", False),
                                return_trajectory=params.pop("return_trajectory", False),
                                request_id=params.pop("request_id", ""))
        if text is not None:
            req.text = text
        else:
            req.input_ids.ids.extend(input_ids)
        for k, v in params.items():
            if isinstance(v, (list, tuple)):
                getattr(req.sampling_params, k).extend(v)
            else:
                setattr(req.sampling_params, k, v)
        stub = self.router if via_router else self.worker
        return stub.Generate(req, timeout=self.timeout, metadata=self.metadata)

    def generate(self, text=None, input_ids=None, via_router=True, **params):
        """Returns the final GenerateFinal message."""
        final = None
        for msg in self.generate_stream(text, input_ids, via_router, **params):
            if msg.HasField("final"):
                final = msg.final
        return final

    def abort(self, request_id=None, abort_all=False, via_router=True):
        """Aborts one request by id (the router forwards it to the worker holding it) or every
        request (abort_all; the admin key when one is set). Returns the number aborted."""
        req = pb["worker_pb2"].AbortRequest(request_id=request_id or "", abort_all=abort_all)
        stub = self.router if via_router else self.worker
        return self._call(stub.Abort, req).num_aborted

    # Control plane --------------------------------------------------------------------------
    def model_info(self):
        return self._call(self.admin.GetModelInfo, pb["admin_pb2"].GetModelInfoRequest())

    def server_info(self):
        return self._call(self.admin.GetServerInfo, pb["admin_pb2"].GetServerInfoRequest())

    def pause(self, mode: str):
        modes = {"abort": 1, "in_place": 2, "retract": 3}
        return self._call(self.admin.PauseGeneration,
                          pb["admin_pb2"].PauseGenerationRequest(mode=modes[mode]))

    def continue_generation(self):
        return self._call(self.admin.ContinueGeneration,
                          pb["admin_pb2"].ContinueGenerationRequest())

    def flush_cache(self):
        return self._call(self.admin.FlushCache, pb["admin_pb2"].FlushCacheRequest())

    def update_weights_from_disk(self, path, weight_version=None, abort_all_requests=False,
                                 keep_pause=False):
        req = pb["admin_pb2"].UpdateWeightsFromDiskRequest(
            model_path=path, abort_all_requests=abort_all_requests, keep_pause=keep_pause)
        if weight_version is not None:
            req.weight_version = weight_version
        return self._call(self.admin.UpdateWeightsFromDisk, req)

    def health_check(self) -> str:
        resp = self._call(self.health.Check, pb["health_pb2"].HealthCheckRequest())
        return pb["health_pb2"].HealthCheckResponse.ServingStatus.Name(resp.status)
