"""Incremental chat-template tokenization for chain rollouts.

A chain rollout keeps ONE growing token sequence per trajectory: the prompt ids, then each
turn's sampled ids verbatim (never decoded and re-encoded: BPE re-tokenization is not an
identity, AgentFly section 3), then the ids that close the assistant turn and the ids of
the next observation message.  :class:`ChatTokenizer` computes those pieces from the
tokenizer's own chat template without re-rendering past turns::

    chat = ChatTokenizer(policy.tokenizer)
    ids = chat.prompt_ids([{"role": "system", ...}, {"role": "user", "content": obs0}])
    gen = await policy.generate(ids, sampling)                   # mask 1
    ids += gen.token_ids
    ids += chat.close_assistant_ids(gen.token_ids)               # mask 0 ([] or [eot])
    ids += chat.append_ids([{"role": "user", "content": obs1}])  # mask 0, ends with the generation prompt

How ``append_ids`` works (the suffix method): render ``dummy + new_messages`` and ``dummy``,
where ``dummy`` is a short conversation ending with a closed assistant message; check that
the second string is a prefix of the first (else :class:`TokenizationError`); cut the first
string right after the dummy assistant's end-of-turn token, so the remainder holds the
template's boundary text after that token (ChatML's ``"\\n"`` after ``<|im_end|>``), the new
messages and the next generation prompt; tokenize the remainder alone.  Hugging Face
tokenizers split the text at added/special tokens before BPE, so the tokens of text that
follows a special token do not depend on what came before it: the remainder's ids are
exactly the ids a fresh render of the whole conversation has there.  The constructor checks
this property on the tokenizer at hand.

Template quirks handled: templates that inject a default system prompt when the first
message is not a system message (SmolLM2) and templates that render the LAST assistant turn
differently from earlier ones (Qwen3 adds an empty ``<think>`` block to an assistant message
after the last user query): several dummy conversations are tried, the first whose render is
a string prefix of the extended render is used (and remembered).

Cleanliness: the suffix must depend on the new messages only, never on the dummy's text.  A
template that renders an EARLIER message again inside the new turn (Mistral-style templates put
the system message into the last user turn) would otherwise leak the dummy's placeholder
(``"You are a helpful assistant."``) into every observation.  So each dummy is also rendered
with different placeholder texts (same roles, another reply too) and the two suffixes are compared, once per
sequence of new roles; a dummy whose suffix changes is not used, the next candidate is tried
(for Mistral-style templates one without a system message, whose suffix is the bare
observation turn), and when no candidate is clean :meth:`ChatTokenizer.append_ids` raises
:class:`TokenizationError` instead of returning foreign text.  With such a template the
system message of a chain stays where the initial prompt put it (the first user turn); a fresh
render of the whole conversation would move it to the last user turn, which no incremental
scheme can do without re-rendering the past (:attr:`ChatTokenizer.system_moves` says so).

Native tool calling (:mod:`agentfly_gym.tools`): :meth:`ChatTokenizer.prompt_ids` and
:meth:`ChatTokenizer.append_ids` take ``tools`` (OpenAI function schemas), passed to the template as its
``tools`` variable in every render (the dummies' too), and ``role: "tool"`` result messages are appended like
any observation message.  A template that ignores ``tools`` (:attr:`ChatTokenizer.renders_tools` False) gets them
described in the system message instead (:meth:`ChatTokenizer.with_tools`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from ..errors import TokenizationError
from ._compat import backend_encode, backend_encoder

__all__ = ["ChatTokenizer"]

log = logging.getLogger(__name__)

_SYSTEM = "You are a helpful assistant."
_USER = "Hello."
_MARK = "AFGdummyReply"  # the dummy assistant content, located in renders by this marker
# Other placeholder texts of the same roles: a clean suffix does not change when they replace the above.
_SYSTEM_ALT = "Answer as a careful agent."
_USER_ALT = "Good morning!"
_MARK_ALT = "AFGotherReply"


def _tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    return json.dumps(list(tools), sort_keys=True, default=str) if tools else ""


class ChatTokenizer:
    """Incremental tokenization of a chat conversation with a Hugging Face chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (e.g. ``policy.tokenizer``), or a
            :class:`~agentfly_gym.rollout.light_tokenizer.LightTokenizer` (same ids, no transformers).
        system_prompt_in_dummy: whether the dummy conversations of :meth:`append_ids` start
            with a system message (True suits templates that inject a default system prompt;
            the result is the same for ChatML templates either way).
        chat_template_kwargs: extra variables for every render (e.g. Qwen3's
            ``{"enable_thinking": False}``); the generation prompt of :meth:`append_ids` then
            matches :meth:`prompt_ids`'.

    Attributes:
        tokenizer: the tokenizer.
        eot_token_id: the assistant end-of-turn token (``<|im_end|>`` for ChatML / Qwen / SmolLM2),
            found by rendering an assistant message: the first special token after its content.
        eot_token: its text.
        fast_encode: whether :meth:`encode` may take the ids from the ``tokenizers`` backend directly
            (same ids, less CPU); False for slow tokenizers, subclasses that change transformers'
            encode path, and transformers versions whose code was not checked.
        fast_encode_refused: why ``fast_encode`` is False (``""`` when it is True).
        system_moves: True when the template renders a system message somewhere else once the
            conversation grows (Mistral-style: inside the LAST user turn), so a chain, which keeps
            it where the initial prompt put it, differs from a fresh render of the whole
            conversation there (and only there: :meth:`append_ids` never carries it along).

    Raises:
        TokenizationError: the tokenizer has no chat template, no special token closes an
            assistant message, the tokenizer's split at that token is not context-free
            (e.g. an added token that strips the whitespace next to it), or no dummy
            conversation gives a clean suffix for a user message (see the module docstring).
    """

    def __init__(self, tokenizer: Any, *, system_prompt_in_dummy: bool = True,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TokenizationError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat "
                                    "template; ChatTokenizer needs one")
        self.tokenizer = tokenizer
        self.system_prompt_in_dummy = system_prompt_in_dummy
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.fast_encode, self.fast_encode_refused = backend_encoder(tokenizer)
        if not self.fast_encode:
            log.debug("ChatTokenizer encodes through tokenizer.encode: %s", self.fast_encode_refused)
        self._special_ids = self._find_special_ids()
        # Candidate dummy conversations (as role sequences), each ending with a closed assistant message;
        # those without a system message come last (first without system_prompt_in_dummy).
        with_system = [("system", "user", "assistant"), ("system", "assistant")]
        without = [("user", "assistant"), ("assistant",)]
        self._dummy_roles = with_system + without if system_prompt_in_dummy else without + with_system
        self._dummies = [self._conversation(r, _SYSTEM, _USER) for r in self._dummy_roles]
        self._dummy_cache: dict[tuple[int, int, str], tuple[str, int] | None] = {}
        self._clean: dict[tuple[int, tuple[Any, ...], bool, str], bool] = {}
        self._renders_tools: bool | None = None
        self._order = list(range(len(self._dummies)))
        self.eot_token_id, self.eot_token = self._find_eot()
        self._self_check()
        self.system_moves = self._system_moves()

    # ------------------------------------------------------------------ public API

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False,
               tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The chat template's text for ``messages`` (``apply_chat_template(..., tokenize=False)``), with
        ``tools`` (OpenAI function schemas) passed as the template's ``tools`` when given."""
        extra = {"tools": list(tools)} if tools else {}
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  **self.chat_template_kwargs, **extra)

    def prompt_ids(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of ``messages`` rendered with the generation prompt.

        Exactly ``tokenizer.apply_chat_template(messages, add_generation_prompt=True,
        tokenize=True, tools=tools)`` (as a flat ``list[int]``, length = prompt tokens).  For a template that
        ignores ``tools`` (:attr:`renders_tools` False, e.g. SmolLM2's), the tools are described in the system
        message instead, in the Hermes ``<tool_call>`` format (:func:`agentfly_gym.tools.hermes_tool_prompt`, as
        Qwen's templates write it).
        """
        messages = self.with_tools(messages, tools)
        extra = {"tools": list(tools)} if tools else {}
        out = self.tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True,
                                                 return_dict=False, **self.chat_template_kwargs, **extra)
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return [int(t) for t in out]

    def close_assistant_ids(self, sampled_ids: Sequence[int]) -> list[int]:
        """Ids to append (response mask 0) after a turn's sampled ids so that the assistant
        message is closed as the template renders it.

        Returns ``[]`` when ``sampled_ids`` already end with :attr:`eot_token_id`, else
        ``[eot_token_id]`` (a length cut-off, an empty reply, or a stop on another eos such
        as ``<|endoftext|>``).  ``sampled_ids`` are never altered.
        """
        if len(sampled_ids) and int(sampled_ids[-1]) == self.eot_token_id:
            return []
        return [self.eot_token_id]

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders ``tools=`` (False: it ignores them, and :meth:`prompt_ids` describes the
        tools in the system message)."""
        if self._renders_tools is None:
            probe = [{"type": "function", "function": {"name": "afg_probe_tool", "description": "probe",
                                                        "parameters": {"type": "object", "properties": {}}}}]
            conv = [{"role": "user", "content": _USER}]
            try:
                self._renders_tools = self.render(conv, True, probe) != self.render(conv, True)
            except Exception:  # noqa: BLE001  (a template that rejects tools renders none)
                self._renders_tools = False
        return self._renders_tools

    def with_tools(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """``messages`` as :meth:`prompt_ids` renders them with ``tools``: unchanged when there are none or the
        template renders them, else with the tools described at the end of the system message (one is added
        first where there is none)."""
        messages = [dict(m) for m in messages]
        if not tools or self.renders_tools:
            return messages
        from ..tools.formats import hermes_tool_prompt

        text = hermes_tool_prompt(tools)
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = f"{messages[0].get('content') or ''}\n\n{text}".lstrip("\n")
        else:
            messages.insert(0, {"role": "system", "content": text})
        return messages

    def append_ids(self, new_messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                   tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The ids that follow a CLOSED assistant turn (after its end-of-turn token) when
        ``new_messages`` (user / tool messages) are appended; ``tools`` as given to :meth:`prompt_ids`
        (the renders include them, so a template that places them by the last message is followed).

        Includes the template's boundary tokens right after the end-of-turn token (ChatML's
        ``"\\n"``), the rendered messages and, if ``add_generation_prompt``, the next
        generation prompt (``"<|im_start|>assistant\\n"``).  See the module docstring for the
        method (suffix of two renders, cut after the end-of-turn token).

        Raises:
            TokenizationError: ``new_messages`` is empty or holds an assistant message, or no
                dummy conversation renders as a string prefix of its extension (a template
                whose rendering of earlier messages depends on later ones in a way this
                method cannot extend).
        """
        new = list(new_messages)
        if not new:
            raise TokenizationError("append_ids needs at least one new message")
        roles = [m.get("role") for m in new]
        if "assistant" in roles:
            raise TokenizationError(f"append_ids appends observation messages (user/tool/system), got roles {roles}; "
                                    "assistant turns are appended as sampled ids (or action_ids)")
        return self.encode(self._remainder(new, add_generation_prompt, tools or None))

    def action_ids(self, text: str) -> list[int]:
        """Ids of an assistant reply given as text (a scripted policy's action): the content
        tokens (``tokenizer.encode(text)``, no special tokens added) followed by
        :attr:`eot_token_id`.  Append :meth:`append_ids` after them for the next observation."""
        return self.encode(text) + [self.eot_token_id]

    def encode(self, text: str) -> list[int]:
        """Exactly ``tokenizer.encode(text, add_special_tokens=False)`` (a ``list[int]`` of token ids).

        Where :attr:`fast_encode` holds, the ids come straight from the Rust ``tokenizers`` backend
        (4-5x less CPU than transformers' Python wrapper for a short action, ~2x for an observation,
        SmolLM2); that shortcut is
        taken only while the backend's state is the one transformers' call would set (no truncation,
        no padding, ``encode_special_tokens == tokenizer.split_special_tokens``) and the result is not
        longer than ``model_max_length`` (transformers then warns); any other case, and any other
        tokenizer, goes through ``tokenizer.encode``.  See :func:`._compat.backend_encoder` for the proof.
        """
        if self.fast_encode and type(text) is str:
            ids = backend_encode(self.tokenizer, text)
            if ids is not None:
                return ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    # ------------------------------------------------------------------ internals

    def _find_special_ids(self) -> set[int]:
        ids = {int(i) for i in (getattr(self.tokenizer, "all_special_ids", None) or [])}
        for tid, tok in (getattr(self.tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(tok, "special", False):
                ids.add(int(tid))
        return ids

    @staticmethod
    def _conversation(roles: Sequence[str], system: str, user: str, mark: str = _MARK) -> list[dict[str, str]]:
        text = {"system": system, "user": user, "assistant": mark}
        return [{"role": r, "content": text[r]} for r in roles]

    def _dummy_conv(self, k: int, variant: int) -> list[dict[str, str]]:
        if variant == 0:
            return self._dummies[k]
        return self._conversation(self._dummy_roles[k], _SYSTEM_ALT, _USER_ALT, _MARK_ALT)

    def _dummy(self, k: int, variant: int = 0, tools: Sequence[dict[str, Any]] | None = None) -> tuple[str, int] | None:
        """Render of dummy ``k`` (placeholder texts ``variant``; no generation prompt; with ``tools``) and the
        offset right after its assistant's end-of-turn token (-1 if absent); None where the
        template rejects it."""
        key = (k, variant, _tools_key(tools))
        if key not in self._dummy_cache:
            try:
                text = self.render(self._dummy_conv(k, variant), False, tools)
            except Exception as e:  # noqa: BLE001  (a template may reject a dummy, e.g. no user turn)
                log.debug("chat template rejects dummy %d: %s", k, e)
                self._dummy_cache[key] = None
                return None
            mark = _MARK if variant == 0 else _MARK_ALT
            m = text.rfind(mark)
            pos = text.find(self.eot_token, m + len(mark)) if m >= 0 else -1
            self._dummy_cache[key] = (text, pos + len(self.eot_token) if pos >= 0 else -1)
        return self._dummy_cache[key]

    def _suffix(self, k: int, variant: int, new: list[dict[str, Any]], add_generation_prompt: bool,
                tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The text after dummy ``k``'s end-of-turn token in the render of dummy + ``new``.

        Raises:
            ValueError: the dummy's render is not a prefix of the extended render (or is rejected).
        """
        d = self._dummy(k, variant, tools)
        if d is None or d[1] < 0:
            raise ValueError("the template rejects this dummy or renders no end-of-turn token after its reply")
        prefix, cut = d
        full = self.render(self._dummy_conv(k, variant) + new, add_generation_prompt, tools)
        if not full.startswith(prefix):
            raise ValueError(f"render of the conversation {prefix[-60:]!r} is not a prefix of its extension "
                             f"{full[max(0, len(prefix) - 60):len(prefix) + 20]!r}")
        return full[cut:]

    def _find_eot(self) -> tuple[int, str]:
        for k in range(len(self._dummies)):
            try:
                text = self.render(self._dummies[k])
            except Exception:  # noqa: BLE001
                continue
            m = text.rfind(_MARK)
            if m < 0:
                continue
            for tid in self.tokenizer.encode(text[m + len(_MARK):], add_special_tokens=False):
                if tid in self._special_ids:
                    return tid, self.tokenizer.convert_ids_to_tokens(tid)
        raise TokenizationError("cannot find the assistant end-of-turn token: no special token follows the content of "
                                "an assistant message in the chat template's render")

    def _remainder(self, new: list[dict[str, Any]], add_generation_prompt: bool,
                   tools: Sequence[dict[str, Any]] | None = None) -> str:
        errors = []
        signature = (tuple(m.get("role") for m in new), add_generation_prompt)
        for k in list(self._order):
            name = "+".join(self._dummy_roles[k])
            try:
                rem = self._suffix(k, 0, new, add_generation_prompt, tools)
            except Exception as e:  # noqa: BLE001  (a template error or a prefix mismatch: try the next dummy)
                errors.append(f"dummy {name}: {type(e).__name__}: {e}")
                continue
            key = (k, signature[0], add_generation_prompt, _tools_key(tools))
            if key not in self._clean:
                # Same roles, other placeholder texts: a clean suffix holds nothing of the dummy.
                try:
                    self._clean[key] = self._suffix(k, 1, new, add_generation_prompt, tools) == rem
                except Exception:  # noqa: BLE001
                    self._clean[key] = False
            if not self._clean[key]:
                errors.append(f"dummy {name}: the appended text depends on the earlier messages (the template "
                              f"renders an earlier message again in the new turn, e.g. the system prompt inside the "
                              f"last user turn): {rem[:120]!r}")
                continue
            if self._order[0] != k:  # try the working dummy first next time
                self._order.remove(k)
                self._order.insert(0, k)
            return rem
        raise TokenizationError("the chat template cannot be extended incrementally with messages of roles "
                                f"{list(signature[0])}: " + "; ".join(errors))

    def _system_moves(self) -> bool:
        """Whether a system message is rendered elsewhere once a turn is appended (see the class)."""
        conv = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}]
        try:
            first = self.render(conv, True)
            reply = [{"role": "assistant", "content": _MARK}, {"role": "user", "content": _USER_ALT}]
            later = self.render(conv + reply, True)
        except Exception:  # noqa: BLE001  (no system role at all: nothing can move)
            return False
        m = later.find(_MARK)
        return _SYSTEM not in later[:m] if m >= 0 and _SYSTEM in first else False

    def _self_check(self) -> None:
        """The remainder after the end-of-turn token must tokenize the same alone as in context,
        and the template must be extendable with a user message at all."""
        rem = self._remainder([{"role": "user", "content": " probe\n text "}], True)
        text, cut = self._dummy(self._order[0])  # type: ignore[misc]
        enc = self.tokenizer.encode
        if enc(text[:cut], add_special_tokens=False) + enc(rem, add_special_tokens=False) \
                != enc(text[:cut] + rem, add_special_tokens=False):
            raise TokenizationError(f"tokenizer does not split cleanly after {self.eot_token!r}: the text after it "
                                    "tokenizes differently alone than in context (an added token that strips "
                                    "neighbouring whitespace?)")
