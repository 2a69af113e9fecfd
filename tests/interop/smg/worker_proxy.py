"""A recording gRPC proxy put between rl-router and an rl-worker: it forwards every call of
every service unchanged (bytes in, bytes out, metadata and deadline included; one generic
stream-stream handler serves unary and streaming methods alike, as they are the same on the
wire) and records each rl.v1.Worker/Generate call, decoded: the prompt ids the worker received
and, per completion, the ids it generated with their logprobs. The episode tests check the
router's exports against this record: the worker's own view of every turn.

Cost: one extra hop of loopback gRPC per call; the record holds every Generate call seen."""

import threading
from concurrent import futures

import grpc
from rlfleet._stubs import generate_pb2

_GENERATE = "/rl.v1.Worker/Generate"


def _identity(b):
    return b


class WorkerCall:
    """One Generate call as the worker saw it."""

    def __init__(self, request):
        self.request = request
        self.input_ids = list(request.input_ids.ids)
        self.outputs = {}  # completion index -> [token ids] streamed
        self.logprobs = {}  # completion index -> [logprob per streamed token]
        self.finals = {}  # completion index -> GenerateFinal

    def add(self, resp):
        if resp.HasField("chunk"):
            self.outputs.setdefault(resp.index, []).extend(resp.chunk.token_ids)
            self.logprobs.setdefault(resp.index, []).extend(
                lp.logprob for lp in resp.chunk.logprobs)
        elif resp.HasField("final"):
            self.finals[resp.index] = resp.final
            if resp.final.output_ids:  # a non-streamed final carries the ids itself
                self.outputs[resp.index] = list(resp.final.output_ids)
                self.logprobs[resp.index] = [lp.logprob for lp in resp.final.output_logprobs]


class WorkerProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to `upstream` ("HOST:PORT")."""

    def __init__(self, upstream):
        self._channel = grpc.insecure_channel(upstream)
        self._lock = threading.Lock()
        self._calls = {}  # request_id -> WorkerCall
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        self._server.add_generic_rpc_handlers((_Forwarder(self),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self._server.start()

    def calls(self):
        """request_id -> WorkerCall of every Generate seen so far."""
        with self._lock:
            return dict(self._calls)

    def _forward(self, path, requests, context):
        remaining = context.time_remaining()
        call = self._channel.stream_stream(path, request_serializer=_identity,
                                           response_deserializer=_identity)
        record = None

        def upstream_requests():
            nonlocal record
            for raw in requests:
                if path == _GENERATE:
                    req = generate_pb2.GenerateRequest.FromString(raw)
                    record = WorkerCall(req)
                    with self._lock:
                        self._calls[req.request_id] = record
                yield raw

        upstream = call(upstream_requests(),
                        metadata=[(k, v) for k, v in context.invocation_metadata()
                                  if not k.startswith(":") and k not in ("user-agent", "te")],
                        timeout=remaining if remaining is not None and remaining < 1e6 else None)
        context.add_callback(upstream.cancel)  # the router went away: so does the call
        try:
            for raw in upstream:
                if record is not None:
                    resp = generate_pb2.GenerateResponse.FromString(raw)
                    with self._lock:
                        record.add(resp)
                yield raw
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED or context.is_active():
                context.abort(e.code(), e.details() or "")

    def stop(self):
        self._server.stop(grace=2).wait(5)
        self._channel.close()


class _Forwarder(grpc.GenericRpcHandler):
    def __init__(self, proxy):
        self._proxy = proxy

    def service(self, handler_call_details):
        path = handler_call_details.method
        return grpc.stream_stream_rpc_method_handler(
            lambda requests, context: self._proxy._forward(path, requests, context),
            request_deserializer=_identity, response_serializer=_identity)
