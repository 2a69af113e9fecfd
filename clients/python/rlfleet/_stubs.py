"""The generated gRPC modules (made when the package was built, see setup.py)."""

try:
    from rlfleet._proto.rl.v1 import admin_pb2, admin_pb2_grpc  # noqa: F401
    from rlfleet._proto.rl.v1 import generate_pb2  # noqa: F401
    from rlfleet._proto.rl.v1 import router_pb2, router_pb2_grpc  # noqa: F401
    from rlfleet._proto.rl.v1 import worker_pb2, worker_pb2_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - a source checkout that was never built
    raise ImportError(
        "rlfleet's gRPC stubs are missing: install the package (`pip install clients/python`), "
        "which generates them from protos/") from e
