"""`rlfleet collect-episodes` / rlfleet.collect_agent_episodes: a prompt set run as multi-turn
agent episodes (a user-supplied agent function, through the router's episode API), saved in
rl-collect's layout with a checkpoint, resumed after failures, merged into
trajectories.safetensors and the seed's trajectories.zip (docs/episodes.md)."""

import json
import os
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest

from rltest import ROOT, STORIES

TEMPLATE = ROOT / "tests" / "interop" / "smg" / "episode_template.jinja"
PROMPTS = [{"prompt": [{"role": "user", "content": f"Tell me about the {w}."}], "topic": w}
           for w in ("cat", "dog", "sun", "boat", "king")]


def write_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    return path


def three_turn_agent(session, row):
    """Two follow-ups after the first answer; a tool-style result in between."""
    messages = list(session.messages)
    for turn in range(3):
        answer = session.chat(messages)
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"The tool says {turn}. Go on."}]


def test_agent_episodes_saved_checkpointed_resumed_and_merged(tmp_path, fleet):
    from rlfleet import Client
    from rlfleet.agent_runs import collect_agent_episodes, load_trajectories_with_turns
    prompts = write_prompts(tmp_path)
    out = tmp_path / "run"
    calls = []
    lock = threading.Lock()

    def flaky(session, row):
        with lock:
            calls.append((row["topic"], session.episode_id))
        if row["topic"] == "sun" and session.episode_id.endswith(".1"):
            raise RuntimeError("the agent's tool is down")
        three_turn_agent(session, row)

    with Client(fleet["router"].address) as c:
        first = collect_agent_episodes(c, prompts, flaky, out, STORIES, n=2, concurrency=3,
                                       save_batch_size=4, chat_template_file=TEMPLATE,
                                       max_new_tokens=5, temperature=1.0, seed=7)
        assert first == {"episodes": 10, "done": 9, "failed": 1, "out": str(out)}
        assert not (out / "trajectories.zip").exists()  # not merged while one failed
        ckpt = json.loads((out / "checkpoint.json").read_text())
        assert len(ckpt["completed"]) == 9 and list(ckpt["failed"]) == ["2.1"]
        assert "tool is down" in ckpt["failed"]["2.1"]
        assert len(ckpt["shards"]) == 3  # 4 + 4 + 1 episodes
        first_ids = [eid for topic, eid in calls if topic != "sun"]
        calls.clear()
        # The rerun runs only the failed episode, then merges.
        second = collect_agent_episodes(c, prompts, three_turn_agent, out, STORIES, n=2,
                                        concurrency=3, save_batch_size=4,
                                        chat_template_file=TEMPLATE, max_new_tokens=5,
                                        temperature=1.0, seed=7)
        assert second["done"] == 10 and second["failed"] == 0 and second["samples"] == 10
        # Nothing left to run: a third run only merges again.
        third = collect_agent_episodes(c, prompts, flaky, out, STORIES, n=2,
                                       chat_template_file=TEMPLATE, max_new_tokens=5)
        assert third["samples"] == 10 and calls == []
        assert json.loads((out / "checkpoint.json").read_text())["failed"] == {}
        # The router forgot every exported episode (GetEpisode with remove).
        from rlfleet import FleetError
        with pytest.raises(FleetError) as e:
            c.get_episode(first_ids[0])
        assert "NOT_FOUND" in str(e.value) or "not held" in str(e.value)
    t = load_trajectories_with_turns(out / "trajectories.safetensors")
    assert [(int(i), int(s)) for i, s in zip(t.index, t.sample)] == \
        [(i, s) for i in range(5) for s in range(2)]
    assert list(t.group) == list(t.index)
    assert list(t.num_turns) == [6] * 10  # 3 model turns per episode: the seed's count
    assert t.raw_prompt == [r["prompt"] for r in PROMPTS for _ in range(2)]
    for k in range(len(t)):
        tokens = t.tokens[t.offsets[k]:t.offsets[k + 1]]
        mask = t.loss_mask[t.offsets[k]:t.offsets[k + 1]]
        lp = t.rollout_logprobs[t.offsets[k]:t.offsets[k + 1]]
        # Three generated runs of 5 tokens (or fewer at a stop), the first right after the
        # first turn's prompt; logprobs on exactly them.
        runs = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        assert len(runs) == 6 and runs[0] == t.prompt_len[k], (k, mask)
        assert np.all(np.isnan(lp[mask == 0])) and np.all(lp[mask == 1] <= 0)
        assert t.metadata[k]["topic"] == PROMPTS[int(t.index[k])]["topic"]
        assert t.metadata[k]["branches"] == 1 and t.status[k] == "ok"
        assert len(tokens) > t.prompt_len[k]
    with zipfile.ZipFile(out / "trajectories.zip") as z:
        assert sorted(z.namelist()) == ["checkpoint.json", "trajectories.safetensors"]
        assert z.read("trajectories.safetensors") == \
            (out / "trajectories.safetensors").read_bytes()
    # rl-collect's readers take the file: info and the DataProto layout.
    from rlfleet import load_trajectories
    dp = load_trajectories(out / "trajectories.safetensors").to_dataproto()
    assert dp["batch"]["responses"].shape[0] == 10


