"""The clients' `client_id` option: the router's fair admission keys on the `rl-client-id` header
they send, not on the connection. A router with one generation slot and two queue places, its
worker paused so nothing finishes: a flooding client fills the queue; another Client object with
the same client_id is refused at once (same client, whatever its connection), while a client
with another id takes the flood's newest place (that one ends RESOURCE_EXHAUSTED) and is served
once the worker continues. Both outcomes together show the header, not the peer, names the
client (Python channels to one target may or may not share a connection). That rlfleet's
asyncio client sends the header too: test_rlfleet_client.py."""

import threading

import grpc
import pytest

from rltest import start_router, wait_for
from rlfleet import Client, FleetError


def _queued(fleet) -> int:
    text = fleet.get_metrics().prometheus_text
    for line in text.splitlines():
        if line.startswith("rl_router_admission_queued "):
            return int(float(line.split()[1]))
    raise AssertionError("rl_router_admission_queued missing from the router's metrics")


def test_router_fair_admission_keys_on_client_id(start_worker):
    w = start_worker("--kv-cache-gb", "0.01", "--threads", "1")
    router = start_router([w], "--max-in-flight", "1", "--max-queued", "2")
    results = {}

    def run(name, client):
        try:
            results[name] = client.generate(text="Once upon a time", max_new_tokens=4).one()
        except FleetError as e:
            results[name] = e

    threads = []

    def start(name, client):
        t = threading.Thread(target=run, args=(name, client))
        t.start()
        threads.append(t)

    try:
        worker = Client(w.address, via="worker")
        fleet = Client(router.address)
        # The fleet paused through the router (a worker paused behind its back refuses the
        # router's requests): the one admitted generation waits in the worker's queue.
        fleet.pause("in_place")
        flood = Client(router.address, client_id="flood")
        start("flood-0", flood)
        wait_for(lambda: worker.server_info().num_waiting == 1, "the first request to run",
                 timeout_s=60, interval_s=0.02)
        start("flood-1", flood)
        wait_for(lambda: _queued(fleet) == 1, "flood-1 to queue", timeout_s=60, interval_s=0.02)
        start("flood-2", flood)
        wait_for(lambda: _queued(fleet) == 2, "flood-2 to queue", timeout_s=60, interval_s=0.02)

        # Same id from another Client object: the same client, refused at once.
        with pytest.raises(FleetError) as refused:
            Client(router.address, client_id="flood").generate(text="Once upon a time",
                                                               max_new_tokens=4)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-queued 2" in refused.value.details()

        # Another id: takes the flood's newest place.
        start("other", Client(router.address, client_id="trainer-b"))
        wait_for(lambda: "flood-2" in results, "the flood's newest request to be displaced",
                 timeout_s=60, interval_s=0.02)
        assert isinstance(results["flood-2"], FleetError)
        assert results["flood-2"].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "gave its place to another client" in results["flood-2"].details()

        fleet.continue_generation()
        for t in threads:
            t.join(timeout=60)
        for name in ("flood-0", "flood-1", "other"):
            assert not isinstance(results[name], Exception), f"{name}: {results[name]}"
            assert results[name].completion_tokens == 4
    finally:
        router.stop()


def test_client_id_is_checked():
    for bad in ("x" * 129, "tab\there", "na\u00efve"):
        with pytest.raises(ValueError):
            Client("127.0.0.1:1", client_id=bad)
