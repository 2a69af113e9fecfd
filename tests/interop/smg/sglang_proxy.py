"""A logging gRPC proxy for SGLang's scheduler protocol, put between the gateway and a worker:
it forwards every call unchanged (bytes in, bytes out, metadata and deadline included) and
records each Generate request, decoded, so a test can see exactly what the gateway sent.

Cost: one extra hop of loopback gRPC per call; the record holds every Generate request seen."""

import threading
from concurrent import futures

import grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["SglangScheduler"]


def _identity(b):
    return b


class SglangProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to `upstream` ("HOST:PORT")."""

    def __init__(self, upstream):
        self._channel = grpc.insecure_channel(upstream)
        self._lock = threading.Lock()
        self._generate = []  # decoded GenerateRequest, in arrival order
        self._responses = {}  # request_id -> [decoded GenerateResponse] the worker sent
        self._metadata = []  # (method, [(key, value)]) of every call
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        handlers = {}
        for m in _SERVICE.methods:
            path = f"/{_SERVICE.full_name}/{m.name}"
            if m.server_streaming:
                handlers[m.name] = grpc.unary_stream_rpc_method_handler(
                    self._forward_stream(path), request_deserializer=_identity,
                    response_serializer=_identity)
            else:
                handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                    self._forward_unary(path), request_deserializer=_identity,
                    response_serializer=_identity)
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self._server.start()

    def generate_requests(self):
        with self._lock:
            return list(self._generate)

    def generate_responses(self, request_id):
        with self._lock:
            return list(self._responses.get(request_id, []))

    def metadata_seen(self):
        with self._lock:
            return list(self._metadata)

    def _record(self, path, raw, context):
        with self._lock:
            self._metadata.append((path.rsplit("/", 1)[-1], list(context.invocation_metadata())))
            if path.endswith("/Generate"):
                self._generate.append(pb.GenerateRequest.FromString(raw))

    @staticmethod
    def _call_args(context):
        remaining = context.time_remaining()
        return {"metadata": [(k, v) for k, v in context.invocation_metadata()
                             if not k.startswith(":") and k not in ("user-agent", "te")],
                "timeout": remaining if remaining is not None and remaining < 1e6 else None}

    def _forward_unary(self, path):
        call = self._channel.unary_unary(path, request_serializer=_identity,
                                         response_deserializer=_identity)

        def handler(raw, context):
            self._record(path, raw, context)
            try:
                return call(raw, **self._call_args(context))
            except grpc.RpcError as e:
                context.abort(e.code(), e.details() or "")
        return handler

    def _forward_stream(self, path):
        call = self._channel.unary_stream(path, request_serializer=_identity,
                                          response_deserializer=_identity)

        def handler(raw, context):
            self._record(path, raw, context)
            upstream = call(raw, **self._call_args(context))
            context.add_callback(upstream.cancel)  # the gateway went away: so does the call
            try:
                for msg in upstream:
                    if path.endswith("/Generate"):
                        resp = pb.GenerateResponse.FromString(msg)
                        with self._lock:
                            self._responses.setdefault(resp.request_id, []).append(resp)
                    yield msg
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED or context.is_active():
                    context.abort(e.code(), e.details() or "")
        return handler

    def stop(self):
        self._server.stop(grace=2).wait(5)
        self._channel.close()
