"""What :mod:`.light_tokenizer` mirrors of transformers, so that it need not import it (version-guarded).

transformers' ``AutoTokenizer`` costs the import of transformers and torch (seconds); a model-free policy
needs only the ``tokenizers`` backend and a chat template renderer.  To give exactly the ids and text that
transformers gives, :class:`~.light_tokenizer.LightTokenizer` repeats three things transformers does, read in
transformers 5.10 (``_CHECKED_TRANSFORMERS``):

* the Jinja environment of ``transformers.utils.chat_template_utils._cached_compile_jinja_template``
  (sandboxed, ``trim_blocks``/``lstrip_blocks``, loop controls, its ``tojson`` filter, ``raise_exception`` and
  ``strftime_now`` globals, the ``{% generation %}`` tag) and the single-conversation path of
  ``render_jinja_template`` (messages, tools given as JSON schemas, documents, the generation prompt and extra
  variables; the named special tokens are template variables too, as ``apply_chat_template`` passes them);
* the backend rebuild of the tokenizer classes it knows (:data:`CLASS_RULES`): ``TokenizersBackend`` /
  ``PreTrainedTokenizerFast`` use tokenizer.json as it is; ``Qwen2Tokenizer.__init__`` keeps the BPE model of
  tokenizer.json but sets its own normalizer (NFC), pre-tokenizer (its split regex + byte-level) and decoder
  (byte-level), defaults unk/eos/pad to ``<|endoftext|>`` and adds every named/extra special token as a special
  added token;
* ``TokenizersBackend._decode`` (the backend's decode; the WordPiece space clean-up, which it skips for BPE).

Anything else (another tokenizer class, an unchecked transformers version, a config this mirror does not
read) makes :func:`unsupported` say why, and the caller loads the tokenizer with transformers instead.
tests/test_light_tokenizer.py compares the ids and text with ``AutoTokenizer``'s and fails on a transformers
version whose mirrored functions changed (their source digests are recorded in ``MIRRORED_SOURCES``).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from importlib import metadata
from typing import Any

__all__ = ["CHECKED_TRANSFORMERS", "MIRRORED_SOURCES", "CLASS_RULES", "transformers_version", "unsupported",
           "rebuild_backend", "class_special_defaults", "compile_template", "render_template"]

#: transformers versions whose code this module was compared with (prefixes of ``transformers.__version__``).
CHECKED_TRANSFORMERS = ("5.10.",)

#: sha256 (first 16 hex digits) of ``inspect.getsource`` of the transformers objects mirrored here, as of the
#: checked versions; tests/test_light_tokenizer.py fails when one changes (then re-read it and update both).
MIRRORED_SOURCES = {
    "transformers.utils.chat_template_utils._cached_compile_jinja_template": "02aacc7ef6805f98",
    "transformers.utils.chat_template_utils.render_jinja_template": "8795eff8ca21cab9",
    "transformers.models.qwen2.tokenization_qwen2.Qwen2Tokenizer.__init__": "2f5116681c14aa5b",
    "transformers.tokenization_utils_tokenizers.TokenizersBackend._decode": "8572e715e3f3b20b",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.apply_chat_template": "e1cb409b5552cad8",
}

#: Tokenizer classes (``tokenizer_class`` of tokenizer_config.json) whose loading this module mirrors.
CLASS_RULES = ("TokenizersBackend", "PreTrainedTokenizerFast", "Qwen2Tokenizer")

# Qwen2Tokenizer's pre-tokenizer regex (transformers 5.10, models/qwen2/tokenization_qwen2.py).
_QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                            r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# The BPE settings Qwen2Tokenizer.__init__ builds its model with (only vocab and merges come from the file).
_QWEN2_BPE = {"dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
              "fuse_unk": False, "byte_fallback": False}


def transformers_version() -> str | None:
    """The installed transformers' version (from its package metadata, without importing it); None if absent."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def unsupported(config: dict[str, Any], backend_json: dict[str, Any]) -> str:
    """Why this mirror cannot load a tokenizer folder exactly as transformers does (``""`` when it can).

    Args:
        config: tokenizer_config.json's content.
        backend_json: tokenizer.json's content.
    """
    v = transformers_version()
    if v is not None and not v.startswith(CHECKED_TRANSFORMERS):
        return (f"transformers {v} is installed; its tokenizer loading was checked for "
                f"{', '.join(c + 'x' for c in CHECKED_TRANSFORMERS)} only")
    cls = config.get("tokenizer_class") or "PreTrainedTokenizerFast"
    if cls not in CLASS_RULES:
        return f"tokenizer_class {cls!r} is not one of {CLASS_RULES}"
    if config.get("backend", "tokenizers") != "tokenizers":
        return f"backend {config.get('backend')!r} is not 'tokenizers'"
    model = backend_json.get("model") or {}
    if cls == "Qwen2Tokenizer":
        if model.get("type") != "BPE":
            return f"Qwen2Tokenizer with a {model.get('type')!r} model (transformers rebuilds a BPE one)"
        diff = {k: model.get(k) for k, v in _QWEN2_BPE.items() if model.get(k) != v}
        if diff:
            return f"Qwen2Tokenizer with BPE settings {diff} (transformers rebuilds them as {_QWEN2_BPE})"
    if config.get("clean_up_tokenization_spaces") and model.get("type") != "BPE":
        return "clean_up_tokenization_spaces with a non-BPE model (transformers' WordPiece clean-up is not mirrored)"
    for key in ("add_bos_token", "add_eos_token"):
        if config.get(key):  # transformers then rewrites the post-processor
            return f"{key}=true (transformers rewrites the post-processor; not mirrored)"
    # Added tokens named by the config must be those of tokenizer.json (transformers would add the others).
    in_file = {int(t["id"]): (t["content"], bool(t.get("special"))) for t in backend_json.get("added_tokens", [])}
    for tid, tok in (config.get("added_tokens_decoder") or {}).items():
        if in_file.get(int(tid)) != (tok.get("content"), bool(tok.get("special"))):
            return f"added token {tid} {tok.get('content')!r} of tokenizer_config.json is not so in tokenizer.json"
    return ""


