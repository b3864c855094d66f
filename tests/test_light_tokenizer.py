"""The light tokenizer of model-free policies gives exactly ``AutoTokenizer``'s text and ids, and a scripted
rollout imports neither torch nor transformers' tokenization modules.

Real tokenizers only: the bundled SmolLM2's (a ``TokenizersBackend`` folder) and the Qwen3 tokenizer of the
test data (a ``Qwen2Tokenizer`` folder, which transformers rebuilds: another pre-tokenizer and decoder than
tokenizer.json's).  Property tests compare chat templates (text and ids, with and without the generation
prompt, multi-turn, Qwen3's ``enable_thinking``), encode/decode and :class:`ChatTokenizer`'s incremental ids;
the ``_compat`` test fails on a transformers version whose mirrored code changed.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from agentfly_gym.rollout import _compat
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.light_tokenizer import LightTokenizer, UnsupportedTokenizer, load_tokenizer
from agentfly_gym.rollout.models import smollm2_dir

REPO = Path(__file__).resolve().parents[1]

SPECIALS = ["<|im_end|>", "<|im_start|>", "<|im_start|>assistant\n", "<|endoftext|>", "<think>", "</think>",
            "<tool_call>", "</tool_response>", "<|im_end", "|im_end|>", "\n", "\n\n\n", " ", "    ", "\r\n", "\t",
            "\u00a0", "\u200b", "é", "e\u0301", "Ω", "ﬁ", "😀", "👩🏽‍💻", "中文", "{{ x }}", "{% if %}", "'s",
            "  <|im_end|>  "]
texts = st.lists(st.one_of(st.text(max_size=30), st.sampled_from(SPECIALS),
                           st.text(alphabet=" \t\n\r", min_size=1, max_size=12)), max_size=8).map("".join)


def _folders(test_data) -> dict[str, Path]:
    return {"smollm2": smollm2_dir(), "qwen3": test_data / "tokenizers" / "qwen3"}


@pytest.fixture(scope="module")
def pairs(test_data):
    """``{name: (AutoTokenizer, LightTokenizer)}`` of the same folder."""
    return {n: (AutoTokenizer.from_pretrained(d), LightTokenizer.from_folder(d))
            for n, d in _folders(test_data).items()}


@st.composite
def conversations(draw):
    """A conversation: an optional system message, then alternating user/assistant turns (ending either way)."""
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(texts)})
    for i in range(draw(st.integers(1, 6))):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": draw(texts)})
    return msgs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_same_backend_and_special_tokens(pairs, name):
    auto, light = pairs[name]
    assert json.loads(light.backend_tokenizer.to_str()) == json.loads(auto.backend_tokenizer.to_str())
    assert light.special_tokens_map == auto.special_tokens_map
    assert light.all_special_tokens == auto.all_special_tokens
    assert light.all_special_ids == auto.all_special_ids
    assert {i: (t.content, t.special) for i, t in light.added_tokens_decoder.items()} == \
        {i: (t.content, t.special) for i, t in auto.added_tokens_decoder.items()}
    assert len(light) == len(auto)
    assert light.chat_template == auto.chat_template
    assert (light.model_max_length, light.split_special_tokens) == (auto.model_max_length, auto.split_special_tokens)
    assert (light.eos_token, light.eos_token_id, light.pad_token_id, light.bos_token_id) == \
        (auto.eos_token, auto.eos_token_id, auto.pad_token_id, auto.bos_token_id)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), gen=st.booleans(), thinking=st.sampled_from([None, True, False]))
def test_chat_template_text_and_ids(pairs, name, conv, gen, thinking):
    auto, light = pairs[name]
    kw = {} if thinking is None else {"enable_thinking": thinking}
    text = auto.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen, **kw)
    assert light.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen, **kw) == text
    ids = auto.apply_chat_template(conv, add_generation_prompt=gen, return_dict=False, **kw)
    assert light.apply_chat_template(conv, add_generation_prompt=gen, return_dict=False, **kw) == ids
    assert light.apply_chat_template(conv, add_generation_prompt=gen, **kw)["input_ids"] == \
        auto.apply_chat_template(conv, add_generation_prompt=gen, **kw)["input_ids"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, data=st.data())
def test_encode_decode(pairs, name, text, data):
    auto, light = pairs[name]
    ids = auto.encode(text, add_special_tokens=False)
    assert light.encode(text, add_special_tokens=False) == ids
    assert light.decode(ids) == auto.decode(ids)
    assert light.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)
    rand = data.draw(st.lists(st.integers(0, len(auto) - 1), max_size=20))
    for skip in (False, True):
        assert light.decode(rand, skip_special_tokens=skip) == auto.decode(rand, skip_special_tokens=skip)
        assert light.decode(rand, skip_special_tokens=skip, clean_up_tokenization_spaces=False) == \
            auto.decode(rand, skip_special_tokens=skip, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("name,kwargs", [("smollm2", {}), ("qwen3", {}), ("qwen3", {"enable_thinking": False})])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=texts, obs=st.lists(texts, min_size=1, max_size=4), actions=st.lists(texts, min_size=4, max_size=4))
def test_chat_tokenizer_incremental_ids(pairs, name, kwargs, system, obs, actions):
    auto, light = pairs[name]
    a, b = ChatTokenizer(auto, chat_template_kwargs=kwargs), ChatTokenizer(light, chat_template_kwargs=kwargs)
    assert not b.fast_encode  # the light tokenizer is the backend already; no transformers check is run
    assert (a.eot_token_id, a.eot_token, a.system_moves) == (b.eot_token_id, b.eot_token, b.system_moves)
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": obs[0]}]
    ids_a, ids_b = a.prompt_ids(msgs), b.prompt_ids(msgs)
    assert ids_a == ids_b
    for act, o in zip(actions, obs[1:]):
        step_a = a.action_ids(act) + a.append_ids([{"role": "user", "content": o}])
        assert b.action_ids(act) + b.append_ids([{"role": "user", "content": o}]) == step_a


def test_compat_matches_installed_transformers():
    """Fails on a transformers version this mirror was not checked for, or whose mirrored code changed:
    re-read the functions named in ``_compat.MIRRORED_SOURCES``, update ``_compat`` and the digests."""
    import transformers

    assert transformers.__version__.startswith(_compat.CHECKED_TRANSFORMERS), (
        f"transformers {transformers.__version__} is not one of {_compat.CHECKED_TRANSFORMERS}: check "
        "agentfly_gym/rollout/_compat.py against it and add it")
    changed = {}
    for qual, digest in _compat.MIRRORED_SOURCES.items():
        parts = qual.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        got = hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]
        if got != digest:
            changed[qual] = got
    assert not changed, f"transformers changed code that agentfly_gym/rollout/_compat.py mirrors: {changed}"


@pytest.mark.slow
def test_unchecked_transformers_version_falls_back(test_data, monkeypatch):
    folder = test_data / "tokenizers" / "qwen3"
    monkeypatch.setattr(_compat, "transformers_version", lambda: "99.0.0")
    with pytest.raises(UnsupportedTokenizer, match="99.0.0"):
        LightTokenizer.from_folder(folder)
    tok = load_tokenizer(folder)
    assert not isinstance(tok, LightTokenizer)
    assert type(tok).__name__ == "Qwen2Tokenizer"


def test_unknown_tokenizer_class_falls_back(test_data, tmp_path):
    src = test_data / "tokenizers" / "qwen3"
    (tmp_path / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "LlamaTokenizer"  # transformers rebuilds it otherwise: not mirrored
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedTokenizer, match="LlamaTokenizer"):
        LightTokenizer.from_folder(tmp_path)
    with pytest.raises(UnsupportedTokenizer, match="no tokenizer.json"):
        LightTokenizer.from_folder(tmp_path / "missing")


def test_unsupported_options_are_refused(pairs):
    _, light = pairs["qwen3"]
    conv = [{"role": "user", "content": "hi"}]
    with pytest.raises(NotImplementedError):
        light.apply_chat_template([conv, conv])
    with pytest.raises(NotImplementedError):
        light.apply_chat_template(conv, return_tensors="pt")
    with pytest.raises(ValueError, match="JSON schemas"):
        light.apply_chat_template(conv, tools=[len])


_PROBE = """
import json, runpy, sys
sys.argv = ["agentfly-gym"] + sys.argv[1:]
try:
    runpy.run_module("agentfly_gym", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "transformers"
               or m.startswith(("transformers.tokenization", "transformers.models")))
print("HEAVY=" + json.dumps(heavy))
"""


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["random", "expert"])
def test_scripted_rollout_imports_no_model_stack(policy, tmp_path, test_data):
    """A scripted rollout from the CLI (a fresh interpreter) leaves torch and transformers out of sys.modules."""
    smollm2_dir()  # converted once beforehand (that conversion needs transformers and torch)
    out = subprocess.run([sys.executable, "-c", _PROBE, "rollout", "--env", "Chess-v0", "--policy", policy, "-n", "2",
                          "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    heavy = json.loads(out.stdout.rsplit("HEAVY=", 1)[1].splitlines()[0])
    assert heavy == [], f"a {policy} rollout imported {heavy[:10]}"
    assert (tmp_path / "out" / "trajectories.jsonl").is_file()
