"""rlfleet command line: prepare a prompt set, inspect or export collector output.

  python -m rlfleet prepare-prompts --data DATA.parquet|.jsonl --model DIR --out prompts.jsonl
        [--messages-key prompt] [--index-key K] [--template-name NAME] [--chat-template FILE]
  python -m rlfleet info DIR|FILE.safetensors
  python -m rlfleet export-parquet DIR|FILE.safetensors OUT.parquet
  python -m rlfleet collect-episodes --router ADDR --prompts FILE --agent MODULE:FUNC|FILE.py:FUNC
        --model DIR --out DIR [--n N] [--concurrency C] [--save-batch-size B]
        [--messages-key prompt] [--chat-template FILE] [--max-new-tokens N] [--temperature T]
        [--seed S] [--api-key-file F] [--no-merge]
"""

import argparse
import json
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rlfleet")
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare-prompts", help="JSONL prompt set from chat messages")
    pp.add_argument("--data", required=True)
    pp.add_argument("--model", required=True, help="folder with tokenizer_config.json")
    pp.add_argument("--out", required=True)
    pp.add_argument("--messages-key", default="prompt")
    pp.add_argument("--index-key")
    pp.add_argument("--template-name")
    pp.add_argument("--chat-template", metavar="FILE",
                    help="jinja chat template (as Hugging Face's chat_template) instead of the "
                         "model's own")
    pi = sub.add_parser("info", help="summary of collector output")
    pi.add_argument("path")
    pe = sub.add_parser("export-parquet", help="collector output to Parquet")
    pe.add_argument("path")
    pe.add_argument("out")
    pc = sub.add_parser("collect-episodes",
                        help="run a prompt set as agent episodes (rlfleet.agent_runs)")
    pc.add_argument("--router", required=True, help="rl-router address HOST:PORT")
    pc.add_argument("--prompts", required=True, help="JSONL or Parquet rows of chat messages")
    pc.add_argument("--agent", required=True, help="MODULE:FUNCTION or FILE.py:FUNCTION, called "
                    "as agent(session, row) per episode")
    pc.add_argument("--model", required=True, help="folder with the tokenizer / chat template")
    pc.add_argument("--out", required=True)
    pc.add_argument("--n", type=int, default=1, help="episodes per prompt")
    pc.add_argument("--concurrency", type=int, default=8)
    pc.add_argument("--save-batch-size", type=int, default=64, help="episodes per shard")
    pc.add_argument("--messages-key", default="prompt")
    pc.add_argument("--chat-template", metavar="FILE")
    pc.add_argument("--max-new-tokens", type=int)
    pc.add_argument("--temperature", type=float)
    pc.add_argument("--seed", type=int, help="per-turn seeds derived from it (same on a rerun)")
    pc.add_argument("--api-key-file", help="file holding the router's data key")
    pc.add_argument("--no-merge", action="store_true",
                    help="keep the shards; no trajectories.safetensors / trajectories.zip")
    a = p.parse_args(argv)
    try:
        if a.cmd == "prepare-prompts":
            from rlfleet.prompts import prepare_prompt_set
            n = prepare_prompt_set(a.data, a.model, a.out, a.messages_key, a.index_key,
                                   template_name=a.template_name,
                                   chat_template_file=a.chat_template)
            print(json.dumps({"rows": n, "out": a.out}))
        elif a.cmd == "info":
            from rlfleet.trajectories import load_trajectories
            t = load_trajectories(a.path)
            ok = t.ok
            print(json.dumps({"samples": len(t), "ok": int(ok.sum()), "failed": int((~ok).sum()),
                              "tokens": int(len(t.tokens)),
                              "groups": int(len(set(t.group.tolist())))}))
        elif a.cmd == "export-parquet":
            from rlfleet.trajectories import load_trajectories
            load_trajectories(a.path).to_parquet(a.out)
            print(json.dumps({"out": a.out}))
        elif a.cmd == "collect-episodes":
            from rlfleet.agent_runs import collect_agent_episodes, load_agent
            from rlfleet.client import Client
            key = None
            if a.api_key_file:
                with open(a.api_key_file, encoding="utf-8") as f:
                    key = f.read().strip()
            opts = {k: v for k, v in (("max_new_tokens", a.max_new_tokens),
                                      ("temperature", a.temperature)) if v is not None}
            with Client(a.router, api_key=key) as client:
                summary = collect_agent_episodes(
                    client, a.prompts, load_agent(a.agent), a.out, a.model, n=a.n,
                    concurrency=a.concurrency, save_batch_size=a.save_batch_size,
                    messages_key=a.messages_key, chat_template_file=a.chat_template,
                    seed=a.seed, merge=not a.no_merge, **opts)
            print(json.dumps(summary))
            if summary["failed"]:
                return 3
    except (OSError, ValueError) as e:
        print(f"rlfleet: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
