"""Native tool calling, token-exact: ChatTokenizer with ``tools=`` and ``role: "tool"`` messages on four
chat-template families (in the style of tests/test_chat_templates.py: small Jinja templates written for this
test in each family's manner, run on the local Qwen3 tokenizer with the family's markers as special tokens), on
the real Qwen3 template and on SmolLM2's (which ignores ``tools``: the tools go into the system message).

* ChatML / Hermes (Qwen): tools in the system turn, each result in ``<tool_response>`` inside one user turn.
* Llama-3.1: tools in the FIRST USER message (the family's default), results in the ``ipython`` role, ``| trim``.
* Mistral: ``[AVAILABLE_TOOLS]`` right before the LAST user message, the system message moved there too, results
  in ``[TOOL_RESULTS]`` with their 9-character call id, replies ``" " + content + "</s>"`` with no generation prompt.
* Gemma: tools and system folded into the first user turn, results as user turns in ``<tool_response>``, ``| trim``.

Property (hypothesis): a chain built as the rollout builds it (``prompt_ids(..., tools)``, then per turn the
sampled ids verbatim, ``close_assistant_ids`` and ``append_ids(tool messages, tools)``) has 0 drifted tokens: its
ids are exactly the ids of a fresh ``apply_chat_template(whole conversation, tools=...)``, and the response mask is
1 exactly on the sampled ids.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from agentfly_gym.rollout.chat import ChatTokenizer

CHATML = (
    "{%- if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set msgs = messages[1:] %}"
    "{%- else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "{%- if tools %}<|im_start|>system\n{% if sys %}{{ sys }}\n\n{% endif %}# Tools\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\nCall a tool with <tool_call>{...}</tool_call>"
    "<|im_end|>\n{% elif sys %}<|im_start|>system\n{{ sys }}<|im_end|>\n{% endif %}"
    "{%- for m in msgs %}{% if m['role'] == 'tool' %}"
    "{% if loop.first or msgs[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or msgs[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] | trim %}"
    "{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n{% if tools %}Environment: ipython\n{% endif %}"
    "Cutting Knowledge Date: December 2023\n\n{{ sys }}<|eot_id|>"
    "{% if tools %}{% if not msgs or msgs[0]['role'] != 'user' %}"
    "{{ raise_exception('Cannot put tools in the first user message when there is no first user message!') }}"
    "{% endif %}{% endif %}"
    "{% for m in msgs %}{% if m['role'] == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% else %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if tools and loop.first %}Given the following functions, respond with a JSON for a function call "
    "{\"name\": name, \"parameters\": {...}}.\n\n{% for t in tools %}{{ t | tojson(indent=4) }}\n\n{% endfor %}{% endif %}"
    "{{ m['content'] | trim }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
MISTRAL = (
    "{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}"
    "{% set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}"
    "{{ bos_token }}{% for m in loop_messages %}"
    "{% if m['role'] == 'user' %}{% if tools and m == user_messages[-1] %}[AVAILABLE_TOOLS] {{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{% endif %}{% if m == user_messages[-1] and system_message is defined %}"
    "{{ '[INST] ' + system_message + '\n\n' + m['content'] + '[/INST]' }}{% else %}"
    "{{ '[INST] ' + m['content'] + '[/INST]' }}{% endif %}"
    "{% elif m['role'] == 'tool' %}{% if m['tool_call_id'] | length != 9 %}"
    "{{ raise_exception('tool_call_id must be 9 characters') }}{% endif %}"
    "[TOOL_RESULTS] {{ {'content': m['content'], 'call_id': m['tool_call_id']} | tojson }}[/TOOL_RESULTS]"
    "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}")
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set prefix = '' %}{% set loop_messages = messages %}"
    "{% endif %}{% if tools %}{% set prefix = prefix + 'Tools (call one as <tool_call>{...}</tool_call>):\n'"
    " + (tools | tojson) + '\n\n' %}{% endif %}{% for m in loop_messages %}"
    "{% if m['role'] == 'tool' %}<start_of_turn>user\n<tool_response>{{ m['content'] | trim }}</tool_response>"
    "<end_of_turn>\n{% else %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ (prefix if loop.first else '') + (m['content'] | trim) }}<end_of_turn>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

FAMILIES = {
    "chatml": (CHATML, {}, []),
    "llama3": (LLAMA3, {"bos_token": "<|begin_of_text|>"}, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    "mistral": (MISTRAL, {"bos_token": "<s>", "eos_token": "</s>"},
                ["[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                 "[TOOL_CALLS]"]),
    "gemma": (GEMMA, {"bos_token": "<bos>"}, ["<start_of_turn>", "<end_of_turn>"]),
}
#: what the model generates before a reply's content (Mistral's template has no generation prompt)
GEN_PREFIX = {"mistral": " "}
TRIMS = {"llama3", "gemma"}

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "description": "the first number"},
                                         "b": {"type": "integer", "description": "the second number"}},
        "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the corpus.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "description": "what to look for"}},
        "required": ["query"]}}},
]


def _tokenizer(test_data, name: str):
    tmpl, specials, extra = FAMILIES[name]
    tok = AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3")
    if specials:
        tok.add_special_tokens(specials)
    if extra:
        tok.add_tokens(extra, special_tokens=True)
    tok.chat_template = tmpl
    return tok


@pytest.fixture(scope="module")
def chats(test_data):
    out = {name: ChatTokenizer(_tokenizer(test_data, name)) for name in FAMILIES}
    out["qwen3"] = ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"),
                                 chat_template_kwargs={"enable_thinking": False})
    return out


words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
markup = st.sampled_from(["\n", "\n\n", " ", "<|im_end|>", "[INST]", "</s>", "<end_of_turn>", "<|eot_id|>",
                          "<tool_response>", "ü 🎉", "5", '{"a": 1}'])
texts = st.lists(st.one_of(words, markup), max_size=4).map("".join)
calls = st.sampled_from([
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    '{"name": "search", "parameters": {"query": "red shoes"}}',
    '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 1}, "id": "abcdefghi"}]',
    'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 7, "b": 5}}\n</tool_call>\n'
    '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>',
])
# a reply begins and ends with a visible character (as sampled text does before its end-of-turn token): then the
# template's own text tokenizes the same alone and in context, and a fresh render's ids are comparable one to one
replies = st.one_of(calls, st.tuples(st.sampled_from("AbZ<{7é"), texts, st.sampled_from(".!x}9")).map("".join))


def _chain(chat: ChatTokenizer, family: str, system: str | None, user: str,
           exchanges: list[tuple[str, list[str], bool]], tools) -> tuple[list[int], list[int], list[dict]]:
    """The rollout's chain: (ids, mask, messages)."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": user}]
    ids = list(chat.prompt_ids(messages, tools=tools))
    mask = [0] * len(ids)
    for turn, (reply, results, cut) in enumerate(exchanges):
        sampled = chat.encode(GEN_PREFIX.get(family, "") + reply) + ([] if cut else [chat.eot_token_id])
        close = chat.close_assistant_ids(sampled)
        ids += sampled + close
        mask += [1] * len(sampled) + [0] * len(close)
        messages.append({"role": "assistant", "content": reply})
        new = [{"role": "tool", "name": "add", "tool_call_id": f"{turn:05d}{k:04d}", "content": r}
               for k, r in enumerate(results)]
        app = chat.append_ids(new, tools=tools)
        ids += app
        mask += [0] * len(app)
        messages += new
    return ids, mask, messages


