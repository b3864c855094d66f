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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..errors import TokenizationError

__all__ = ["ChatTokenizer"]

log = logging.getLogger(__name__)

_SYSTEM = "You are a helpful assistant."
_USER = "Hello."
_MARK = "AFGdummyReply"  # the dummy assistant content, located in renders by this marker


class ChatTokenizer:
    """Incremental tokenization of a chat conversation with a Hugging Face chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (e.g. ``policy.tokenizer``).
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

    Raises:
        TokenizationError: the tokenizer has no chat template, no special token closes an
            assistant message, or the tokenizer's split at that token is not context-free
            (e.g. an added token that strips the whitespace next to it).
    """

    def __init__(self, tokenizer: Any, *, system_prompt_in_dummy: bool = True,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TokenizationError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat "
                                    "template; ChatTokenizer needs one")
        self.tokenizer = tokenizer
        self.system_prompt_in_dummy = system_prompt_in_dummy
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._special_ids = self._find_special_ids()
        head = [{"role": "system", "content": _SYSTEM}] if system_prompt_in_dummy else []
        asst = {"role": "assistant", "content": _MARK}
        # Candidate dummy conversations, each ending with a closed assistant message.
        self._dummies: list[list[dict[str, str]]] = [head + [{"role": "user", "content": _USER}, asst], head + [asst]]
        if not system_prompt_in_dummy:
            self._dummies.append([{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}, asst])
        self._dummy_cache: dict[int, tuple[str, int] | None] = {}
        self._order = list(range(len(self._dummies)))
        self.eot_token_id, self.eot_token = self._find_eot()
        self._self_check()

    # ------------------------------------------------------------------ public API

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        """The chat template's text for ``messages`` (``apply_chat_template(..., tokenize=False)``)."""
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  **self.chat_template_kwargs)

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Token ids of ``messages`` rendered with the generation prompt.

        Exactly ``tokenizer.apply_chat_template(messages, add_generation_prompt=True,
        tokenize=True)`` (as a flat ``list[int]``, length = prompt tokens).
        """
        out = self.tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True,
                                                 return_dict=False, **self.chat_template_kwargs)
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

    def append_ids(self, new_messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """The ids that follow a CLOSED assistant turn (after its end-of-turn token) when
        ``new_messages`` (user / tool messages) are appended.

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
        return self.tokenizer.encode(self._remainder(new, add_generation_prompt), add_special_tokens=False)

    def action_ids(self, text: str) -> list[int]:
        """Ids of an assistant reply given as text (a scripted policy's action): the content
        tokens (``tokenizer.encode(text)``, no special tokens added) followed by
        :attr:`eot_token_id`.  Append :meth:`append_ids` after them for the next observation."""
        return self.tokenizer.encode(text, add_special_tokens=False) + [self.eot_token_id]

    # ------------------------------------------------------------------ internals

    def _find_special_ids(self) -> set[int]:
        ids = {int(i) for i in (getattr(self.tokenizer, "all_special_ids", None) or [])}
        for tid, tok in (getattr(self.tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(tok, "special", False):
                ids.add(int(tid))
        return ids

    def _dummy(self, k: int) -> tuple[str, int] | None:
        """Render of dummy ``k`` (no generation prompt) and the offset right after its
        assistant's end-of-turn token (-1 if absent); None where the template rejects it."""
        if k not in self._dummy_cache:
            try:
                text = self.render(self._dummies[k])
            except Exception as e:  # noqa: BLE001  (a template may reject a dummy, e.g. no user turn)
                log.debug("chat template rejects dummy %d: %s", k, e)
                self._dummy_cache[k] = None
                return None
            m = text.rfind(_MARK)
            pos = text.find(self.eot_token, m + len(_MARK)) if m >= 0 else -1
            self._dummy_cache[k] = (text, pos + len(self.eot_token) if pos >= 0 else -1)
        return self._dummy_cache[k]

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

    def _remainder(self, new: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        errors = []
        for k in list(self._order):
            d = self._dummy(k)
            if d is None or d[1] < 0:
                continue
            prefix, cut = d
            try:
                full = self.render(self._dummies[k] + new, add_generation_prompt)
            except Exception as e:  # noqa: BLE001
                errors.append(f"dummy {k}: template error {type(e).__name__}: {e}")
                continue
            if full.startswith(prefix):
                if self._order[0] != k:  # try the working dummy first next time
                    self._order.remove(k)
                    self._order.insert(0, k)
                return full[cut:]
            errors.append(f"dummy {k}: render of the conversation {prefix[-60:]!r} is not a prefix of its "
                          f"extension {full[max(0, len(prefix) - 60):len(prefix) + 20]!r}")
        raise TokenizationError("the chat template cannot be extended incrementally with messages of roles "
                                f"{[m.get('role') for m in new]}: " + "; ".join(errors))

    def _self_check(self) -> None:
        """The remainder after the end-of-turn token must tokenize the same alone as in context,
        and the template must be extendable with a user message at all."""
        rem = self._remainder([{"role": "user", "content": " probe\n text "}], True)
        text, cut = self._dummy(self._order[0])
        enc = self.tokenizer.encode
        if enc(text[:cut], add_special_tokens=False) + enc(rem, add_special_tokens=False) \
                != enc(text[:cut] + rem, add_special_tokens=False):
            raise TokenizationError(f"tokenizer does not split cleanly after {self.eot_token!r}: the text after it "
                                    "tokenizes differently alone than in context (an added token that strips "
                                    "neighbouring whitespace?)")
