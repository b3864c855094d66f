"""ChatTokenizer on four chat-template families, from template strings this test owns.

The families and the quirks that matter for incremental (suffix) tokenization:

* ChatML / Qwen: ``<|im_start|>role\\n...<|im_end|>\\n``, a boundary newline after the end-of-turn token.
* Llama-3: a system header that is always rendered (with a knowledge-date line), ``| trim`` on contents,
  ``<|eot_id|>`` and no boundary text.
* Mistral: no system role of its own: the system message is rendered inside the LAST user turn
  (``[INST] system\\n\\nuser[/INST]``), so it moves as the conversation grows; replies end on ``</s>``;
  roles must alternate (the template raises otherwise).
* Gemma: the system message is folded into the FIRST user turn; ``model`` as the assistant role;
  ``| trim``; roles must alternate.

The templates are small Jinja strings written for this test in the style of each family (not copies
of any model's file); they run on the local Qwen3 tokenizer, with each family's markers added as
special tokens (as the real tokenizers have them).

Properties (hypothesis), for a random conversation ``C`` (optional system message, 1-2 exchanges)
and a random new observation ``m``:

1. the appended ids are exactly what a fresh render of ``C + [m]`` has after ``C``'s last end-of-turn
   token (text and token ids);
2. for the Mistral style, whose template moves the system message to the last user turn, the
   appended ids are those of a fresh render WITHOUT the system message (the system message stays in
   the first turn, where the chain's initial prompt put it): never the dummy's placeholder system
   prompt, never a copy of the real one.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from agentfly_gym.errors import TokenizationError
from agentfly_gym.rollout import chat as chat_module
from agentfly_gym.rollout.chat import ChatTokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] | trim %}"
          "{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
          "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\n{{ sys }}<|eot_id|>"
          "{% for m in msgs %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}"
          "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{% endif %}")
MISTRAL = ("{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}"
           "{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}"
           "{{ bos_token }}{% for m in loop_messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
           "{% if m['role'] == 'user' %}{% if loop.last and system_message is defined %}"
           "{{ '[INST] ' + system_message + '\n\n' + m['content'] + '[/INST]' }}{% else %}"
           "{{ '[INST] ' + m['content'] + '[/INST]' }}{% endif %}"
           "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}")
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}"
         "{% set loop_messages = messages[1:] %}{% else %}{% set prefix = '' %}{% set loop_messages = messages %}"
         "{% endif %}{% for m in loop_messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('roles must alternate user/model') }}{% endif %}"
         "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
         "<start_of_turn>{{ role }}\n{{ (prefix if loop.first else '') + (m['content'] | trim) }}<end_of_turn>\n"
         "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

FAMILIES = {
    "chatml": (CHATML, {}, []),
    "llama3": (LLAMA3, {"bos_token": "<|begin_of_text|>"}, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    "mistral": (MISTRAL, {"bos_token": "<s>", "eos_token": "</s>"}, ["[INST]", "[/INST]"]),
    "gemma": (GEMMA, {"bos_token": "<bos>"}, ["<start_of_turn>", "<end_of_turn>"]),
}
EOT = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>", "gemma": "<end_of_turn>"}
PLACEHOLDERS = [chat_module._SYSTEM, chat_module._USER, chat_module._MARK, chat_module._SYSTEM_ALT,
                chat_module._USER_ALT, chat_module._MARK_ALT]


def _tokenizer(test_data, name: str, template: str | None = None):
    tmpl, specials, extra = FAMILIES[name]
    tok = AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3")
    if specials:
        tok.add_special_tokens(specials)
    if extra:
        tok.add_tokens(extra, special_tokens=True)
    tok.chat_template = template or tmpl
    return tok


@pytest.fixture(scope="module")
def chats(test_data):
    return {name: ChatTokenizer(_tokenizer(test_data, name)) for name in FAMILIES}


words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
markup = st.sampled_from(["\n", "\n\n", " ", "  ", "\t", "<|im_end|>", "[INST]", "</s>", "<end_of_turn>",
                          "<|eot_id|>", "Action: look", "ü 🎉"])
texts = st.lists(st.one_of(words, markup), max_size=4).map("".join)


def _normalised(tok, text: str) -> str:
    """``text`` as the tokenizer's normaliser leaves it (what ``decode(encode(text))`` gives back): Qwen3's is NFC,
    which maps e.g. the CJK compatibility ideograph U+2F800 to U+4E3D."""
    normalizer = tok.backend_tokenizer.normalizer
    return normalizer.normalize_str(text) if normalizer is not None else text


def _check_append(chat: ChatTokenizer, conversation: list[dict], new: dict) -> None:
    """Property 1 (and 2: the caller passes the conversation a clean append must match)."""
    tok = chat.tokenizer
    before = chat.render(conversation)
    cut = before.rfind(chat.eot_token) + len(chat.eot_token)   # right after the last reply's end-of-turn token
    full = chat.render(conversation + [new], add_generation_prompt=True)
    appended = chat.append_ids([new])
    assert full.startswith(before[:cut])
    assert tok.decode(appended) == _normalised(tok, full[cut:])  # decoding gives the normalised text back
    assert tok.encode(before[:cut], add_special_tokens=False) + appended == tok.encode(full, add_special_tokens=False)


@pytest.mark.parametrize("name", list(FAMILIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system_text=texts, with_system=st.booleans(), exchanges=st.lists(st.tuples(texts, texts), min_size=1,
                                                                         max_size=2), observation=texts)
# Found by hypothesis (both with the Mistral template; kept for every family):
# - a character the tokenizer normalises (NFC: U+2F800 -> U+4E3D): the ids are a fresh render's, the decoded text
#   is the normalised one;
# - an observation that holds a placeholder text of the dummy conversations (hypothesis draws string constants of
#   the code under test): it is the observation's own text, not a leak.
@example(system_text="", with_system=False, exchanges=[("", "")], observation="\U0002f800")
@example(system_text="", with_system=True, exchanges=[("", "")], observation=chat_module._MARK_ALT)
@example(system_text=chat_module._SYSTEM, with_system=True, exchanges=[(chat_module._USER, chat_module._MARK)],
         observation=chat_module._SYSTEM_ALT)
def test_append_matches_a_fresh_render(chats, name, system_text, with_system, exchanges, observation):
    chat = chats[name]
    system = [{"role": "system", "content": "SYS " + system_text}] if with_system else []
    turns = []
    for user, reply in exchanges:
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    new = {"role": "user", "content": observation}
    appended_text = chat.tokenizer.decode(chat.append_ids([new]))
    for p in PLACEHOLDERS:                     # never a word of the dummy conversation (unless the observation's own)
        assert appended_text.count(p) == _normalised(chat.tokenizer, observation).count(p), p
    if chat.system_moves:
        # the system message stays in the chain's first turn; the new turn carries the observation only
        assert not system or system[0]["content"] not in appended_text or system[0]["content"] in new["content"]
        _check_append(chat, turns, new)
    else:
        _check_append(chat, system + turns, new)


def test_family_details(chats):
    """End-of-turn tokens and which template moves the system message; Mistral's observation turn is bare."""
    assert {n: c.eot_token for n, c in chats.items()} == EOT
    assert {n: c.system_moves for n, c in chats.items()} == {"chatml": False, "llama3": False, "mistral": True,
                                                              "gemma": False}
    mistral = chats["mistral"]
    obs = mistral.append_ids([{"role": "user", "content": "You see a door."}])
    assert mistral.tokenizer.decode(obs) == "[INST] You see a door.[/INST]"
    # a whole Mistral chain: system + first observation, a reply that stopped on </s>, the next observation
    tok = mistral.tokenizer
    system, obs0 = "You are a text-game agent.", "You are in a hall."
    ids = mistral.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": obs0}])
    reply = tok.encode(" go north", add_special_tokens=False) + [mistral.eot_token_id]
    ids += reply + mistral.close_assistant_ids(reply) + mistral.append_ids([{"role": "user", "content": "A door."}])
    text = tok.decode(ids)
    assert text == f"<s>[INST] {system}\n\n{obs0}[/INST] go north</s>[INST] A door.[/INST]"
    assert text.count(system) == 1
    assert "helpful assistant" not in text


@pytest.mark.slow
def test_templates_that_leak_history_are_refused(test_data):
    """A template that repeats an earlier message inside every new turn has no clean suffix: refused loudly."""
    repeat_first = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'user' %}"
                    "(re: {{ messages[0]['content'] }}) {% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(TokenizationError, match="depends on the earlier messages"):
        ChatTokenizer(_tokenizer(test_data, "chatml", repeat_first))
    # one that repeats only the system message gets the suffix of a dummy without one (clean)
    repeat_system = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'user' and "
                     "messages[0]['role'] == 'system' %}[{{ messages[0]['content'] }}] {% endif %}{{ m['content'] }}"
                     "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = ChatTokenizer(_tokenizer(test_data, "chatml", repeat_system))
    assert chat.tokenizer.decode(chat.append_ids([{"role": "user", "content": "x"}])) == \
        "\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
