"""rlfleet.ChatTemplate renders as Hugging Face's apply_chat_template does. `transformers` is not
in the pinned venv, so the expected texts are derived by hand from HF's rules (documented in
transformers' chat templating guide and its `_compile_jinja_template`): a sandboxed jinja2
environment with trim_blocks and lstrip_blocks (a block tag's own line leaves no newline or
indent), loopcontrols, `tojson` as json.dumps (ensure_ascii False, default separators),
`raise_exception`, and the tokenizer's special tokens as variables. The made-qwen3 interop test
(tests/interop/smg/test_episodes_qwen.py) also checks that the gateway's own renderer (SMG)
gives the same text as rlfleet for a tool conversation."""

import json

import pytest

from rltest import DATA

QWEN2 = DATA / "tokenizers" / "qwen2"


def test_real_qwen2_template_renders_as_hugging_face():
    from rlfleet import ChatTemplate
    if not (QWEN2 / "tokenizer_config.json").exists():
        pytest.fail(f"test data missing: {QWEN2} (set RL_TEST_DATA)")
    t = ChatTemplate.from_model(QWEN2)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    # Qwen1.5/2's template: the system turn (a default one when absent), each user turn followed
    # by the assistant header, each answer closed by <|im_end|>\n.
    assert t.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert t.render(messages[1:2]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi"
        "<|im_end|>\n<|im_start|>assistant\n")


def test_whitespace_control_tojson_and_errors_follow_hugging_face():
    from rlfleet import ChatTemplate
    source = (
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'user' %}\n"
        "U:{{ m['content'] }}\n"
        "    {% elif m['role'] == 'stop' %}\n"
        "        {% break %}\n"
        "    {% else %}\n"
        "{{ raise_exception('bad role ' + m['role']) }}\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "{% if tools %}T:{{ tools | tojson }}{% endif %}"
        "{{ bos_token }}")
    t = ChatTemplate(source, {"bos_token": "<s>"})
    tools = [{"name": "f", "q": "é"}]
    # trim_blocks drops the newline after each block tag, lstrip_blocks the indent before it;
    # loopcontrols' break stops the loop; tojson keeps non-ASCII and ", " / ": " separators.
    assert t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                     {"role": "stop", "content": ""}, {"role": "x", "content": ""}],
                    tools=tools) == \
        'U:a\nU:b\nT:[{"name": "f", "q": "é"}]<s>'
    assert json.dumps(tools, ensure_ascii=False) in t.render([], tools=tools)
    import jinja2
    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role x"):
        t.render([{"role": "x", "content": ""}])
