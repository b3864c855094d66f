"""Child process translating PDDL for the ALFWorld engine cache (run as a script, never imported by the library).

Run as ``python -P _translate_worker.py``.  Reads requests from stdin until it closes (the parent
exited or dropped it): each is an 8-byte little-endian length and a pickle of ``(domain, problem,
optimize)``; answers each on its original stdout with one status byte (``0`` ok, ``1`` error), an
8-byte length and a pickle of what ``fast_downward.pddl2sas(domain, problem, optimize=optimize)``
returned, or of the error's text.  Anything the translator prints goes to stderr, never into answers.
"""

from __future__ import annotations

import os
import pickle
import sys


def _read_exactly(f, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def main() -> int:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints of the translator go to stderr
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    import fast_downward

    while True:
        head = _read_exactly(requests, 8)
        if head is None:
            return 0
        body = _read_exactly(requests, int.from_bytes(head, "little"))
        if body is None:
            return 0
        try:
            domain, problem, optimize = pickle.loads(body)  # noqa: S301 - written by our own parent process
            status, out = 0, pickle.dumps(fast_downward.pddl2sas(domain, problem, verbose=False, optimize=optimize),
                                          protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which retries in-process
            status, out = 1, pickle.dumps(f"{type(e).__name__}: {e}")
        answers.write(bytes([status]) + len(out).to_bytes(8, "little") + out)
        answers.flush()


if __name__ == "__main__":
    sys.exit(main())
