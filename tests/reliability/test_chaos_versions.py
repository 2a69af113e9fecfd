"""Chaos with version constraints (ctest label `reliability`, about a minute): see
chaos_versions.py for the scenario (kills and restarts during refits from disk and in-memory
tensor pushes, clients that accept only some versions) and the invariants."""

import chaos_versions


def test_version_constraints_hold_through_kills_and_refits(tmp_path):
    counts, violations = chaos_versions.run(duration_s=40.0, log_dir=tmp_path)
    print(counts)
    assert not violations, "\n".join(violations[:20]) + f"\n(log: {counts.get('log')})"
    # The scenario really happened.
    # (a kill waits for the restart: fewer on a loaded machine)
    assert counts["kills"] >= 6 and counts["refits"] >= 3 and counts["pushes"] >= 3, counts
    assert counts["min"] >= 30 and counts["exact"] >= 10 and counts["ok"] >= 100, counts
    # Restarted workers were caught up from live peers (in-memory versions), at least at the end.
    assert counts["peer_catch_ups"] >= 1, counts
