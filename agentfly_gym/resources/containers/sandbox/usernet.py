"""The network of a sandbox with ``spec.network``: its own network namespace with a user-mode network
(slirp4netns), outbound only, never the host's.

Sharing the host's network namespace (``bwrap --share-net``) would let model code reach every service
listening on the host's loopback (a py4j gateway, a model server, the OpenEnv server: code execution as
the host's user).  Instead each exec gets a fresh network namespace (bwrap's ``--unshare-net``), and
before its command runs (bwrap waits on ``--block-fd``) a ``slirp4netns`` process attaches a ``tap0``
interface to it (``--configure``: address 10.0.2.100/24, gateway 10.0.2.2, DNS 10.0.2.3 forwarded to the
host's resolver) with ``--disable-host-loopback``: connections to 10.0.2.2 (the host) are refused, and
127.0.0.1 inside is the sandbox's own loopback.  Outbound TCP/UDP goes out through the host's sockets,
like a container on Docker's bridge; nothing can connect in (no port forwarding).  slirp4netns runs as
the manager's user and ends with the exec.

Needs the ``slirp4netns`` program (Debian/Ubuntu package ``slirp4netns``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess

from ....errors import ResourceError, ResourceUnavailable

__all__ = ["UserNetwork", "find_slirp4netns"]


def find_slirp4netns() -> str:
    """The ``slirp4netns`` executable.

    Raises:
        ResourceUnavailable: not installed.
    """
    path = shutil.which("slirp4netns")
    if path is None:
        raise ResourceUnavailable(
            "a sandbox with network=True needs slirp4netns (its own network namespace with outbound-only "
            "user-mode networking; the host's network is never shared): install the system package "
            "'slirp4netns' (apt-get install slirp4netns), or use network=False or backend='docker'")
    return path


async def _read_fd(fd: int, until: bytes, timeout: float) -> bytes:
    """Read ``fd`` (closed here) until ``until`` is seen or end of file; at most ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb"))
    try:
        async with asyncio.timeout(timeout):
            try:
                return await reader.readuntil(until)
            except asyncio.IncompleteReadError as e:
                return e.partial
    finally:
        transport.close()


async def _loopback_done(pid: int, timeout: float) -> None:
    """Wait until bwrap's child ``pid`` has set up the namespace's loopback (it does so right after it
    told its pid, concurrently with us; a slirp4netns attached meanwhile makes its netlink request fail).
    The sign: ``lo`` has its IPv6 address, which the kernel adds when the link goes up, the last step
    (with IPv6 off: 127.0.0.1 in the routing table, and a short grace).  Returns early if ``pid`` ends."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            with open(f"/proc/{pid}/net/if_inet6") as f:
                if any(line.split()[-1:] == ["lo"] for line in f):
                    return
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}"):
                return
            with contextlib.suppress(OSError), open(f"/proc/{pid}/net/fib_trie") as f:
                if "127.0.0.1" in f.read():
                    await asyncio.sleep(0.05)
                    return
        except OSError:
            return
        await asyncio.sleep(0.002)


async def _uid_map_written(pid: int, timeout: float) -> None:
    """Wait until ``pid``'s user namespace has its uid map (returns early if ``pid`` ends)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            with open(f"/proc/{pid}/uid_map") as f:
                if f.read().strip():
                    return
        except OSError:
            return
        await asyncio.sleep(0.002)


class UserNetwork:
    """The slirp4netns process serving one exec's network namespace."""

    def __init__(self, proc: asyncio.subprocess.Process, exit_w: int) -> None:
        self.proc = proc
        self._exit_w = exit_w

    @classmethod
    async def attach(cls, info_r: int, block_w: int, *, timeout: float = 30.0) -> UserNetwork | None:
        """Read bwrap's child pid from ``info_r``, attach slirp4netns to its network namespace, wait until
        the interface is up, then let bwrap run the command (a byte on ``block_w``).  Both descriptors are
        closed here.  ``None`` when bwrap ended before it said its pid (its output tells why).

        Raises:
            ResourceUnavailable: no slirp4netns.
            ResourceError: slirp4netns did not come up within ``timeout`` seconds.
        """
        try:
            fd, info_r = info_r, -1  # _read_fd owns and closes it
            info = await _read_fd(fd, b"}", timeout)
            try:
                pid = int(json.loads(info.decode())["child-pid"])
            except (ValueError, KeyError, UnicodeDecodeError):
                return None
            await _loopback_done(pid, timeout)
            # root may enter any namespace; another user joins the sandbox's user namespace first (bwrap's
            # child writes its uid map after the loopback)
            userns = [] if os.geteuid() == 0 else [f"--userns-path=/proc/{pid}/ns/user"]
            if userns:
                await _uid_map_written(pid, timeout)
            ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
            exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
            try:
                proc = await asyncio.create_subprocess_exec(
                    find_slirp4netns(), "--configure", "--mtu=65520", "--disable-host-loopback",
                    f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", *userns,
                    "--netns-type=path", f"/proc/{pid}/ns/net", "tap0",
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    pass_fds=(ready_w, exit_r), start_new_session=True)
            except BaseException:
                for fd in (ready_r, exit_w):
                    os.close(fd)
                raise
            finally:
                os.close(ready_w)
                os.close(exit_r)
            net = cls(proc, exit_w)
            try:
                ready = await _read_fd(ready_r, b"1", timeout)
                if ready != b"1":
                    err = b""
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(2):
                            err = await proc.stderr.read(4000) if proc.stderr else b""
                    raise ResourceError(f"slirp4netns did not attach the sandbox's network: "
                                        f"{err.decode(errors='replace').strip()[-1000:]}")
                os.write(block_w, b"1")
            except BaseException:
                await net.close()
                raise
            return net
        except TimeoutError:
            raise ResourceError(f"slirp4netns did not attach the sandbox's network within {timeout}s") from None
        finally:
            with contextlib.suppress(OSError):
                os.close(block_w)
            if info_r >= 0:
                with contextlib.suppress(OSError):
                    os.close(info_r)

    async def close(self) -> None:
        """End slirp4netns (closing its exit descriptor; killed after 5 s).  Never raises."""
        with contextlib.suppress(OSError):
            os.close(self._exit_w)
        try:
            async with asyncio.timeout(5):
                await self.proc.wait()
        except Exception:  # noqa: BLE001 - a helper that will not exit (or a timeout) is killed
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(Exception):
                await self.proc.wait()
