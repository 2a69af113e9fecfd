"""Every grpcurl command of the README, run as written with the real grpcurl binary against a
live rl-router and two rl-workers (stories260K), each answer checked; and every service that
reflection lists on either process resolves (describe), health included."""

import json
import re
import shlex
import subprocess

from rltest import GRPCURL, ROOT

README_ROUTER = "127.0.0.1:50051"
README_WORKER = "127.0.0.1:50061"
README_CKPT = "build/step-100"


def readme_grpcurl_commands():
    """The lines of the README's grpcurl block, in order."""
    text = (ROOT / "README.md").read_text()
    cmds = [line.strip() for line in text.splitlines() if line.strip().startswith("grpcurl ")]
    assert len(cmds) >= 15, "the README's grpcurl block is gone"
    return cmds


def run_grpcurl(args):
    r = subprocess.run([GRPCURL, *args], capture_output=True, text=True, timeout=120)
    return r


def json_messages(out):
    """grpcurl prints one JSON object per response message (streams: several)."""
    dec = json.JSONDecoder()
    msgs, i = [], 0
    while True:
        while i < len(out) and out[i].isspace():
            i += 1
        if i >= len(out):
            return msgs
        obj, i = dec.raw_decode(out, i)
        msgs.append(obj)


def field(d, name):
    """A field by proto name or by its JSON (lowerCamel) name."""
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
    return d.get(name, d.get(camel))


def check_list(msgs, out):
    services = set(out.split())
    assert {"rl.v1.Router", "rl.v1.Admin", "grpc.health.v1.Health"} <= services, out


def check_describe_admin(msgs, out):
    assert "rl.v1.Admin is a service" in out, out
    for rpc in ("PauseGeneration", "UpdateWeightsFromDisk", "WeightsChecker", "ReleaseMemory"):
        assert f"rpc {rpc}" in out, out


def check_generate(msgs, out):
    final = field(msgs[-1], "final")
    assert final is not None, out
    assert field(final, "finish_reason") == "FINISH_REASON_LENGTH", final
    assert field(final, "completion_tokens") == 8, final
    assert field(final, "text"), final
    assert field(final, "worker"), final


def check_retrieve(msgs, out):
    traj = field(msgs[0], "trajectory")
    assert traj and len(field(traj, "tokens")) > 0, out
    assert int(field(msgs[0], "matched_bytes")) == len("Hello"), out


def check_list_workers(msgs, out):
    workers = field(msgs[0], "workers")
    assert len(workers) == 2, out
    assert all(field(w, "state") == "WORKER_STATE_LIVE" for w in workers), out


def check_admin_ok(msgs, out):
    assert field(msgs[0], "success") is True, out


def check_update(msgs, out):
    assert field(msgs[0], "success") is True, out
    assert int(field(msgs[0], "weight_version")) == 100, out
    assert len(field(msgs[0], "results")) == 2, out


def check_checksum(msgs, out):
    workers = field(msgs[0], "workers")
    assert len(workers) == 2, out
    digests = {field(field(w, "result"), "rank_sha256") for w in workers}
    assert len(digests) == 1 and len(digests.pop()) == 64, out


def check_server_info(msgs, out):
    assert int(field(msgs[0], "weight_version")) == 100, out


def check_list_weights(msgs, out):
    names = [field(w, "name") for w in field(msgs[0], "weights")]
    assert "model.embed_tokens.weight" in names, out


def check_health(msgs, out):
    assert msgs == [{"status": "SERVING"}], out


# What each README command must answer, by its last word (the method, or list / describe).
CHECKS = {
    "list": check_list,
    "rl.v1.Admin": check_describe_admin,
    "rl.v1.Router/Generate": check_generate,
    "rl.v1.Router/RetrieveFromText": check_retrieve,
    "rl.v1.Router/ListWorkers": check_list_workers,
    "rl.v1.Admin/PauseGeneration": check_admin_ok,
    "rl.v1.Admin/UpdateWeightsFromDisk": check_update,
    "rl.v1.Admin/ContinueGeneration": check_admin_ok,
    "rl.v1.Admin/FlushCache": check_admin_ok,
    "rl.v1.Admin/WeightsChecker": check_checksum,
    "rl.v1.Admin/GetServerInfo": check_server_info,
    "rl.v1.Admin/ListWeights": check_list_weights,
    "rl.v1.Admin/ReleaseMemory": check_admin_ok,
    "rl.v1.Admin/ResumeMemory": check_admin_ok,
    "grpc.health.v1.Health/Check": check_health,
}


def test_every_readme_grpcurl_command(fleet, checkpoint):
    ran = []
    for cmd in readme_grpcurl_commands():
        line = (cmd.replace(README_ROUTER, fleet.router)
                   .replace(README_WORKER, fleet.workers[0])
                   .replace(README_CKPT, str(checkpoint)))
        args = shlex.split(line)[1:]
        r = run_grpcurl(args)
        assert r.returncode == 0, f"{cmd}\n-> {r.returncode}: {r.stderr}{r.stdout}"
        key = args[-1]
        assert key in CHECKS, f"no check for the README command: {cmd}"
        out = r.stdout
        msgs = json_messages(out) if "/" in key else []
        CHECKS[key](msgs, out)
        ran.append(key)
    assert set(ran) == set(CHECKS), set(CHECKS) - set(ran)


def test_every_listed_service_resolves(fleet):
    for target in (fleet.router, fleet.workers[0]):
        r = run_grpcurl(["-plaintext", target, "list"])
        assert r.returncode == 0, r.stderr
        services = r.stdout.split()
        assert "grpc.health.v1.Health" in services, r.stdout
        for service in services:
            d = run_grpcurl(["-plaintext", target, "describe", service])
            assert d.returncode == 0, f"{target} describe {service}: {d.stderr}"
            assert f"{service} is a service" in d.stdout, d.stdout
            # Every method of the service lists its request and response types.
            m = run_grpcurl(["-plaintext", target, "list", service])
            assert m.returncode == 0 and m.stdout.strip(), f"{target} list {service}: {m.stderr}"


def test_health_by_service_name_and_describe(fleet):
    for target in (fleet.router, fleet.workers[1]):
        r = run_grpcurl(["-plaintext", target, "grpc.health.v1.Health/Check"])
        assert r.returncode == 0, r.stderr
        assert json_messages(r.stdout) == [{"status": "SERVING"}]
        r = run_grpcurl(["-plaintext", target, "describe", "grpc.health.v1.HealthCheckRequest"])
        assert r.returncode == 0, r.stderr
        assert "string service = 1;" in r.stdout, r.stdout


def test_router_abort_through_grpcurl(fleet):
    r = run_grpcurl(["-plaintext", "-d", '{"request_id": "nobody"}', fleet.router,
                     "rl.v1.Router/Abort"])
    assert r.returncode != 0
    assert "NotFound" in r.stderr and "nobody" in r.stderr, r.stderr
