"""Versions a request accepts through the rlfleet client and a real router (issue 30):
`min_weight_version` / `exact_weight_version` reach the fleet, an accepted version is served and
the result states start and end versions, a version no worker serves is a retryable
UNAVAILABLE naming both, and a contradictory pair is INVALID_ARGUMENT before any call."""

import grpc
import pytest


def test_versions_a_request_accepts(fleet):
    from rlfleet import Client
    from rlfleet.types import build_generate_request
    req = build_generate_request(text="Hi", min_weight_version=2, exact_weight_version=3)
    assert req.HasField("min_weight_version") and req.min_weight_version == 2
    assert req.exact_weight_version == 3
    assert not build_generate_request(text="Hi").HasField("min_weight_version")
    with Client(fleet["router"].address, timeout=5.0) as c:
        c.wait_ready()
        r = c.generate(text="Once upon a time", max_new_tokens=4, temperature=0.0,
                       min_weight_version=0, exact_weight_version=0).one()
        assert r.weight_version == 0 and r.dispatch_weight_version == 0
    # The router waits for a worker at the version until just before the client's deadline.
    with Client(fleet["router"].address, timeout=3.0) as c, pytest.raises(grpc.RpcError) as e:
        c.generate(text="Once upon a time", max_new_tokens=4, min_weight_version=7)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
    assert "weight version >= 7" in e.value.details()
    assert "version(s) 0" in e.value.details()
    with Client(fleet["router"].address, timeout=5.0) as c, pytest.raises(grpc.RpcError) as e:
        c.generate(text="Once upon a time", min_weight_version=5, exact_weight_version=4)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
