"""A trainer's loop against real rl-worker / rl-router processes on loopback:
generate while updating weights from disk mid-run, check versions; kill a worker mid-run and
check that no request is lost."""

import json
import subprocess
import threading

from rltest import BUILD, DATA, Server, start_router, wait_for
from rlfleet import Client, FleetError
from rlfleet.proto import router_pb2


def test_update_weights_from_disk_mid_run(start_worker):
    w = start_worker("--kv-cache-gb", "0.02")
    c = Client(w.address, via="worker")
    errors, versions = [], []

    def load():
        for _ in range(6):
            try:
                f = c.generate(text="Once upon a time", max_new_tokens=16,
                               temperature=0.0).one()
                versions.append(f.weight_version)
            except FleetError as e:  # pragma: no cover - reported below
                errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    c.pause("retract")
    r = c.update_weights_from_disk(str(DATA / "stories260K-bf16"))
    assert r.weight_version == 1
    c.continue_generation()
    for t in threads:
        t.join()
    assert not errors
    assert len(versions) == 18 and set(versions) <= {0, 1}
    assert c.model_info().weight_version == 1
    f = c.generate(text="Once upon a time", max_new_tokens=20, temperature=0.0).one()
    assert f.weight_version == 1
    # The bf16 copy of stories260K gives the same greedy tokens.
    assert list(f.output_ids)[:20] == [432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                       338, 401, 396, 267, 337, 410, 408, 419, 292]


def test_worker_killed_mid_run_loses_no_request(start_worker):
    workers = [start_worker("--kv-cache-gb", "0.02") for _ in range(3)]
    router = start_router(workers)
    try:
        c = Client(router.address)
        done, errors = [], []

        def load():
            for _ in range(8):
                try:
                    f = c.generate(text="Once upon a time", max_new_tokens=12,
                                   temperature=0.0).one()
                    done.append(f.worker)
                except FleetError as e:
                    errors.append(e.details())

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        workers[0].proc.kill()
        for t in threads:
            t.join()
        # A request whose worker died after its first streamed token is reported, not
        # replayed; every other request completes on a surviving worker.
        assert len(done) + len(errors) == 32
        assert len(done) >= 28, errors
        # The health checks mark the killed worker dead.
        def dead():
            listing = c.list_workers()
            states = {w.address: w.state for w in listing.workers}
            return states[workers[0].address] == router_pb2.WORKER_STATE_DEAD

        wait_for(dead, "the killed worker to be marked dead", timeout_s=10, interval_s=0.05)
    finally:
        router.stop()


def test_distributed_update_through_the_router_with_the_sender_tool(start_worker):
    """rl-weight-sender (rank 0) + rlctl init-group / update-weights --distributed via the
    router: both workers join as ranks 1 and 2 and receive every bucket."""
    workers = [start_worker("--kv-cache-gb", "0.02") for _ in range(2)]
    router = start_router(workers)
    sender = _sender("g")
    try:
        port = sender.address.rsplit(":", 1)[1]
        rlctl = [str(BUILD / "bin" / "rlctl"), "--target", router.address, "--json"]
        init = subprocess.run(rlctl + ["init-group", "--master-address", "127.0.0.1",
                                       "--master-port", port, "--world-size", "3",
                                       "--group-name", "g"],
                              capture_output=True, text=True, timeout=120)
        assert init.returncode == 0, init.stdout + init.stderr
        assert json.loads(init.stdout)["success"]
        update = subprocess.run(rlctl + ["update-weights", "--distributed", "--group-name", "g"],
                                stdin=sender.proc.stdout, capture_output=True, text=True,
                                timeout=300)
        assert update.returncode == 0, update.stdout + update.stderr
        buckets = json.loads(update.stdout)["buckets"]
        assert len(buckets) >= 2
        assert all(b["success"] for b in buckets)
        assert sender.proc.wait(timeout=60) == 0, sender.log_path.read_text()
        c = Client(router.address)
        assert c.model_info().weight_version == len(buckets)
        f = c.generate(text="Once upon a time", max_new_tokens=20, temperature=0.0).one()
        assert list(f.output_ids) == [432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                      338, 401, 396, 267, 337, 410, 408, 419, 292]
        # Every worker now serves the bf16 checkpoint's bytes (converted to its float32).
        sums = c.weights_checker("checksum")
        digests = {w.result.rank_sha256 for w in sums.workers}
        assert len(sums.workers) == 2 and len(digests) == 1
    finally:
        sender.stop()
        router.stop()