def _normalised(tok, text: str) -> str:
    """``text`` as the tokenizer's normaliser leaves it (what ``decode(encode(text))`` gives back; Qwen3's is NFC, so
    e.g. U+2ADD U+0338 decodes as U+2ADC): the ids still equal a fresh render's, only the decoded text differs."""
    normalizer = tok.backend_tokenizer.normalizer
    return normalizer.normalize_str(text) if normalizer is not None else text


def _check_chain(chat, family, system, user, exchanges, tools):
    ids, mask, messages = _chain(chat, family, system, user, exchanges, tools)
    tok = chat.tokenizer
    rendered = chat.with_tools(messages, tools)
    fresh = tok.apply_chat_template(rendered, tools=tools, tokenize=True, add_generation_prompt=True,
                                    return_dict=False, **chat.chat_template_kwargs)
    text = chat.render(rendered, True, tools)
    assert tok.decode(ids) == _normalised(tok, text)
    drifted = sum(a != b for a, b in zip(ids, fresh)) + abs(len(ids) - len(fresh))
    assert drifted == 0, (family, tok.decode(ids[-40:]), tok.decode(fresh[-40:]))
    # mask 1 exactly on the sampled ids: the runs of 1 decode to the replies (plus the end-of-turn ids sampled)
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    want = [chat.encode(GEN_PREFIX.get(family, "") + r) + ([] if cut else [chat.eot_token_id])
            for r, _, cut in exchanges]
    assert runs == [w for w in want if w]


