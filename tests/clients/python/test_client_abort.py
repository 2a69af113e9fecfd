"""Router.Abort from the Python client: a trainer routing through rl-router aborts one request
by id without pausing the fleet or reaching the worker itself."""

import threading

from rltest import start_router, wait_for
from rlfleet import Client


def test_abort_one_request_through_the_router(start_worker):
    w = start_worker("--kv-cache-gb", "0.01", "--threads", "1")
    router = start_router([w])
    try:
        worker, fleet = Client(w.address, via="worker"), Client(router.address)
        # Paused through the router (a worker paused behind its back refuses the router's
        # requests): the request waits in the worker's queue.
        fleet.pause("in_place")
        out = {}

        def run():
            out["final"] = fleet.generate(text="Once upon a time", max_new_tokens=16,
                                          request_id="trainer-7").one()

        t = threading.Thread(target=run)
        t.start()
        wait_for(lambda: worker.server_info().num_waiting == 1,
                 "the request to reach the worker", timeout_s=60, interval_s=0.02)
        assert fleet.abort("trainer-7") == 1
        t.join(timeout=60)
        assert out["final"].finish_reason == "abort"
        assert out["final"].attempts == 1
        fleet.continue_generation()
        # The fleet still serves.
        assert fleet.generate(text="Once upon a time",
                              max_new_tokens=4).one().completion_tokens == 4
    finally:
        router.stop()
