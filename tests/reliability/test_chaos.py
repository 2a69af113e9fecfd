"""Chaos test (ctest label `reliability`, about a minute): see chaos.py for the scenario and the
invariants. A longer soak: bench/chaos/chaos_soak.py."""

import chaos


def test_fleet_survives_kills_stops_and_admin_cycles(tmp_path):
    counts, violations = chaos.run(duration_s=40.0, log_dir=tmp_path)
    print(counts)
    assert not violations, "\n".join(violations[:20]) + f"\n(log: {counts.get('log')})"
    # The scenario really happened.
    assert counts["kills"] >= 10 and counts["stops"] >= 5 and counts["admin_cycles"] >= 5, counts
    assert counts["ok"] >= 100, counts
