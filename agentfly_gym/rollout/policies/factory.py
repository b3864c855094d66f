"""Build a policy (and the chat tokenizer that goes with it) from a short name.

Names: ``smollm2`` (the bundled SmolLM2-135M-Instruct on CPU, batched), ``tiny-qwen``
(a random tiny Qwen2 on the Qwen3 tokenizer, for plumbing tests), a local model folder,
``random`` (random admissible action), ``expert`` (the env's expert) and ``openai:MODEL`` (any
OpenAI-compatible chat endpoint serving MODEL at ``base_url``, with the key from ``api_key_env``:
:class:`~agentfly_gym.rollout.policies.endpoint_policy.EndpointPolicy`, which needs the ``openai`` package).  Scripted policies
still need a tokenizer to turn their actions into token ids: ``tokenizer=`` names a folder,
by default the bundled SmolLM2's; they load it with
:func:`~agentfly_gym.rollout.light_tokenizer.load_tokenizer` (the ``tokenizers`` package, no
transformers or torch; same ids).  The bundled SmolLM2's folder is converted from its GGUF file on
first use (once, with transformers and torch; cached), for scripted policies too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...limits import check_int

__all__ = ["make_policy", "POLICY_NAMES"]

POLICY_NAMES = ("smollm2", "tiny-qwen", "random", "expert", "openai:MODEL")

#: The prefix of an endpoint policy's name: ``openai:MODEL``.
ENDPOINT_PREFIX = "openai:"


def _tokenizer_dir(tokenizer: str | None) -> Path:
    from ..models import smollm2_dir

    if tokenizer in (None, "smollm2"):
        return smollm2_dir()
    if tokenizer == "qwen3":
        from ...data.paths import DATA_ROOT_ENV

        root = os.environ.get(DATA_ROOT_ENV)
        if not root:
            raise ConfigError(f"tokenizer='qwen3' needs ${DATA_ROOT_ENV} pointing at a data root with tokenizers/qwen3")
        return Path(root) / "tokenizers" / "qwen3"
    p = Path(tokenizer).expanduser()
    if not p.is_dir():
        raise ConfigError(f"tokenizer={tokenizer!r} is neither 'smollm2', 'qwen3' nor a tokenizer folder")
    return p


def make_policy(name: str, *, tokenizer: str | None = None, seed: int | None = 0, max_batch_size: int = 16,
                torch_threads: int = 1, device: str = "cpu", dtype: Any = "auto", base_url: str | None = None,
                api_key_env: str | None = None, endpoint_options: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """``(policy, chat_tokenizer)`` for ``name`` (see the module docstring); an endpoint policy has no chat
    tokenizer (None).

    Args:
        name: a policy name or a local model folder.
        tokenizer: scripted policies' tokenizer (see the module docstring).
        seed: the policy's seed (model policies: the seeds of unseeded requests; ``random``: its draws).
        max_batch_size: model policies: most requests decoded together.
        torch_threads: model policies: torch's intra-op threads (one is fastest on a loaded 2-core machine).
        device: model policies: the torch device ("cpu", "cuda", "cuda:1").
        dtype: model policies: the weights' dtype: "auto" (bfloat16 on a GPU that supports it, else the folder's),
            "float32", "bfloat16", "float16" or a ``torch.dtype``
            (:func:`~agentfly_gym.rollout.policies.transformers_policy.resolve_dtype`).
        base_url, api_key_env: an ``openai:MODEL`` endpoint's API root and key variable (ignored otherwise).
        endpoint_options: more :class:`~agentfly_gym.rollout.policies.endpoint_policy.EndpointPolicy` arguments
            (``timeout``, ``max_retries``, ``requests_per_second``, ``token_ids``, ...).

    Raises:
        ConfigError: unknown name or missing folder; ``base_url``/``api_key_env`` with a policy that is no
            endpoint; an endpoint without the ``openai`` package; a bad ``max_batch_size``, or (model policies;
            scripted and endpoint ones ignore them) a bad ``device`` or ``dtype``, before any model is loaded.
    """
    max_batch_size = check_int("max_batch_size", max_batch_size)
    from ..chat import ChatTokenizer

    if name.startswith(ENDPOINT_PREFIX):
        model = name[len(ENDPOINT_PREFIX):]
        if not model:
            raise ConfigError(f"policy={name!r} names no model: write openai:MODEL, e.g. openai:gpt-4.1-mini")
        try:
            import openai  # noqa: F401
        except ImportError:
            raise ConfigError(f"policy={name!r} needs the openai package (pip install 'agentfly-gym[agents]' or "
                              "pip install openai)") from None
        from .endpoint_policy import EndpointPolicy

        return EndpointPolicy(model, base_url=base_url, api_key_env=api_key_env, **dict(endpoint_options or {})), None
    if base_url is not None or api_key_env is not None:
        raise ConfigError(f"policy={name!r} is not an endpoint: a base URL or an API key variable goes with "
                          "openai:MODEL only")

    if name in ("random", "expert"):
        from ..light_tokenizer import load_tokenizer
        from .baselines import ExpertPolicy, RandomPolicy

        # No model: the tokenizer is loaded without transformers/torch where it gives the same ids.
        tok = load_tokenizer(_tokenizer_dir(tokenizer))
        policy = RandomPolicy(seed=seed) if name == "random" else ExpertPolicy()
        return policy, ChatTokenizer(tok)
    from ..models import smollm2_dir, tiny_qwen_dir
    from .transformers_policy import TransformersPolicy, resolve_dtype

    torch_dtype = resolve_dtype(device, dtype)  # a bad device or dtype fails before a model folder is built

    if name == "smollm2":
        model = smollm2_dir()
    elif name == "tiny-qwen":
        model = tiny_qwen_dir(_tokenizer_dir(tokenizer or "qwen3"))
    elif Path(name).expanduser().is_dir():
        model = Path(name).expanduser()
    else:
        raise ConfigError(f"policy={name!r} is not one of {POLICY_NAMES} nor a local model folder")
    policy = TransformersPolicy(model, seed=seed, max_batch_size=max_batch_size, torch_threads=torch_threads,
                                device=device, dtype=torch_dtype)
    return policy, ChatTokenizer(policy.tokenizer)
