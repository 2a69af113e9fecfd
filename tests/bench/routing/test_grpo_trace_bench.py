"""Smoke run of bench/routing/grpo_trace_bench.py: smallest sizes on stories260K, every policy
of rl-router on both traces and SMG's two on the GRPO trace print a row with figures (the
default retool shape; search-r1 once), and no process is left behind."""

import re
import subprocess
import sys

from rltest import BUILD, ROOT, STORIES

ROW = r"\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+%\s+[0-9.]+\s+\d+\s+\d+\s+\d+\s+\S+\s+\d+/\d+/\d+"


def test_prints_every_row():
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "routing" / "grpo_trace_bench.py"), "--build",
         str(BUILD), "--model", str(STORIES), "--quick"],
        capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    grpo, skewed = r.stdout.split("\nskewed trace")
    grpo = grpo.split("\nGRPO trace")[1]
    for p in ("round_robin", "least_load", "affinity", "cache_aware"):
        for table in (grpo, skewed):
            assert re.search(rf"rl-router {p}{ROW}", table), f"{p}: {r.stdout}"
    for p in ("cache_aware", "round_robin"):
        assert re.search(rf"smg {p}{ROW}", grpo), f"smg {p}: {r.stdout}"
    # 2 samples x 2 turns = 4 requests per run, all served.
    for m in re.finditer(rf"(?:rl-router|smg) \w+{ROW}", r.stdout):
        assert sum(int(x) for x in m.group(0).split()[-1].split("/")) == 4, m.group(0)


def test_search_r1_trace_runs():
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "routing" / "grpo_trace_bench.py"), "--build",
         str(BUILD), "--model", str(STORIES), "--quick", "--trace", "search-r1", "--no-smg",
         "--no-skewed", "--policies", "affinity"],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trace search-r1" in r.stdout and "GRPO trace (search-r1)" in r.stdout, r.stdout
    assert re.search(rf"rl-router affinity{ROW}", r.stdout), r.stdout


def test_rejects_out_of_range_sizes():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "routing" / "grpo_trace_bench.py"),
                        "--build", str(BUILD), "--groups", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--groups must be in [1, 256]" in r.stderr, r.stderr
