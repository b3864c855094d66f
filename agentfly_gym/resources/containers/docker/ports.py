"""Published ports of Docker containers: each ``ContainerSpec.ports`` entry on 127.0.0.1 only, its host port
chosen by the engine, read back once the container runs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ....errors import ResourceStartError

__all__ = ["port_bindings", "read_published_ports"]


def port_bindings(ports: Sequence[int]) -> dict[str, tuple[str]] | None:
    """docker-py's ``port_bindings`` for ``ContainerSpec.ports``: each TCP port on 127.0.0.1, host port
    left to the engine (``("127.0.0.1",)``), so pooled containers never collide and nothing listens
    beyond loopback."""
    return {f"{p}/tcp": ("127.0.0.1",) for p in ports} or None


def read_published_ports(api: Any, cid: str, ports: Sequence[int]) -> dict[int, tuple[str, int]]:
    """Container port -> ``("127.0.0.1", host port)`` as the engine published them (``NetworkSettings.Ports``).

    The engine fills the bindings once the container runs; read a few times in case it lags.

    Raises:
        ResourceStartError: a port has no binding on 127.0.0.1 (the container stopped at once, or the
            engine refused to publish it).
    """
    if not ports:
        return {}
    found: dict[str, Any] = {}
    for _ in range(50):
        try:
            found = (api.inspect_container(cid).get("NetworkSettings") or {}).get("Ports") or {}
        except Exception as e:  # noqa: BLE001  (reported below with what was found)
            found = {"error": str(e)}
        if all(found.get(f"{p}/tcp") for p in ports):
            break
        time.sleep(0.1)
    out: dict[int, tuple[str, int]] = {}
    for p in ports:
        bound = [b for b in found.get(f"{p}/tcp") or () if b.get("HostIp") == "127.0.0.1" and b.get("HostPort")]
        if not bound:
            raise ResourceStartError(f"container {cid[:12]}: port {p}/tcp was not published on 127.0.0.1 "
                                     f"(engine reports {found!r}); has the container exited?")
        out[p] = ("127.0.0.1", int(bound[0]["HostPort"]))
    return out
