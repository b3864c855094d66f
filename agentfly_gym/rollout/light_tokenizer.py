"""A tokenizer for model-free policies that needs neither transformers nor torch.

A scripted policy (``random``, ``expert``) or a drift report needs a tokenizer only to turn text into the token
ids a model would see; importing transformers' ``AutoTokenizer`` for that costs the import of transformers and
torch (seconds, more than the rollout itself).  :class:`LightTokenizer` reads the same folder (tokenizer.json
with the ``tokenizers`` package, tokenizer_config.json, chat_template.jinja) and renders the chat template with
Jinja in the environment transformers uses, so its text and ids are exactly ``AutoTokenizer``'s for the
folders it accepts (tests/test_light_tokenizer.py compares both on the SmolLM2 and Qwen3 tokenizers).  What it
mirrors of transformers lives in :mod:`._compat`; a folder it does not accept is loaded with transformers by
:func:`load_tokenizer`.

Model policies keep transformers' tokenizer (they import transformers for the model anyway).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import _compat

__all__ = ["LightTokenizer", "UnsupportedTokenizer", "load_tokenizer"]

log = logging.getLogger(__name__)

_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class UnsupportedTokenizer(ConfigError):
    """The folder cannot be loaded exactly as transformers loads it without transformers (see :mod:`._compat`)."""


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):  # a serialised AddedToken
        return value.get("content")
    return value if isinstance(value, str) or value is None else str(value)


class LightTokenizer:
    """The part of a transformers tokenizer that :class:`~agentfly_gym.rollout.chat.ChatTokenizer` and the
    drift report use, on the ``tokenizers`` backend alone.

    Build it with :meth:`from_folder`.  Same results as ``AutoTokenizer.from_pretrained(folder)`` for
    :meth:`apply_chat_template` (one conversation; ``tokenize`` True/False), :meth:`encode`, :meth:`decode`,
    :meth:`convert_ids_to_tokens`, :meth:`convert_tokens_to_ids`, ``len()``, the special-token attributes,
    :attr:`all_special_ids` and :attr:`added_tokens_decoder`.

    Attributes:
        name_or_path: the folder, as given.
        backend_tokenizer: the ``tokenizers.Tokenizer``.
        chat_template: the template's source (None when the folder has none).
        special_tokens_map: ``{"eos_token": "<|im_end|>", ...}``, the named special tokens that are set.
        model_max_length: as in tokenizer_config.json (transformers' default when absent).
        split_special_tokens: whether special-token text in the input is split like plain text.
        clean_up_tokenization_spaces: as in tokenizer_config.json (ignored for BPE models, as transformers does).
    """

    def __init__(self, backend: Any, *, name_or_path: str, chat_template: str | None,
                 special_tokens_map: dict[str, str], extra_special_tokens: Sequence[str] = (),
                 model_max_length: int = int(1e30), split_special_tokens: bool = False,
                 clean_up_tokenization_spaces: bool = False) -> None:
        self.backend_tokenizer = backend
        self.name_or_path = name_or_path
        self.chat_template = chat_template
        self.special_tokens_map = dict(special_tokens_map)
        self.extra_special_tokens = list(extra_special_tokens)
        self.model_max_length = model_max_length
        self.split_special_tokens = split_special_tokens
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        backend.encode_special_tokens = split_special_tokens
        backend.no_truncation()
        backend.no_padding()

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_folder(cls, folder: str | os.PathLike) -> LightTokenizer:
        """Load a tokenizer folder (tokenizer.json, tokenizer_config.json, optionally chat_template.jinja).

        Raises:
            UnsupportedTokenizer: no tokenizer.json, or a folder transformers loads in a way :mod:`._compat`
                does not mirror (the message says what); :func:`load_tokenizer` then uses transformers.
        """
        import tokenizers

        path = Path(folder)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise UnsupportedTokenizer(f"{str(path)!r} has no tokenizer.json")
        cfg_file = path / "tokenizer_config.json"
        config = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
        stm_file = path / "special_tokens_map.json"
        if stm_file.is_file():  # older folders name the special tokens there too; the config wins
            for k, v in json.loads(stm_file.read_text(encoding="utf-8")).items():
                config.setdefault(k, v)
        backend_json = json.loads(tj.read_text(encoding="utf-8"))
        why = _compat.unsupported(config, backend_json)
        if why:
            raise UnsupportedTokenizer(f"{str(path)!r}: {why}")
        tclass = config.get("tokenizer_class") or "PreTrainedTokenizerFast"

        named = {k: _token_str(v) for k, v in _compat.class_special_defaults(tclass).items()}
        for k in _NAMED:
            if k in config:
                named[k] = _token_str(config[k])
        special_map = {k: named[k] for k in _NAMED if named.get(k) is not None}
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
        extra = [_token_str(t) for t in (extra.values() if isinstance(extra, dict) else extra)]

        backend = tokenizers.Tokenizer.from_str(tj.read_text(encoding="utf-8"))
        all_special = list(dict.fromkeys(list(special_map.values()) + [t for t in extra if t]))
        _compat.rebuild_backend(backend, tclass, config, all_special)

        template = None
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        elif isinstance(config.get("chat_template"), str):
            template = config["chat_template"]
        elif config.get("chat_template") is not None or (path / "additional_chat_templates").is_dir():
            raise UnsupportedTokenizer(f"{str(path)!r}: several named chat templates (not mirrored)")
        mml = config.get("model_max_length")
        return cls(backend, name_or_path=str(folder), chat_template=template, special_tokens_map=special_map,
                   extra_special_tokens=[t for t in extra if t],
                   model_max_length=int(mml) if isinstance(mml, (int, float)) else int(1e30),
                   split_special_tokens=bool(config.get("split_special_tokens", False)),
                   clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)))

    # ------------------------------------------------------------------ special tokens

    def __getattr__(self, name: str) -> Any:
        # bos_token / eos_token / ... and their *_id, as transformers names them (None when unset).
        if name in _NAMED:
            return self.__dict__.get("special_tokens_map", {}).get(name)
        if name.endswith("_id") and name[:-3] in _NAMED:
            tok = self.__dict__.get("special_tokens_map", {}).get(name[:-3])
            return None if tok is None else self.backend_tokenizer.token_to_id(tok)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    @property
    def all_special_tokens(self) -> list[str]:
        """Named and extra special tokens, in transformers' order, without repeats."""
        return list(dict.fromkeys(list(self.special_tokens_map.values()) + self.extra_special_tokens))

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of :attr:`all_special_tokens`."""
        return self.convert_tokens_to_ids(self.all_special_tokens)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        """``{id: tokenizers.AddedToken}`` of the backend's added tokens."""
        return dict(sorted(self.backend_tokenizer.get_added_tokens_decoder().items()))

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    # ------------------------------------------------------------------ text <-> ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens`` applies the post-processor, e.g. a BOS token).

        Note: transformers' ``encode`` defaults ``add_special_tokens`` to True; every caller in this project
        passes False (chat templates place the special tokens themselves), which is the default here.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        ids = self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        if len(ids) > self.model_max_length:
            log.warning("token sequence length %d is longer than model_max_length %d", len(ids),
                        self.model_max_length)
        return ids

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """The text of ``token_ids`` (the backend's decode; transformers' WordPiece clean-up is never applied to
        the BPE models this class accepts, and is refused at load for others)."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self.backend_tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str | None] | None:
        """Token strings of ids (a single id gives a single string)."""
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int | None] | None:
        """Ids of token strings (a single string gives a single id; None for an unknown token)."""
        if isinstance(tokens, str):
            return self.backend_tokenizer.token_to_id(tokens)
        return [self.backend_tokenizer.token_to_id(t) for t in tokens]

    # ------------------------------------------------------------------ chat template

    def apply_chat_template(self, conversation: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            documents: list[dict[str, Any]] | None = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False, continue_final_message: bool = False,
                            tokenize: bool = True, return_dict: bool = True, **kwargs: Any) -> Any:
        """``conversation`` rendered with the chat template: the text (``tokenize=False``), its ids as a
        ``list[int]`` (``return_dict=False``) or ``{"input_ids": ids, "attention_mask": [1] * len(ids)}``, as
        transformers' ``apply_chat_template`` gives them.  ``**kwargs`` are template variables (e.g. Qwen3's
        ``enable_thinking``).

        Raises:
            NotImplementedError: a batch of conversations, ``continue_final_message``, or tokenizer options
                (padding, truncation, tensors, assistant masks): use transformers' tokenizer for those.
            ValueError: no chat template; a tool that is not a JSON schema.
            jinja2.TemplateError: the template rejects the conversation.
        """
        unsupported = {k for k in ("padding", "truncation", "max_length", "return_tensors",
                                   "return_assistant_tokens_mask", "tokenizer_kwargs") if kwargs.get(k)}
        for k in ("padding", "truncation", "max_length", "return_tensors", "return_assistant_tokens_mask",
                  "tokenizer_kwargs"):
            kwargs.pop(k, None)
        if unsupported or continue_final_message:
            raise NotImplementedError(f"LightTokenizer.apply_chat_template does not offer "
                                      f"{sorted(unsupported) or ['continue_final_message']}; use transformers")
        conv = list(conversation)
        if conv and (isinstance(conv[0], (list, tuple)) or hasattr(conv[0], "messages")):
            raise NotImplementedError("LightTokenizer.apply_chat_template renders one conversation, not a batch")
        template = chat_template or self.chat_template
        if not template:
            raise ValueError(f"tokenizer {self.name_or_path!r} has no chat template and none was passed")
        text = _compat.render_template(template, conv, tools=tools, documents=documents,
                                       add_generation_prompt=add_generation_prompt,
                                       **{**self.special_tokens_map, **kwargs})
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if return_dict else ids

    def __repr__(self) -> str:
        return f"LightTokenizer({self.name_or_path!r}, vocab={len(self)})"


def load_tokenizer(folder: str | os.PathLike, *, light: bool = True) -> Any:
    """The tokenizer of ``folder``: a :class:`LightTokenizer` where it gives transformers' ids exactly
    (``light=True``), else ``transformers.AutoTokenizer.from_pretrained(folder)``.

    Raises:
        ConfigError: the folder cannot be loaded by either (transformers' error is chained).
    """
    if light:
        try:
            return LightTokenizer.from_folder(folder)
        except UnsupportedTokenizer as e:
            log.info("loading the tokenizer with transformers: %s", e)
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ConfigError(f"tokenizer {str(folder)!r} needs transformers ({e})") from e
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load a tokenizer from {str(folder)!r}: {e}") from e
