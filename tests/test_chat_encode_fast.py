"""``ChatTokenizer.encode``'s shortcut to the ``tokenizers`` backend gives exactly
``tokenizer.encode(text, add_special_tokens=False)``, and is refused wherever that is not proven.

Real tokenizers only: Qwen3 (tests/data) and SmolLM2 (bundled), where the shortcut must be taken; ByT5
(a slow, pure-Python transformers tokenizer, built from nothing) and a subclass of Qwen's tokenizer class that
overrides ``_encode_plus`` (as CodeLlama's does), where it must be refused.  Backend states that
transformers' call would change (truncation or padding left enabled by an earlier call, a changed
``split_special_tokens``) and over-long results must go through ``tokenizer.encode``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, ByT5Tokenizer

from agentfly_gym.rollout import _compat
from agentfly_gym.rollout._compat import backend_encoder
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.models import smollm2_dir

SPECIALS = ["<|im_end|>", "<|im_start|>", "<|im_start|>assistant\n", "<|endoftext|>", "<think>", "</think>",
            "<tool_call>", "</tool_response>", "<|im_end", "|im_end|>", "\n", "\n\n\n", " ", "    ", "\r\n", "\t",
            "\u00a0", "\u200b", "\u3000", "é", "e\u0301", "Ω", "ﬁ", "😀", "👩🏽‍💻", "🇫🇷", "中文",
            "   <|im_end|>  "]
texts = st.lists(st.one_of(st.text(max_size=30), st.sampled_from(SPECIALS),
                           st.text(alphabet=" \t\n\r", min_size=1, max_size=12)), max_size=8).map("".join)


def qwen3(test_data):
    return AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3")


@pytest.fixture(scope="module")
def chats(test_data):
    return {"smollm2": ChatTokenizer(AutoTokenizer.from_pretrained(smollm2_dir())),
            "qwen3": ChatTokenizer(qwen3(test_data))}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts)
def test_fast_path_is_identical(chats, name, text):
    chat = chats[name]
    assert chat.fast_encode, chat.fast_encode_refused
    expected = chat.tokenizer.encode(text, add_special_tokens=False)
    assert chat.encode(text) == expected
    assert chat.action_ids(text) == expected + [chat.eot_token_id]


def test_fast_path_keeps_special_tokens_and_append_ids(chats):
    chat = chats["qwen3"]
    im_end = chat.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chat.encode("a<|im_end|>b").count(im_end) == 1  # an added token stays one token, as in tokenizer.encode
    msgs = [{"role": "user", "content": "obs <think> x </think>\n\n  <|im_end|> 😀"}]
    remainder = chat._remainder(msgs, True)
    assert chat.append_ids(msgs) == chat.tokenizer.encode(remainder, add_special_tokens=False)


def test_slow_tokenizer_is_refused(test_data):
    chatml = qwen3(test_data).chat_template
    tok = ByT5Tokenizer(extra_ids=0, additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = chatml
    chat = ChatTokenizer(tok, chat_template_kwargs={"enable_thinking": False})
    assert not chat.fast_encode
    assert "not a TokenizersBackend" in chat.fast_encode_refused
    text = "héllo <|im_end|> 😀"
    assert chat.action_ids(text) == tok.encode(text, add_special_tokens=False) + [chat.eot_token_id]


@pytest.mark.slow
def test_overridden_encode_path_is_refused(test_data):
    base = type(qwen3(test_data))

    class Lowering(base):  # a subclass whose Python side changes the text before the backend sees it
        def _encode_plus(self, text, *args, **kwargs):
            return super()._encode_plus(text.lower() if isinstance(text, str) else text, *args, **kwargs)

    tok = Lowering.from_pretrained(test_data / "tokenizers" / "qwen3")
    chat = ChatTokenizer(tok)
    assert not chat.fast_encode
    assert "_encode_plus" in chat.fast_encode_refused
    assert chat.encode("ABC Def") == tok.encode("abc def", add_special_tokens=False) != \
        tok._tokenizer.encode("ABC Def", add_special_tokens=False).ids

    patched = qwen3(test_data)
    patched.encode = lambda text, **kw: [1, 2, 3]  # patched on the instance
    ok, why = backend_encoder(patched)
    assert not ok
    assert "'encode'" in why


@pytest.mark.slow
def test_unchecked_transformers_version_is_refused(test_data, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers, "__version__", "5.11.0")
    chat = ChatTokenizer(qwen3(test_data))
    assert not chat.fast_encode
    assert "5.11.0" in chat.fast_encode_refused


@pytest.mark.slow
def test_backend_state_transformers_would_reset_takes_the_slow_path(test_data):
    tok = qwen3(test_data)
    chat = ChatTokenizer(tok)
    text = "one two three four five six seven"
    full = tok.encode(text, add_special_tokens=False)
    assert len(full) > 3
    # An earlier call with truncation leaves it enabled on the backend; tokenizer.encode disables it again.
    tok(text, truncation=True, max_length=3)
    assert tok._tokenizer.truncation is not None
    assert chat.encode(text) == full
    tok._tokenizer.enable_padding(length=64, pad_id=0, pad_token="!")
    assert chat.encode(text) == full
    assert tok._tokenizer.padding is None
    assert tok._tokenizer.truncation is None
    # split_special_tokens changed after construction: both paths split "<|im_end|>" into pieces.
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    tok.split_special_tokens = True
    split = chat.encode("a<|im_end|>b")
    assert split == tok.encode("a<|im_end|>b", add_special_tokens=False)
    assert im_end not in split
    assert chat.encode("x<|im_end|>") == tok.encode("x<|im_end|>", add_special_tokens=False)  # now fast, same ids


def test_over_long_result_goes_through_tokenizer_encode(test_data):
    tok = qwen3(test_data)
    chat = ChatTokenizer(tok)
    calls = []
    encode = tok.encode
    tok.encode = lambda text, **kw: calls.append(text) or encode(text, **kw)  # count calls after construction
    tok.model_max_length = 4
    assert chat.encode("a b") == encode("a b", add_special_tokens=False)
    assert calls == []
    long = "one two three four five six"
    assert chat.encode(long) == encode(long, add_special_tokens=False)
    assert calls == [long]


def test_encode_path_is_the_one_read_for_this_transformers():
    """The shortcut's proof (``_compat.backend_encoder``) was read in one transformers version: fail here, not
    silently slower (every encode through transformers) or wrong, on another one or when the path changed;
    then re-read the methods named in ``_compat.ENCODE_PATH_SOURCES``, update the proof and the digests."""
    import hashlib
    import inspect

    import transformers
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    assert transformers.__version__.startswith(_compat.CHECKED_TRANSFORMERS), (
        f"transformers {transformers.__version__} is not one of {_compat.CHECKED_TRANSFORMERS}: re-read its encode "
        "path against agentfly_gym/rollout/_compat.py (backend_encoder) and add it")
    got = {}
    for name in _compat.ENCODE_PATH:
        fn = getattr(TokenizersBackend, name)
        got[f"{fn.__module__}.{fn.__qualname__}"] = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]
    assert got == _compat.ENCODE_PATH_SOURCES, "transformers' encode path changed: re-read it (see _compat)"