def test_seeded_runs_sample_the_same_episodes(tmp_path, fleet):
    from rlfleet import Client
    from rlfleet.agent_runs import collect_agent_episodes
    from rlfleet.trajectories import load_trajectories
    prompts = write_prompts(tmp_path)
    runs = []
    with Client(fleet["router"].address) as c:
        for name in ("a", "b"):
            collect_agent_episodes(c, prompts, three_turn_agent, tmp_path / name, STORIES,
                                   chat_template_file=TEMPLATE, max_new_tokens=4,
                                   temperature=1.0, seed=11)
            runs.append(load_trajectories(tmp_path / name))
    assert runs[0].tokens.tolist() == runs[1].tokens.tolist()


def test_cli_runs_an_agent_file_and_refuses_bad_input(tmp_path, fleet):
    prompts = write_prompts(tmp_path)
    agent = tmp_path / "my_agent.py"
    agent.write_text("def run(session, row):\n"
                     "    m = list(session.messages)\n"
                     "    a = session.chat(m)\n"
                     "    session.chat(m + [{'role': 'assistant', 'content': a},\n"
                     "                      {'role': 'user', 'content': 'More.'}])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "rlfleet", "collect-episodes", "--router",
                               fleet["router"].address, "--prompts", str(prompts), "--model",
                               str(STORIES), "--chat-template", str(TEMPLATE), *args],
                              capture_output=True, text=True, timeout=300, env=env)

    r = cli("--agent", f"{agent}:run", "--out", str(tmp_path / "out"), "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 5
    assert (tmp_path / "out" / "trajectories.zip").exists()
    r = cli("--agent", f"{agent}:nothing", "--out", str(tmp_path / "x"))
    assert r.returncode == 1 and "no function nothing" in r.stderr
    (tmp_path / "bad.jsonl").write_text('{"prompt": "not messages"}\n')
    r = subprocess.run([sys.executable, "-m", "rlfleet", "collect-episodes", "--router",
                        fleet["router"].address, "--prompts", str(tmp_path / "bad.jsonl"),
                        "--model", str(STORIES), "--chat-template", str(TEMPLATE), "--agent",
                        f"{agent}:run", "--out", str(tmp_path / "y")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 1 and "not a list of chat messages" in r.stderr


@pytest.mark.parametrize("bad", [{"n": 0}, {"concurrency": 0}, {"save_batch_size": 0}])
def test_bounds_are_checked_before_anything_runs(tmp_path, bad):
    from rlfleet.agent_runs import collect_agent_episodes
    with pytest.raises(ValueError):
        collect_agent_episodes(None, write_prompts(tmp_path), three_turn_agent, tmp_path / "o",
                               STORIES, chat_template_file=TEMPLATE, **bad)
