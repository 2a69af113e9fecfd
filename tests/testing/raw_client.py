"""Raw rl.v1 stubs on one channel, for reliability tests that drive single calls and read their
gRPC status and metadata directly (the rlfleet Client raises FleetError and hides those):
`Client(addr).router / .admin / .worker` are the generated stubs, `pb` the message modules
(grpc.health.v1 included), `generate()` one greedy call returning its final message."""

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlfleet._stubs import (admin_pb2, admin_pb2_grpc, generate_pb2, router_pb2, router_pb2_grpc,
                            worker_pb2, worker_pb2_grpc)

pb = {"admin_pb2": admin_pb2, "generate_pb2": generate_pb2, "router_pb2": router_pb2,
      "worker_pb2": worker_pb2, "health_pb2": health_pb2, "health_pb2_grpc": health_pb2_grpc}


class Client:
    def __init__(self, target, timeout=60.0):
        self.timeout = timeout
        self.channel = grpc.insecure_channel(target)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        self.router = router_pb2_grpc.RouterStub(self.channel)
        self.worker = worker_pb2_grpc.WorkerStub(self.channel)

    def generate(self, text, max_new_tokens=16, temperature=None, via_router=True):
        """One non-streamed generation of `text`; its final message."""
        req = generate_pb2.GenerateRequest(text=text, stream=False)
        req.sampling_params.max_new_tokens = max_new_tokens
        if temperature is not None:
            req.sampling_params.temperature = temperature
        stub = self.router if via_router else self.worker
        for msg in stub.Generate(req, timeout=self.timeout):
            if msg.HasField("final"):
                return msg.final
        raise RuntimeError(f"Generate of {text!r}: no final message")
