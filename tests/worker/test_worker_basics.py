"""Trainer-style checks of a running rl-worker through grpcio: reflection, health, model info."""

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rlfleet import Client


def list_services(address):
    with grpc.insecure_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        reqs = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        resp = next(stub.ServerReflectionInfo(reqs, timeout=10))
        return {s.name for s in resp.list_services_response.service}


def test_reflection_lists_worker_admin_and_health(start_worker):
    w = start_worker()
    names = list_services(w.address)
    assert {"rl.v1.Worker", "rl.v1.Admin", "grpc.health.v1.Health"} <= names


def test_model_info_and_health(start_worker):
    w = start_worker()
    c = Client(w.address, via="worker")
    info = c.model_info()
    assert info.vocab_size == 512
    assert info.num_hidden_layers == 5
    assert info.num_key_value_heads == 4
    assert info.weight_version == 0
    assert c.health_check() == "SERVING"


def test_admin_key_required(start_worker):
    w = start_worker("--admin-api-key", "k3y")
    with pytest.raises(grpc.RpcError) as e:
        Client(w.address).model_info()
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        Client(w.address, api_key="wrong").model_info()
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert Client(w.address, api_key="k3y").model_info().vocab_size == 512
