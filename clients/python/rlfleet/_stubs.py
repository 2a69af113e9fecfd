"""The generated protobuf / gRPC modules (made when the package was built, see setup.py).

Trainers normally need none of them (the clients take and return plain values and typed
messages); `rlfleet.proto` re-exports the message modules for the rare direct use."""

try:
    from rlfleet._proto.rl.v1 import admin_pb2, admin_pb2_grpc  # noqa: F401
    from rlfleet._proto.rl.v1 import generate_pb2  # noqa: F401
    from rlfleet._proto.rl.v1 import router_pb2, router_pb2_grpc  # noqa: F401
    from rlfleet._proto.rl.v1 import weight_sync_pb2  # noqa: F401
    from rlfleet._proto.rl.v1 import worker_pb2, worker_pb2_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - a source checkout that was never built
    raise ImportError(
        "rlfleet's gRPC stubs are missing: install the package (`pip install clients/python`), "
        "which generates them from protos/") from e

__all__ = ["admin_pb2", "admin_pb2_grpc", "generate_pb2", "router_pb2", "router_pb2_grpc",
           "weight_sync_pb2", "worker_pb2", "worker_pb2_grpc"]
