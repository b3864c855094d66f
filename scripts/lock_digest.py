"""Print the SHA-256 of pyproject.toml's dependency declarations (what requirements/lock.txt is made from).

The digest covers ``requires-python``, ``dependencies`` and ``optional-dependencies`` in a canonical form, so
edits elsewhere in pyproject.toml (descriptions, tool settings) do not make the lock stale.  Used by
scripts/lock.sh (written into the lock's header) and tests/test_lock.py (compared with it).
"""
from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path


def dependency_digest(pyproject: Path) -> str:
    project = tomllib.loads(pyproject.read_text())["project"]
    decl = {key: project.get(key) for key in ("requires-python", "dependencies", "optional-dependencies")}
    return hashlib.sha256(json.dumps(decl, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print(dependency_digest(root / "pyproject.toml"))
