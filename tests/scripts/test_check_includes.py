"""scripts/check-includes on small made-up trees: every rule fails with a message naming the
files, and what the rules allow passes (a composition root wiring a subfolder that uses the
parent's interface, includes of generated or system headers)."""

import subprocess
import sys

from rltest import ROOT

SCRIPT = ROOT / "scripts" / "check-includes"


def make_tree(tmp_path, files):
    for rel, includes in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f'#include "{i}"\n' for i in includes) + "int x;\n")
    return tmp_path


def check(root):
    r = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stderr


def test_one_way_dependencies_pass(tmp_path):
    root = make_tree(tmp_path, {
        "common/status.h": [],
        "common/model_io/dtype.cc": ["common/status.h", "common/model_io/dtype.h"],
        "common/model_io/dtype.h": [],
        "common/request_limits.cc": ["common/model_io/dtype.h"],  # parent uses its child
        "services/worker/generate_host.h": ["common/status.h"],
        "services/worker/worker_server.cc": ["services/worker/worker_server.h",
                                             "services/worker/sglang/sglang_service.h"],
        "services/worker/worker_server.h": ["services/worker/generate_host.h"],
        "services/worker/main.cc": ["services/worker/worker_server.h"],
        "services/worker/sglang/sglang_service.h": ["services/worker/generate_host.h"],
        "services/worker/sglang/sglang_service.cc": ["sglang_service.h", "rl/v1/worker.pb.h"],
    })
    assert check(root) == (0, "")


def test_folders_that_include_each_other_fail(tmp_path):
    root = make_tree(tmp_path, {
        "services/router/router_server.h": ["services/admin/admin_fanout.h"],
        "services/router/worker_pool.h": [],
        "services/admin/admin_fanout.h": ["services/router/worker_pool.h"],
    })
    rc, err = check(root)
    assert rc == 1
    assert "folders include each other: services/admin <-> services/router" in err
    assert "services/admin/admin_fanout.h -> services/router/worker_pool.h" in err
    assert "services/router/router_server.h -> services/admin/admin_fanout.h" in err


def test_a_file_cycle_across_a_subfolder_fails(tmp_path):
    # The parent-child folder pair is allowed, but not a cycle of files through it (a.h/a.cc
    # count as one file).
    root = make_tree(tmp_path, {
        "services/worker/worker_server.h": [],
        "services/worker/worker_server.cc": ["services/worker/sglang/sglang_service.h"],
        "services/worker/sglang/sglang_service.h": [],
        "services/worker/sglang/sglang_service.cc": ["../worker_server.h"],
    })
    rc, err = check(root)
    assert rc == 1
    assert ("include cycle between files of different folders: "
            "services/worker/sglang/sglang_service <-> services/worker/worker_server") in err


def test_only_the_composition_root_includes_worker_server_h(tmp_path):
    root = make_tree(tmp_path, {
        "services/worker/worker_server.h": [],
        "services/worker/worker_server.cc": ["services/worker/worker_server.h"],
        "services/worker/main.cc": ["services/worker/worker_server.h"],
        "services/worker/admin_service.cc": ["services/worker/worker_server.h"],
        "tests/worker/worker_test_util.h": ["services/worker/worker_server.h"],  # not services/
    })
    rc, err = check(root)
    assert rc == 1
    lines = [line for line in err.splitlines() if "worker_server.h" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("check-includes: services/worker/admin_service.cc includes "
                               "services/worker/worker_server.h")
