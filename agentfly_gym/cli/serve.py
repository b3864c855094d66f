"""``agentfly-gym serve``: serve an environment to other trainers' clients (OpenEnv's protocol,
:mod:`agentfly_gym.bridges.openenv_serving`)."""

from __future__ import annotations

import argparse
import asyncio

from ..utils.jsonargs import json_object

__all__ = ["serve_main"]


def serve_main(argv: list[str] | None = None) -> int:
    """``agentfly-gym serve --env ID --openenv [--host H] [--port P] [--max-sessions N] [--env-kwargs JSON]``."""
    p = argparse.ArgumentParser(prog="agentfly-gym serve", allow_abbrev=False,
                                description="serve an agentfly environment to other trainers' clients")
    p.add_argument("--env", required=True, help="environment id, e.g. WebShop-v0")
    p.add_argument("--openenv", action="store_true", help="speak OpenEnv's protocol (the only one for now)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=64, help="most concurrent client sessions")
    p.add_argument("--env-kwargs", default=None, help='JSON constructor kwargs, e.g. \'{"split": "test"}\'')
    args = p.parse_args(argv)
    if not args.openenv:
        p.error("name the protocol: --openenv (OpenEnv's WebSocket/HTTP server interface)")
    kwargs = json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}
    print(f"agentfly-gym: serving {args.env} through OpenEnv on http://{args.host}:{args.port} "
          f"(up to {args.max_sessions} sessions; Ctrl-C stops)", flush=True)
    try:
        from ..bridges.openenv_serving import serve  # needs the openenv extra

        asyncio.run(serve(args.env, host=args.host, port=args.port, env_kwargs=kwargs, max_sessions=args.max_sessions))
    except KeyboardInterrupt:
        pass
    return 0
