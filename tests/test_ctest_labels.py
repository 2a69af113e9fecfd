"""ctest labels filter: `scripts/test -L gpu|unit|python|reliability|interop` selects exactly
one group, and every discovered GoogleTest case gets both test-data variables. (The labels and
environment given to gtest_discover_tests used to be garbled, so `-L gpu` found nothing.)"""

import json
import subprocess
from pathlib import Path

from rltest import BUILD

GROUPS = ["gpu", "unit", "python", "reliability", "interop"]


def ctest(*args):
    r = subprocess.run(["ctest", *args], cwd=BUILD, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def tests_by_label():
    info = json.loads(ctest("--show-only=json-v1"))
    out = []
    for t in info["tests"]:
        if t["name"].endswith("_NOT_BUILT"):
            continue  # a binary not built here (ctest reports it as a failure by itself)
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        exe = Path(t["command"][0]).name if t.get("command") else ""
        out.append((t["name"], exe, labels, props.get("ENVIRONMENT", [])))
    return out


def test_every_test_is_in_exactly_one_group_with_the_right_label():
    tests = tests_by_label()
    assert tests
    for name, exe, labels, env in tests:
        groups = [g for g in GROUPS if g in labels]
        assert len(groups) == 1, f"{name} ({exe}): labels {labels}"
        if exe.startswith("cuda_") or exe == "weight_sync_nccl_test":
            assert groups == ["gpu"], f"{name} ({exe}): {labels}"
        if exe == "router_abort_test":
            assert groups == ["unit"], f"{name}: {labels}"
        if name in ("python_client_tests", "rlctl_tests", "worker_python_tests", "ctest_labels_test",
                    "helm_tests", "collector_e2e", "rltest_tests"):
            assert groups == ["python"], f"{name}: {labels}"
        if name == "interop_tests":
            assert groups == ["interop"], f"{name}: {labels}"
        if exe.endswith("_test"):
            names = {e.split("=", 1)[0] for e in env}
            assert {"RL_TEST_DATA", "RL_BUILD_DIR"} <= names, f"{name}: {env}"


def test_ctest_dash_l_selects_the_group():
    tests = tests_by_label()
    for group in GROUPS:
        want = sorted(n for n, _, labels, _ in tests if group in labels)
        listed = ctest("-N", "-L", group)
        got = sorted(line.split(": ", 1)[1].strip() for line in listed.splitlines()
                     if line.strip().startswith("Test") and ": " in line)
        got = [n for n in got if not n.endswith("_NOT_BUILT")]
        assert got == want, group
    # The groups the suite always has, once built.
    assert [n for n, _, labels, _ in tests if "unit" in labels]
    assert [n for n, _, labels, _ in tests if "interop" in labels] == [
        "interop_tests", "smg_interop", "smg_episode_drift"]
    assert "gpu" not in [lab for _, exe, labels, _ in tests if exe == "router_abort_test" for lab in labels]
