"""helm/rlfleet through the real Helm engine (helm-sdkpy embeds Helm as a library): lint, then
install into an in-memory fake API server (fake_kube.py) with Helm's memory release driver,
which renders every template exactly as `helm install` would. Every rendered manifest is
validated against the Kubernetes schemas of kubernetes-validate; values are checked against
values.schema.json both by Helm and by jsonschema; the optional parts are rendered on and off."""

import asyncio
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

import helm_sdkpy as helm

from fake_kube import FakeKube

HERE = Path(__file__).resolve().parent

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rlfleet"
DASHBOARD = CHART / "dashboards" / "rlfleet.json"
K8S_VERSION = "1.30"


def values_default():
    return yaml.safe_load((CHART / "values.yaml").read_text())


def render(values=None):
    """Installs the chart with `values` into a fresh fake cluster; returns the manifests Helm
    rendered (parsed), and checks they are exactly what reached the API server."""
    # A fresh process: Helm reads HELM_DRIVER=memory (release records kept in memory, not in
    # cluster Secrets) from the environment the process started with.
    r = subprocess.run([sys.executable, str(HERE / "fake_kube.py"), str(CHART)],
                       input=json.dumps(values), capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HELM_DRIVER": "memory"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    if "error" in out:
        raise helm.HelmError(out["error"])
    docs = [d for d in yaml.safe_load_all(out["manifest"]) if d]
    sent = out["sent"]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == \
        sorted((d["kind"], d["metadata"]["name"]) for d in sent)
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def container(docs, kind):
    (obj,) = by_kind(docs, kind)
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return c


def validate_all(docs):
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no upstream schema; checked field by field below
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_lint_is_clean():
    cfg = helm.Configuration(namespace="default", kubeconfig=FakeKube.kubeconfig_placeholder())
    result = asyncio.run(helm.Lint(cfg).run(str(CHART)))
    assert not result.get("Errors"), result
    # Severity 1 is INFO (e.g. "icon is recommended"); nothing at WARNING (2) or ERROR (3).
    assert all(m["Severity"] < 2 for m in result.get("Messages") or []), result


def test_default_values_render_and_validate():
    assert jsonschema.validate(values_default(), json.loads((CHART / "values.schema.json").read_text())) is None
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["Deployment", "PersistentVolumeClaim", "PodDisruptionBudget",
                     "PodDisruptionBudget", "Service", "Service", "StatefulSet"], kinds
    validate_all(docs)
    assert not by_kind(docs, "ServiceMonitor")
    # The router follows the workers' headless Service by DNS (scaling needs no re-render).
    args = container(docs, "Deployment")["args"]
    (headless,) = [d for d in by_kind(docs, "Service") if d["spec"].get("clusterIP") == "None"]
    dns = [a for a in args if a.startswith("--worker")]
    assert len(dns) == 1 and re.fullmatch(
        rf"--worker-dns={headless['metadata']['name']}\.[a-z0-9-]+\.svc:"
        rf"{values_default()['worker']['port']}", dns[0]), args
    # `static`: every worker by its stable StatefulSet DNS name.
    args = container(render({"router": {"workerDiscovery": "static"}}), "Deployment")["args"]
    workers = [a for a in args if a.startswith("--worker=")]
    assert len(workers) == values_default()["worker"]["replicas"], args
    # Non-root containers.
    for kind in ("Deployment", "StatefulSet"):
        assert container(docs, kind)["securityContext"]["runAsNonRoot"] is True


def test_probes():
    docs = render()
    w = container(docs, "StatefulSet")
    port = values_default()["worker"]["port"]
    assert w["startupProbe"]["grpc"]["port"] == port
    assert w["startupProbe"]["failureThreshold"] * w["startupProbe"]["periodSeconds"] >= \
        values_default()["worker"]["startupSeconds"]
    # Readiness is the named service (NOT_SERVING under a refit, asleep, draining); liveness
    # the overall status (SERVING while the process is sound, refits included).
    assert w["readinessProbe"]["grpc"] == {"port": port, "service": "rl.v1.Worker"}
    assert w["livenessProbe"]["grpc"] == {"port": port}
    r = container(docs, "Deployment")
    rport = values_default()["router"]["port"]
    assert r["readinessProbe"]["grpc"] == {"port": rport, "service": "rl.v1.Router"}
    assert r["livenessProbe"]["grpc"] == {"port": rport}
    assert "startupProbe" in r
    docs = render({"worker": {"startupSeconds": 1800}})
    assert container(docs, "StatefulSet")["startupProbe"]["failureThreshold"] == 180


def test_drain_grace_and_disruption_budgets():
    docs = render()
    pods = {d["kind"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("StatefulSet", "Deployment")}
    w, r = values_default()["worker"], values_default()["router"]
    # The pod's grace period outlasts the process's own drain.
    assert pods["StatefulSet"]["terminationGracePeriodSeconds"] == w["drainGraceSeconds"] + 30
    assert pods["Deployment"]["terminationGracePeriodSeconds"] == r["drainGraceSeconds"] + 15
    assert f"--drain-grace-s={w['drainGraceSeconds']}" in container(docs, "StatefulSet")["args"]
    assert f"--drain-grace-s={r['drainGraceSeconds']}" in container(docs, "Deployment")["args"]
    docs = render({"worker": {"drainGraceSeconds": 600}})
    assert by_kind(docs, "StatefulSet")[0]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"] == 630
    # PDBs allow one pod at a time: a single router never blocks a node drain.
    pdbs = {d["metadata"]["name"]: d["spec"] for d in by_kind(render(), "PodDisruptionBudget")}
    assert all(spec == {"maxUnavailable": 1, "selector": spec["selector"]}
               for spec in pdbs.values()), pdbs
    # A worker that is not ready (asleep, refit, draining) stays in the headless Service's DNS.
    (svc,) = [d for d in by_kind(render(), "Service") if d["spec"].get("clusterIP") == "None"]
    assert svc["spec"]["publishNotReadyAddresses"] is True


def test_admin_lease_flags():
    r = container(render(), "Deployment")
    secs = values_default()["router"]["adminLeaseSeconds"]
    assert "--router-id=$(POD_NAME)" in r["args"]
    assert f"--admin-lease-ttl-ms={secs * 1000}" in r["args"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} \
        in r["env"]
    r = container(render({"router": {"adminLeaseSeconds": 0}}), "Deployment")
    assert not any(a.startswith("--admin-lease") for a in r["args"])


def test_model_init_container():
    assert not any("initContainers" in d["spec"]["template"]["spec"] for d in render()
                   if d["kind"] in ("StatefulSet", "Deployment"))
    cmd = ["huggingface-cli", "download", "Qwen/Qwen3-0.6B", "--local-dir", "/models/current"]
    docs = render({"model": {"init": {"image": "hf-cli:1", "command": cmd,
                                      "env": [{"name": "HF_HOME", "value": "/models/.hf"}]}}})
    validate_all(docs)
    for kind in ("StatefulSet", "Deployment"):
        (init,) = by_kind(docs, kind)[0]["spec"]["template"]["spec"]["initContainers"]
        assert init["image"] == "hf-cli:1" and init["command"] == cmd
        assert {"name": "models", "mountPath": "/models"} in init["volumeMounts"]
        assert init["securityContext"]["runAsNonRoot"] is True


def test_service_monitor():
    docs = render({"serviceMonitor": {"enabled": True, "interval": "30s"}})
    validate_all(docs)
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]
    assert sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "fleet"
    # Every Service it selects exposes a port named `metrics`.
    for svc in by_kind(docs, "Service"):
        assert "metrics" in [p["name"] for p in svc["spec"]["ports"]], svc


def test_keys_from_secrets_as_files():
    docs = render()
    for kind in ("Deployment", "StatefulSet"):
        c = container(docs, kind)
        assert not [a for a in c["args"] if "api-key" in a], c["args"]
        assert not [e for e in (c.get("env") or []) if "KEY" in e["name"]], c.get("env")
    docs = render({"adminKeySecret": "fleet-admin", "apiKeySecret": "fleet-data"})
    validate_all(docs)
    for kind in ("Deployment", "StatefulSet"):
        c = container(docs, kind)
        # The keys are files from the Secrets, named by --*-key-file; never a value in argv/env.
        assert "--admin-api-key-file=/etc/rlfleet/keys/admin-api-key" in c["args"], c["args"]
        assert "--api-key-file=/etc/rlfleet/keys/api-key" in c["args"], c["args"]
        assert not [a for a in c["args"] if a.startswith(("--api-key=", "--admin-api-key="))]
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["keys"]["mountPath"] == "/etc/rlfleet/keys" and mounts["keys"]["readOnly"]
        pod = next(d for d in docs if d["kind"] == kind)["spec"]["template"]["spec"]
        vol = next(v for v in pod["volumes"] if v["name"] == "keys")
        secrets = {s["secret"]["name"]: s["secret"]["items"] for s in vol["projected"]["sources"]}
        assert secrets == {"fleet-admin": [{"key": "admin-api-key", "path": "admin-api-key"}],
                           "fleet-data": [{"key": "api-key", "path": "api-key"}]}, secrets
        # Readable by the non-root user through the pod's group.
        assert vol["projected"]["defaultMode"] == 0o440
        assert pod["securityContext"]["fsGroup"] == c["securityContext"]["runAsUser"]


def test_gpu_resources():
    docs = render({"worker": {"gpus": 2}})
    validate_all(docs)
    res = container(docs, "StatefulSet")["resources"]
    assert str(res["limits"]["nvidia.com/gpu"]) == "2", res
    docs = render({"worker": {"gpus": 0, "backend": "cpu"}})
    validate_all(docs)
    res = container(docs, "StatefulSet")["resources"]
    assert "nvidia.com/gpu" not in (res.get("limits") or {}), res
    assert "--backend=cpu" in container(docs, "StatefulSet")["args"]


def test_other_options_render_valid_manifests():
    docs = render({"model": {"pvc": "models"}, "worker": {"replicas": 3, "batchInvariant": True,
                                                          "extraArgs": ["--threads=8"]},
                   # Two routers: each would need its own store, so memory only.
                   "router": {"replicas": 2, "workerDiscovery": "static",
                              "persistence": {"enabled": False}},
                   "image": {"tag": "v1"}})
    validate_all(docs)
    (sts,) = by_kind(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 3
    vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert vols["models"]["persistentVolumeClaim"]["claimName"] == "models"
    args = container(docs, "StatefulSet")["args"]
    assert "--batch-invariant" in args and "--threads=8" in args
    assert container(docs, "StatefulSet")["image"].endswith(":v1")
    assert len([a for a in container(docs, "Deployment")["args"] if a.startswith("--worker")]) == 3


# The router's data-plane values and the flags they set.
ROUTER_FLAGS = {"maxInFlight": "max-in-flight", "maxQueued": "max-queued",
                "maxStreamBufferBytes": "max-stream-buffer-bytes",
                "blockingThreads": "blocking-threads", "adminThreads": "admin-threads"}


def binary_defaults(binary):
    """{flag: default} from `BINARY --help` in the build tree."""
    path = Path(os.environ.get("RL_BUILD_DIR", ROOT / "build")) / "bin" / binary
    assert path.exists(), f"{path} is not built (build it, or set RL_BUILD_DIR)"
    out = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    defaults = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("--") and line.endswith(")") and "(default: " in line:
            defaults[parts[0][2:]] = line.rsplit("(default: ", 1)[1][:-1]
    return defaults


def test_router_admission_and_thread_flags():
    router = values_default()["router"]
    # The chart's defaults are the binary's.
    defaults = binary_defaults("rl-router")
    for key, flag in ROUTER_FLAGS.items():
        assert str(router[key]) == defaults[flag], (key, router[key], defaults[flag])
    args = container(render(), "Deployment")["args"]
    for key, flag in ROUTER_FLAGS.items():
        assert f"--{flag}={router[key]}" in args, (flag, args)
    custom = {"maxInFlight": 64, "maxQueued": 0, "maxStreamBufferBytes": 68719476736,
              "blockingThreads": 4, "adminThreads": 1}
    docs = render({"router": custom})
    validate_all(docs)
    args = container(docs, "Deployment")["args"]
    for key, flag in ROUTER_FLAGS.items():
        assert f"--{flag}={custom[key]}" in args, (flag, args)


def test_router_max_version_lag():
    """Off by default (-1, the binary's default: no flag); set, the router bounds staleness."""
    router = values_default()["router"]
    assert router["maxVersionLag"] == -1
    assert binary_defaults("rl-router")["max-version-lag"] == "-1"
    args = container(render(), "Deployment")["args"]
    assert not [a for a in args if a.startswith("--max-version-lag")]
    docs = render({"router": {"maxVersionLag": 2}})
    validate_all(docs)
    assert "--max-version-lag=2" in container(docs, "Deployment")["args"]
    assert "--max-version-lag=0" in container(render({"router": {"maxVersionLag": 0}}),
                                              "Deployment")["args"]


def test_router_state_on_a_claim():
    """On by default: a claim, mounted at --cache-dir, the store bounded to 90% of it, the
    Recreate strategy; an existing claim is used as is; off: memory only."""
    docs = render()
    validate_all(docs)
    (claim,) = by_kind(docs, "PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    (router,) = by_kind(docs, "Deployment")
    assert router["spec"]["strategy"] == {"type": "Recreate"}
    args = container(docs, "Deployment")["args"]
    assert "--cache-dir=/var/lib/rl-router" in args
    assert f"--max-cache-disk-bytes={10 * (1 << 30) * 9 // 10}" in args
    volumes = {v["name"]: v for v in router["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    docs = render({"router": {"persistence": {"existingClaim": "mine"}}})
    assert not by_kind(docs, "PersistentVolumeClaim")
    (router,) = by_kind(docs, "Deployment")
    volumes = {v["name"]: v for v in router["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == "mine"
    docs = render({"router": {"persistence": {"enabled": False}, "replicas": 2}})
    validate_all(docs)
    assert not by_kind(docs, "PersistentVolumeClaim")
    assert not [a for a in container(docs, "Deployment")["args"] if a.startswith("--cache-dir")]
    with pytest.raises(helm.HelmError) as e:
        render({"router": {"replicas": 2}})
    assert "replicas: 1" in str(e.value)


@pytest.mark.parametrize("bad", [
    {"worker": {"replicas": 0}},
    {"worker": {"replicas": "two"}},
    {"worker": {"backend": "tpu"}},
    {"worker": {"gpuMemoryFraction": 1.5}},
    {"image": {"pullPolicy": "Sometimes"}},
    {"router": {"port": 70000}},
    {"router": {"maxInFlight": -1}},
    {"router": {"maxQueued": -1}},
    {"router": {"maxStreamBufferBytes": 512}},
    {"router": {"blockingThreads": 65}},
    {"router": {"adminThreads": 0}},
    {"router": {"maxVersionLag": -2}},
])
def test_bad_values_are_refused_by_the_schema(bad):
    schema = json.loads((CHART / "values.schema.json").read_text())
    merged = copy.deepcopy(values_default())
    for k, v in bad.items():
        merged[k].update(v)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merged, schema)
    # Helm applies the same schema at install time.
    with pytest.raises(helm.HelmError) as e:
        render(bad)
    assert "schema" in str(e.value).lower(), e.value


def test_grafana_dashboard_config_map():
    assert not by_kind(render(), "ConfigMap")
    docs = render({"grafanaDashboard": {"enabled": True}})
    validate_all(docs)
    (cm,) = by_kind(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["rlfleet.json"]) == json.loads(DASHBOARD.read_text())
    # Which metrics the panels query is checked against live processes in tests/interop.
    assert len([p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]) >= 10


def test_smg_gateway_renders_one_worker_url_per_worker():
    assert not [d for d in render() if d["metadata"]["name"].endswith("-smg")]
    docs = render({"smg": {"enabled": True, "chatTemplate": "/models/t.jinja"},
                   "worker": {"replicas": 3}, "model": {"pvc": "models"}})
    validate_all(docs)
    smg = {d["kind"]: d for d in docs if d["metadata"]["name"].endswith("-smg")}
    assert sorted(smg) == ["Deployment", "PodDisruptionBudget", "Service"]
    (c,) = smg["Deployment"]["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[:2] == ["smg", "launch"] and "--chat-template=/models/t.jinja" in args
    urls = args[args.index("--worker-urls") + 1:]
    (sts,) = by_kind(docs, "StatefulSet")
    name, port = sts["metadata"]["name"], values_default()["worker"]["port"]
    assert urls == [f"grpc://{name}-{i}.{name}:{port}" for i in range(3)]
    # Those names resolve: the workers' headless Service is named after the StatefulSet.
    assert sts["spec"]["serviceName"] == name
    assert [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == name
            and s["spec"].get("clusterIP") == "None"]
    # The gateway's selector matches its own pods only, not the router's or the workers'.
    labels = smg["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert smg["Service"]["spec"]["selector"].items() <= labels.items()
    assert labels["app.kubernetes.io/component"] == "smg"


def test_smg_in_front_of_the_router_sglang_port():
    """router.sglangPort sets --sglang-port and a `sglang` port on the router's Service and pod;
    smg.target: router points the gateway at it (agent episodes, docs/episodes.md); without the
    port that is refused at render time."""
    docs = render()
    assert not [a for a in container(docs, "Deployment")["args"] if "sglang" in a]
    values = {"router": {"sglangPort": 30001}, "smg": {"enabled": True, "target": "router"}}
    docs = render(values)
    validate_all(docs)
    router = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-router")]
    (c,) = router[0]["spec"]["template"]["spec"]["containers"]
    assert "--sglang-port=30001" in c["args"]
    assert {"name": "sglang", "containerPort": 30001} in c["ports"]
    (svc,) = [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-router")]
    assert {"name": "sglang", "port": 30001} in svc["spec"]["ports"]
    smg = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-smg")]
    (g,) = smg[0]["spec"]["template"]["spec"]["containers"]
    assert g["args"][g["args"].index("--worker-urls") + 1:] == \
        [f"grpc://{svc['metadata']['name']}:30001"]
    with pytest.raises(helm.HelmError) as e:
        render({"smg": {"enabled": True, "target": "router"}})
    assert "sglangPort" in str(e.value)
    with pytest.raises(helm.HelmError):
        render({"smg": {"enabled": True, "target": "elsewhere"}})