def class_special_defaults(tokenizer_class: str) -> dict[str, str | None]:
    """The named special tokens a tokenizer class sets when tokenizer_config.json does not name them."""
    if tokenizer_class == "Qwen2Tokenizer":
        return {"unk_token": "<|endoftext|>", "bos_token": None, "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>"}
    return {}


def rebuild_backend(backend: Any, tokenizer_class: str, config: dict[str, Any], special_tokens: list[str]) -> None:
    """Change ``backend`` (a ``tokenizers.Tokenizer`` read from tokenizer.json) in place as the
    ``tokenizer_class``'s constructor does (see the module docstring)."""
    if tokenizer_class != "Qwen2Tokenizer":
        return
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers

    add_prefix_space = config.get("add_prefix_space")
    backend.decoder = decoders.ByteLevel()
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=bool(add_prefix_space) if add_prefix_space is not None else False,
                                 use_regex=False),
    ])
    backend.add_special_tokens([AddedToken(t, special=True) for t in special_tokens])


# ---------------------------------------------------------------------------------------------- chat templates

@lru_cache(maxsize=32)
def compile_template(source: str) -> Any:
    """A compiled Jinja chat template, in the environment transformers renders chat templates in."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses it to mark the
        assistant's tokens for ``return_assistant_tokens_mask``, which this mirror does not offer)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):  # noqa: A002  (the name templates call it with)
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render_template(source: str, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                    documents: list[dict[str, Any]] | None = None, add_generation_prompt: bool = False,
                    **variables: Any) -> str:
    """The text of one conversation rendered with a chat template, as ``render_jinja_template`` renders it.

    Raises:
        ValueError: a tool that is not a JSON schema (a dict); transformers converts Python functions.
        TypeError: a document that is not a dict.
        jinja2.TemplateError: the template raises (``raise_exception``) or does not parse.
    """
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, dict):
                raise ValueError("tools must be JSON schemas (dicts) here; transformers' apply_chat_template "
                                 "converts Python functions")
    if documents is not None:
        for document in documents:
            if not isinstance(document, dict):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    return compile_template(source).render(messages=messages, tools=tools, documents=documents,
                                           add_generation_prompt=add_generation_prompt, **variables)