@pytest.mark.parametrize("family", list(FAMILIES))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), with_system=st.booleans(), n=st.integers(1, 3))
def test_tool_chain_has_no_drift(chats, family, data, with_system, n):
    chat = chats[family]
    system = "SYS " + data.draw(texts).strip() + "." if with_system else None
    user = "Q" + data.draw(texts).rstrip() + "?"
    exchanges = []
    for _ in range(n):
        reply = data.draw(replies)
        if family in TRIMS:
            reply = reply.strip() or "x"
        results = data.draw(st.lists(texts.map(lambda s: "r" + s + "."), min_size=1, max_size=3))
        if family in TRIMS:
            results = [r.strip() for r in results]
        exchanges.append((reply, results, data.draw(st.booleans())))
    _check_chain(chat, family, system, user, exchanges, TOOLS)


def test_qwen3_tool_results_append_as_a_fresh_render_has_them(chats):
    """The real Qwen3 template: the prompt with tools is apply_chat_template's, and the ids appended for tool
    results are exactly what a fresh render of the conversation has after the reply's end-of-turn token.  (A whole
    Qwen3 chain is not compared with a fresh render: the template drops the empty ``<think>`` block of earlier
    replies, which the model did see in its generation prompt; the chain keeps what the model saw.)"""
    chat = chats["qwen3"]
    tok = chat.tokenizer
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    assert chat.prompt_ids(conv, tools=TOOLS) == tok.apply_chat_template(
        conv, tools=TOOLS, tokenize=True, add_generation_prompt=True, return_dict=False, enable_thinking=False)
    conv.append({"role": "assistant", "content": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'})
    for results in (["5"], ["5", "no hits\n\n"], ["a <|im_end|> b"]):
        new = [{"role": "tool", "content": r} for r in results]
        full = chat.render(conv + new, True, TOOLS)
        cut = full.find(chat.eot_token, full.rfind("</tool_call>")) + len(chat.eot_token)  # after the reply's end
        appended = chat.append_ids(new, tools=TOOLS)
        assert tok.decode(appended) == full[cut:]
        assert tok.encode(full[:cut], add_special_tokens=False) + appended == tok.encode(full, add_special_tokens=False)


def test_the_templates_render_the_tools(chats):
    """Each family's template renders the tools (so prompt_ids passes them through, not into the system text)."""
    for name, chat in chats.items():
        assert chat.renders_tools, name
        text = chat.tokenizer.decode(chat.prompt_ids([{"role": "user", "content": "hi"}], tools=TOOLS))
        assert '"name": "add"' in text and '"search"' in text, name
    qwen = chats["qwen3"]
    ids = qwen.append_ids([{"role": "tool", "content": "5"}], tools=TOOLS)
    assert qwen.tokenizer.decode(ids) == ("\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
                                          "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    mistral = chats["mistral"]
    ids = mistral.append_ids([{"role": "tool", "content": "5", "tool_call_id": "000010000"}], tools=TOOLS)
    assert mistral.tokenizer.decode(ids) == '[TOOL_RESULTS] {"content": "5", "call_id": "000010000"}[/TOOL_RESULTS]'


def test_template_without_tools_gets_them_in_the_system_message(test_data):
    """A ChatML template with no ``tools`` support (as SmolLM2's): the tools are described in the system message
    in the Hermes format, and the chain still has no drift."""
    tok = AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3")
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = ChatTokenizer(tok)
    assert not chat.renders_tools
    text = tok.decode(chat.prompt_ids([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}],
                                      tools=TOOLS))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text
    assert "<tool_call>" in text
    _check_chain(chat, "chatml", "Be brief.", "2+3?",
                 [('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', ["5"], False),
                  ("It is 5.", ["unused"], True)], TOOLS)
