"""``agentfly-gym gateway``: serve a policy through the OpenAI-compatible gateway (:mod:`agentfly_gym.gateway`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

__all__ = ["ADMIN_KEY_ENV", "gateway_main"]

#: The environment variable that sets the admin key (else one is drawn and printed).
ADMIN_KEY_ENV = "AGENTFLY_GATEWAY_ADMIN_KEY"


def gateway_main(argv: list[str] | None = None) -> int:
    """``agentfly-gym gateway --policy POLICY [--host 127.0.0.1] [--port PORT] [--max-turns N] [--max-tokens N]``."""
    p = argparse.ArgumentParser(prog="agentfly-gym gateway", allow_abbrev=False,
                                description="serve a policy through an OpenAI-compatible API that records the token "
                                            "ids of every session (POST /sessions with the admin key opens one)")
    p.add_argument("--policy", required=True, help="smollm2, tiny-qwen or a local model folder")
    p.add_argument("--tokenizer", default=None, help="tokenizer of tiny-qwen (default qwen3)")
    p.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    p.add_argument("--allow-remote", action="store_true",
                   help="bind a non-loopback host (every agent that reaches it can use the policy with a valid key)")
    p.add_argument("--model-name", default="agentfly-policy", help="the model id /v1/models lists")
    p.add_argument("--max-turns", type=int, default=32, help="default turn limit of a session (calls)")
    p.add_argument("--max-tokens", type=int, default=512, help="largest max_tokens of one reply")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (bytes)")
    p.add_argument("--max-sessions", type=int, default=1024, help="most open sessions")
    p.add_argument("--seed", type=int, default=0, help="seed of the policy's sampling")
    p.add_argument("--batch-size", type=int, default=16, help="most requests the policy decodes together")
    args = p.parse_args(argv)

    from ..gateway import Gateway, serve_gateway
    from ..gateway.server import check_host
    from ..rollout.policies.factory import make_policy

    check_host(args.host, allow_remote=args.allow_remote)  # refuse before loading a model
    policy, chat = make_policy(args.policy, tokenizer=args.tokenizer, seed=args.seed, max_batch_size=args.batch_size)
    if chat is None or not hasattr(policy, "generate"):
        # an endpoint policy (openai:MODEL) returns text, a scripted one samples nothing: no ids to record
        print(f"agentfly-gym gateway: --policy {args.policy} gives no sampled token ids; name a model the gateway "
              "samples from (smollm2, tiny-qwen or a local model folder)", file=sys.stderr)
        close = getattr(policy, "close", None)
        if close is not None:
            close()
        return 2
    gateway = Gateway(policy, chat, model_name=args.model_name, max_turns=args.max_turns, max_tokens=args.max_tokens,
                      max_body_bytes=args.max_body_bytes, max_sessions=args.max_sessions,
                      admin_key=os.environ.get(ADMIN_KEY_ENV) or None)

    async def run() -> None:
        async with serve_gateway(gateway, host=args.host, port=args.port, allow_remote=args.allow_remote) as url:
            key = "from $" + ADMIN_KEY_ENV if os.environ.get(ADMIN_KEY_ENV) else gateway.admin_key
            print(f"agentfly-gym gateway: serving {args.policy} on {url} (admin key: {key}; Ctrl-C stops)", flush=True)
            await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    finally:
        close = getattr(policy, "close", None)
        if close is not None:
            close()
    return 0
