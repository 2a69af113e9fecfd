"""rlfleet command line: prepare a prompt set, inspect or export collector output.

  python -m rlfleet prepare-prompts --data DATA.parquet|.jsonl --model DIR --out prompts.jsonl
        [--messages-key prompt] [--index-key K] [--template-name NAME] [--chat-template FILE]
  python -m rlfleet info DIR|FILE.safetensors
  python -m rlfleet export-parquet DIR|FILE.safetensors OUT.parquet
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
    except (OSError, ValueError) as e:
        print(f"rlfleet: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
