"""Every panel of the Grafana dashboard (helm/rlfleet/dashboards/rlfleet.json) queries metrics
that a live rl-router and rl-worker really export (scraped from their --metrics-port)."""

import json
import re
import subprocess

from rltest import BUILD, ROOT

DASHBOARD = ROOT / "helm" / "rlfleet" / "dashboards" / "rlfleet.json"



def exported_series(text):
    """Sample names in Prometheus text (histograms as _bucket / _sum / _count)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def test_every_panel_queries_exported_metrics(fleet):
    # Traffic first, so every histogram has observations.
    r = subprocess.run([str(BUILD / "bin" / "rlctl"), "--target", fleet.router, "generate",
                        "--text", "Once upon a time", "--max-new-tokens", "4"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    exported = exported_series(fleet.scrape(fleet.router_metrics))
    for port in fleet.worker_metrics:
        exported |= exported_series(fleet.scrape(port))
    assert any(n.startswith("rl_router_cache_") for n in exported), sorted(exported)
    assert any(n.startswith("rl_worker_") for n in exported), sorted(exported)

    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    queried = set()
    for p in panels:
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            names = set(re.findall(r"\brl_[a-z0-9_]+", t["expr"]))
            assert names, f"panel {p['title']!r}: {t['expr']} queries no rl_ metric"
            missing = names - exported
            assert not missing, f"panel {p['title']!r} queries {missing}, not exported"
            queried |= names
    # The dashboard covers the router, its text cache and the workers.
    for prefix in ("rl_router_requests", "rl_router_cache_", "rl_worker_"):
        assert any(q.startswith(prefix) for q in queried), prefix
