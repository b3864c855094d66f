"""Resumable, verified HTTP downloads of data files (standard library ``urllib`` plus ``tqdm``).

A file is written to ``<name>.part`` next to its destination and renamed to the destination only
once it is complete and its SHA-256 matches the expected one.  An interrupted download keeps the
``.part`` file and the next call resumes it with an HTTP ``Range: bytes=N-`` request (RFC 9110
§14); a server that ignores ``Range`` (answers 200 instead of 206) is read again from the start.
A file whose checksum does not match is deleted and refused with :class:`~agentfly_gym.errors.ChecksumError`.
The ``.part`` file is locked (``flock``) while a download runs, so two processes never write one file.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..errors import ChecksumError, DownloadError

__all__ = ["CHUNK_BYTES", "download_file", "sha256_file", "offline_hint"]

#: bytes read per chunk while downloading or hashing
CHUNK_BYTES = 1 << 20
_USER_AGENT = "agentfly-gym (data download)"


def sha256_file(path: str | os.PathLike, *, progress: bool = False) -> str:
    """The SHA-256 hex digest (64 lowercase hex characters) of a file, read in 1 MiB chunks.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    p = Path(path)
    bar = _bar(p.stat().st_size, 0, f"checking {p.name}") if progress else None
    with open(p, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return h.hexdigest()


def offline_hint(dest: Path, verify: str = "agentfly-gym data verify NAME") -> str:
    """What to do when the host cannot be reached (part of every network error's message); ``verify`` is
    the command that checks the copied folder."""
    return (f"This machine seems to be offline or cannot reach the host. Run the same command on a machine with "
            f"internet access (add --dest DIR to choose the folder), copy the folder here as {dest.parent}, and run "
            f"`{verify}` on it; a partial download stays as {dest.name}.part and resumes on the next "
            "try.")


def _bar(total: int | None, initial: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                dynamic_ncols=True, leave=False)


def _content_range_start(value: str | None) -> int | None:
    m = re.match(r"bytes (\d+)-\d+/(?:\d+|\*)", value or "")
    return int(m.group(1)) if m else None


def download_file(url: str, dest: str | os.PathLike, *, sha256: str | None = None, progress: bool = True,
                  timeout: float = 60.0, verify: str = "agentfly-gym data verify NAME") -> str:
    """Download ``url`` to ``dest`` (resumably, verified) and return the file's SHA-256 hex digest.

    Args:
        url: an ``http://`` or ``https://`` URL.
        dest: the final path; its folder is created.  The download goes to ``<dest>.part`` first.
        sha256: the expected digest (64 hex characters); ``None`` accepts any content and only
            returns its digest (the caller records it).
        progress: show a tqdm progress bar (bytes) on stderr.
        timeout: seconds without any data from the server before giving up (the ``.part`` file stays).
        verify: the command that checks a copied file, named in the offline and web-page messages.

    Returns:
        The SHA-256 of the file now at ``dest``.  An existing ``dest`` is not downloaded again: it is
        checked against ``sha256`` (when given) and its digest returned.

    Raises:
        ConfigError: ``url`` is not http(s) or ``sha256`` is not 64 hex characters.
        DownloadError: the host cannot be reached, answers an HTTP error or a web page instead of the
            file, or the transfer stops early (the message says what to do; a rerun resumes).
        ChecksumError: the complete file does not match ``sha256``; it was deleted, not renamed.
    """
    from ..errors import ConfigError

    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ConfigError(f"url={url!r} is not an http:// or https:// URL")
    if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise ConfigError(f"sha256={sha256!r} is not 64 hexadecimal characters")
    expected = sha256.lower() if sha256 else None
    dest = Path(dest)
    if dest.is_file():
        digest = sha256_file(dest, progress=progress)
        if expected is not None and digest != expected:
            raise ChecksumError(f"{dest} exists but its sha256 is {digest}, not the pinned {expected}; delete it and "
                                "download again")
        return digest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    with open(part, "a+b") as f:  # one handle for lock, hash and writes (appends always go to the end)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DownloadError(f"another process is downloading {dest} (it holds {part}); wait for it to "
                                "finish") from None
        try:
            digest = _fetch_into(f, url, dest, part, progress=progress, timeout=timeout, verify=verify)
        except DownloadError:
            if part.is_file() and part.stat().st_size == 0:  # nothing to resume: leave no empty file behind
                part.unlink()
            raise
        if expected is not None and digest != expected:
            part.unlink(missing_ok=True)
            raise ChecksumError(f"{url} gave a file whose sha256 is {digest}, not the pinned {expected}: refused and "
                                f"deleted (nothing written to {dest}). The file upstream may have changed, or the "
                                "transfer was corrupted; run again, and if it persists check the data set's page.")
        os.replace(part, dest)  # still under the lock, so no other process reopens the part meanwhile
    return digest


def _fetch_into(f, url: str, dest: Path, part: Path, *, progress: bool, timeout: float, verify: str) -> str:
    """Append the rest of ``url`` to the open ``.part`` file ``f`` (resuming, or restarting), return its SHA-256."""
    f.seek(0)
    h = hashlib.sha256()
    have = 0
    while chunk := f.read(CHUNK_BYTES):
        h.update(chunk)
        have += len(chunk)
    headers = {"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    host = urllib.parse.urlsplit(url).netloc
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        size = re.fullmatch(r"bytes \*/(\d+)", e.headers.get("Content-Range") or "") if e.code == 416 else None
        if size and have and int(size.group(1)) == have:  # nothing left to send: the .part file is whole
            return h.hexdigest()
        if e.code == 416:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{url} refused the range bytes={have}- (Content-Range "
                                f"{e.headers.get('Content-Range')!r}): the partial file {part} does not fit the file "
                                "upstream and was removed; run the same command again.") from None
        raise DownloadError(f"{url} answered HTTP {e.code} {e.reason}; the file may have moved (check the data "
                            f"set's page) or the host refuses this client. Nothing was written to {dest}.") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(f"cannot download {url}: cannot reach {host} ({reason}). {offline_hint(dest, verify)}") from None
    with resp:
        status = resp.status
        ctype = (resp.headers.get("Content-Type") or "").lower()
        if ctype.startswith("text/html") and not dest.name.endswith((".html", ".htm")):
            raise DownloadError(f"{url} answered a web page (Content-Type {ctype}) instead of {dest.name}: the "
                                "host may ask for a sign-in or a confirmation, or its quota is spent. Download the "
                                f"file in a browser and put it at {dest}, then run `{verify}`.")
        if status == 206 and _content_range_start(resp.headers.get("Content-Range")) != have:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{url} answered a range other than the one asked for (Content-Range "
                                f"{resp.headers.get('Content-Range')!r}, asked bytes={have}-); the partial file "
                                "was removed: run the same command again to download it whole.")
        if status != 206 and have:  # 200: the server ignored Range: read it all again
            f.truncate(0)
            have, h = 0, hashlib.sha256()
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        bar = _bar(total, have, dest.name) if progress else None
        got = have
        try:
            while chunk := resp.read(CHUNK_BYTES):
                f.write(chunk)
                h.update(chunk)
                got += len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
            f.flush()
        except (TimeoutError, OSError, http.client.HTTPException) as e:
            raise DownloadError(f"download of {url} stopped at {got:,} of {total or '?'} bytes ({e}); run the "
                                f"same command again to resume from {part}.") from None
        finally:
            if bar is not None:
                bar.close()
        if total is not None and got < total:
            raise DownloadError(f"download of {url} stopped at {got:,} of {total:,} bytes (the connection "
                                f"closed early); run the same command again to resume from {part}.")
    return h.hexdigest()
