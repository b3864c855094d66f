"""What this package relies on of transformers beyond its public API (version-guarded): what
:mod:`.light_tokenizer` mirrors of it, and the proof behind :meth:`.chat.ChatTokenizer.encode`'s shortcut.

transformers' ``AutoTokenizer`` costs the import of transformers and torch (seconds); a model-free policy
needs only the ``tokenizers`` backend and a chat template renderer.  To give exactly the ids and text that
transformers gives, :class:`~.light_tokenizer.LightTokenizer` repeats three things transformers does, read in
transformers 5.10 (``CHECKED_TRANSFORMERS``):

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

:func:`backend_encoder` says whether ``tokenizer.encode(text, add_special_tokens=False)`` may be answered by
the public ``tokenizer.backend_tokenizer`` (the Rust ``tokenizers.Tokenizer``) directly, which
:func:`backend_encode` then does: 4-5x less CPU for a short action.  That rests on a reading of transformers'
encode path (the methods :data:`ENCODE_PATH`, checked for :data:`CHECKED_TRANSFORMERS`); on any other version the
shortcut is refused (``tokenizer.encode`` is used, same ids) and tests/test_chat_encode_fast.py fails until the
path is read again (its source digests are recorded in :data:`ENCODE_PATH_SOURCES`).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from functools import lru_cache
from importlib import metadata
from typing import Any

from ..utils.versions import is_checked

__all__ = ["CHECKED_TRANSFORMERS", "MIRRORED_SOURCES", "CLASS_RULES", "ENCODE_PATH", "ENCODE_PATH_SOURCES",
           "transformers_version", "unsupported", "rebuild_backend", "class_special_defaults", "compile_template",
           "render_template", "backend_encoder", "backend_encode"]

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

#: The methods of transformers' encode path, in the order ``tokenizer.encode(text, add_special_tokens=False)`` calls
#: them (see :func:`backend_encoder`).
ENCODE_PATH = ("encode", "_get_padding_truncation_strategies", "_encode_plus", "set_truncation_and_padding",
               "_convert_encoding", "_eventual_warn_about_too_long_sequence")

#: sha256 (first 16 hex digits) of ``inspect.getsource`` of :data:`ENCODE_PATH` as ``TokenizersBackend`` has them, as
#: of the checked versions; tests/test_chat_encode_fast.py fails when one changes.
ENCODE_PATH_SOURCES = {
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.encode": "d6d59e5876c1b923",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase._get_padding_truncation_strategies":
        "17b39f61ffc95726",
    "transformers.tokenization_utils_tokenizers.TokenizersBackend._encode_plus": "9fe593dc534868a2",
    "transformers.tokenization_utils_tokenizers.TokenizersBackend.set_truncation_and_padding": "50347549d3529c88",
    "transformers.tokenization_utils_tokenizers.TokenizersBackend._convert_encoding": "df3df2013df61e2c",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase._eventual_warn_about_too_long_sequence":
        "3bca614f18848823",
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
    if v is not None and not is_checked(v, CHECKED_TRANSFORMERS):
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


# ---------------------------------------------------------------------------------------------- encode shortcut

def backend_encoder(tokenizer: Any) -> tuple[bool, str]:
    """Whether ``tokenizer.encode(text, add_special_tokens=False)`` equals
    ``tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids`` while the backend state
    matches (see :func:`backend_encode`); returns ``(ok, reason if not ok)``.

    The proof, for transformers 5.10 (``tokenization_utils_base`` / ``tokenization_utils_tokenizers``):
    ``encode`` resolves padding=False, truncation=None, max_length=None to DO_NOT_PAD / DO_NOT_TRUNCATE
    (``_get_padding_truncation_strategies`` reads no tokenizer setting for that case) and calls
    ``TokenizersBackend._encode_plus``, which does not touch a ``str`` text: it sets the backend's
    truncation and padding off (``set_truncation_and_padding``) and ``encode_special_tokens`` to
    ``split_special_tokens``, calls ``self._tokenizer.encode_batch([text], add_special_tokens=False,
    is_pretokenized=False)`` and returns the single encoding's ``ids`` (``_convert_encoding``); the only
    other effect is a warning when the ids are longer than ``model_max_length``.  The backend's ``encode``
    and ``encode_batch`` of one text run the same single-sequence encoding (``encode_char_offsets`` in
    tokenizers' bindings; tests/test_chat_encode_fast.py checks the equality).  Added tokens,
    special-token splitting, normalisation, prefix-space and legacy options all live in the backend
    object itself, so they apply on both paths.  This holds only where every method on that path is
    ``TokenizersBackend``'s own (a subclass such as CodeLlama's overrides ``_encode_plus`` and
    ``tokenize``), nothing is patched on the instance, and the backend is a ``tokenizers.Tokenizer``.
    """
    if "transformers" not in sys.modules:  # then it is no transformers tokenizer (a LightTokenizer, say): do not
        # import transformers (and torch) for a check that cannot pass
        return False, f"{type(tokenizer).__name__} is not a transformers tokenizer"
    try:
        import tokenizers
        import transformers
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError as e:
        return False, f"transformers/tokenizers not importable: {e}"
    if not is_checked(transformers.__version__, CHECKED_TRANSFORMERS):
        return False, (f"transformers {transformers.__version__}: its encode path was not checked "
                       f"(checked: {', '.join(v + 'x' for v in CHECKED_TRANSFORMERS)})")
    if not isinstance(tokenizer, TokenizersBackend):
        return False, f"{type(tokenizer).__name__} is not a TokenizersBackend (a slow or foreign tokenizer)"
    changed = [n for n in (*ENCODE_PATH, "backend_tokenizer")  # the backend property: the object _encode_plus uses
               if getattr(type(tokenizer), n) is not getattr(TokenizersBackend, n) or n in vars(tokenizer)]
    if changed:
        return False, f"{type(tokenizer).__name__} overrides {changed} of transformers' encode path"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if type(backend) is not tokenizers.Tokenizer:
        return False, f"backend {type(backend).__name__} is not a tokenizers.Tokenizer"
    if not isinstance(getattr(tokenizer, "split_special_tokens", None), bool) or \
            not isinstance(getattr(tokenizer, "model_max_length", None), int):
        return False, "split_special_tokens / model_max_length missing"
    return True, ""


def backend_encode(tokenizer: Any, text: str) -> list[int] | None:
    """``tokenizer.encode(text, add_special_tokens=False)`` from the backend directly, for a tokenizer
    :func:`backend_encoder` accepted: the ids, or None where transformers' call could differ (its backend left
    with truncation or padding on by an earlier call, ``encode_special_tokens`` unlike the tokenizer's
    ``split_special_tokens``, or more ids than ``model_max_length``, where transformers warns)."""
    bk = tokenizer.backend_tokenizer
    if bk.truncation is None and bk.padding is None and bk.encode_special_tokens == tokenizer.split_special_tokens:
        ids = bk.encode(text, add_special_tokens=False).ids
        if len(ids) <= tokenizer.model_max_length:
            return ids
    return None