def _sender(group, plan_only=False):
    """rl-weight-sender of stories260K-bf16 in 0.2 MiB buckets: the bucket plan, or rank 0 of a
    3-rank group (a Server: its bucket lines follow the ready line on proc.stdout)."""
    args = [str(BUILD / "bin" / "rl-weight-sender"), "--checkpoint", str(DATA / "stories260K-bf16"),
            "--bucket-mb", "0.2", "--group-name", group, "--timeout-s", "60"]
    if plan_only:
        return subprocess.run(args + ["--plan-only"], capture_output=True, text=True, timeout=60)
    return Server(args + ["--listen", "127.0.0.1:0", "--world-size", "3"])


def test_two_phase_and_single_call_receive_with_the_sender_tool(start_worker):
    """rl-weight-sender against rlctl prepare-weights / complete-weights (two-phase),
    receive-weights (single call) and receive-weights --stage + activate-weights through the
    router: both workers apply every bucket only at complete / at the end of the call / at the
    activation, and serve the bf16 checkpoint afterwards."""
    workers = [start_worker("--kv-cache-gb", "0.02") for _ in range(2)]
    router = start_router(workers)
    rlctl = [str(BUILD / "bin" / "rlctl"), "--target", router.address, "--json"]
    golden = [432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
              410, 408, 419, 292]
    senders = []
    try:
        for group, mode in (("g1", "two-phase"), ("g2", "single"), ("g3", "staged")):
            plan = _sender(group, plan_only=True)
            assert plan.returncode == 0, plan.stderr
            assert plan.stdout.count('"names"') >= 2
            sender = _sender(group)
            senders.append(sender)
            port = sender.address.rsplit(":", 1)[1]
            init = subprocess.run(rlctl + ["init-group", "--master-address", "127.0.0.1",
                                           "--master-port", port, "--world-size", "3",
                                           "--group-name", group],
                                  capture_output=True, text=True, timeout=120)
            assert init.returncode == 0, init.stdout + init.stderr
            c = Client(router.address)
            before = c.model_info().weight_version
            if mode == "two-phase":
                prep = subprocess.run(rlctl + ["prepare-weights", "--group-name", group],
                                      input=plan.stdout, capture_output=True, text=True,
                                      timeout=120)
                assert prep.returncode == 0, prep.stdout + prep.stderr
                assert json.loads(prep.stdout)["ready"]
                assert sender.proc.wait(timeout=120) == 0, sender.log_path.read_text()
                assert c.model_info().weight_version == before  # received, not applied
                done = subprocess.run(rlctl + ["complete-weights", "--group-name", group],
                                      capture_output=True, text=True, timeout=120)
            elif mode == "single":
                done = subprocess.run(rlctl + ["receive-weights", "--group-name", group],
                                      input=plan.stdout, capture_output=True, text=True,
                                      timeout=120)
                assert sender.proc.wait(timeout=120) == 0, sender.log_path.read_text()
            else:  # staged: received while serving, served at activate-weights
                staged = subprocess.run(rlctl + ["receive-weights", "--group-name", group,
                                                 "--stage"],
                                        input=plan.stdout, capture_output=True, text=True,
                                        timeout=120)
                assert sender.proc.wait(timeout=120) == 0, sender.log_path.read_text()
                assert staged.returncode == 0, staged.stdout + staged.stderr
                assert c.model_info().weight_version == before  # staged, not served
                assert all(w.info.staged_source == f"group:{group}"
                           for w in c.get_server_info().workers)
                done = subprocess.run(rlctl + ["activate-weights"], capture_output=True,
                                      text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            assert json.loads(done.stdout)["success"]
            assert c.model_info().weight_version == before + 1
            f = c.generate(text="Once upon a time", max_new_tokens=20, temperature=0.0).one()
            assert list(f.output_ids) == golden
            subprocess.run(rlctl + ["destroy-group", "--group-name", group], capture_output=True,
                           text=True, timeout=60)
    finally:
        for s in senders:
            s.stop()
        router.stop()
