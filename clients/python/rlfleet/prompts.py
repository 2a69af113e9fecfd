"""Prepares rl-collect's JSONL prompt set from a data set of chat messages, rendering each
conversation with the model's own chat template the way Hugging Face's apply_chat_template
does (jinja2 sandbox, trim_blocks + lstrip_blocks, loopcontrols, `tojson`, `raise_exception`,
`strftime_now`, special tokens from tokenizer_config.json).

The template is a jinja file given explicitly (`chat_template_file`, the CLI's
`--chat-template FILE`: for models that ship none, such as stories260K), else
`chat_template.jinja` in the model folder when present, else tokenizer_config.json's
`chat_template` (a string, or a list of {name, template} where "default" is used unless
`template_name` says otherwise). The special tokens always come from the model folder's
tokenizer_config.json (when it has one).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union


def load_chat_template(model_dir: Union[str, Path], template_name: Optional[str] = None,
                       chat_template_file: Optional[Union[str, Path]] = None
                       ) -> tuple[str, dict[str, str]]:
    """Returns (template source, special tokens dict) of a model folder; the source is
    `chat_template_file`'s text when given."""
    model_dir = Path(model_dir)
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    specials = {}
    for key in ["bos_token", "eos_token", "pad_token", "unk_token"]:
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            specials[key] = v
    if chat_template_file is not None:
        return Path(chat_template_file).read_text(encoding="utf-8"), specials
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.exists() and template_name is None:
        return jinja_file.read_text(), specials
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):
        by_name = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = by_name.get(template_name or "default")
    if not isinstance(tpl, str):
        raise ValueError(f"{model_dir}: no chat template (chat_template.jinja or "
                         f"tokenizer_config.json chat_template{' ' + template_name if template_name else ''}); "
                         "pass one with --chat-template FILE")
    return tpl, specials


class ChatTemplate:
    """A compiled chat template. render(messages) -> the prompt text."""

    def __init__(self, source: str, special_tokens: Optional[dict[str, str]] = None) -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
                   separators: Optional[tuple[str, str]] = None, sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self._specials = dict(special_tokens or {})

    @staticmethod
    def from_model(model_dir: Union[str, Path], template_name: Optional[str] = None,
                   chat_template_file: Optional[Union[str, Path]] = None) -> "ChatTemplate":
        return ChatTemplate(*load_chat_template(model_dir, template_name, chat_template_file))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        return str(self._template.render(messages=messages,
                                         add_generation_prompt=add_generation_prompt,
                                         **self._specials, **kwargs))


def read_rows(path: Union[str, Path]) -> Iterator[dict[str, Any]]:
    """Rows of a .parquet file (pyarrow) or a .jsonl file."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq
        for batch in pq.ParquetFile(str(path)).iter_batches():
            yield from batch.to_pylist()
    else:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as e:
                        raise ValueError(f"{path} line {n}: not JSON: {e}") from e


def prepare_prompt_set(data: Union[str, Path, Iterable[dict[str, Any]]],
                       model_dir: Union[str, Path],
                       out: Union[str, Path], messages_key: str = "prompt",
                       index_key: Optional[str] = None, add_generation_prompt: bool = True,
                       template_name: Optional[str] = None,
                       chat_template_file: Optional[Union[str, Path]] = None) -> int:
    """Writes rl-collect's JSONL: {"index", "text": rendered messages, other columns as
    metadata}. `index` is the row's `index_key` column, else its position. Returns the number
    of rows. A row without `messages_key` (a list of {role, content}) is a ValueError naming it.
    `chat_template_file` (a jinja file) replaces the model's own template.
    """
    template = ChatTemplate.from_model(model_dir, template_name, chat_template_file)
    rows = read_rows(data) if isinstance(data, (str, Path)) else iter(data)
    count = 0
    seen = set()
    tmp = Path(str(out) + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for pos, row in enumerate(rows):
            msgs = row.get(messages_key)
            if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
                raise ValueError(f"row {pos}: `{messages_key}` is not a list of chat messages")
            index = row[index_key] if index_key is not None else pos
            if not isinstance(index, int) or index in seen:
                raise ValueError(f"row {pos}: index {index!r} is not a unique integer")
            seen.add(index)
            meta = {k: v for k, v in row.items() if k not in (messages_key, "index", "text",
                                                               "input_ids", "sampling_params")}
            try:
                text = template.render(msgs, add_generation_prompt)
            except Exception as e:  # jinja2.TemplateError and what the template raises
                raise ValueError(f"row {pos}: chat template: {e}") from e
            rec = {"index": index, "text": text, **meta}
            f.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            count += 1
    tmp.replace(out)
    return count
