"""The rl.v1 message modules, for code that builds or reads messages directly:

    from rlfleet.proto import admin_pb2
    admin_pb2.WORKER_STATE_STALE ...
"""

from rlfleet._stubs import admin_pb2, generate_pb2, router_pb2, weight_sync_pb2, worker_pb2

__all__ = ["admin_pb2", "generate_pb2", "router_pb2", "weight_sync_pb2", "worker_pb2"]
