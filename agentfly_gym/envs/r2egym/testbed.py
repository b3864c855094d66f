"""What an R2E-Gym episode puts in its container beside the repository at ``/testbed``: the folder of R2E-Gym's
tool script, the git invocation that ignores the repository's own configuration, and repository tars."""

from __future__ import annotations

import functools
import io
import tarfile
from importlib import resources as importlib_resources
from pathlib import Path

__all__ = ["GIT", "GIT_IDENT", "TOOLS_DIR", "TOOL_SCRIPT", "repo_tar", "tar_dir", "tool_script"]

#: Where the tool script, its state and grading files live inside the container (not in /testbed).
TOOLS_DIR = "/tmp/.afg_r2e"
TOOL_SCRIPT = f"{TOOLS_DIR}/r2e_tools.py"
#: git, blind to the repository's own configuration (hooks, fsmonitor, ownership checks): the model wrote it
GIT = "git -c safe.directory=* -c core.fsmonitor= -c core.hooksPath=/dev/null"
#: the author and committer of the task-base commit
GIT_IDENT = ("GIT_AUTHOR_NAME=agentfly GIT_AUTHOR_EMAIL=agentfly@localhost GIT_COMMITTER_NAME=agentfly "
              "GIT_COMMITTER_EMAIL=agentfly@localhost")


@functools.lru_cache(maxsize=1)
def tool_script() -> bytes:
    """R2E-Gym's tool script (``r2e_tools.py`` of this package), as put at :data:`TOOL_SCRIPT`."""
    return importlib_resources.files(__package__).joinpath("r2e_tools.py").read_bytes()


@functools.lru_cache(maxsize=32)
def repo_tar(root: str) -> bytes:
    """The repository folder ``root`` as an uncompressed tar (bytes), cached per process."""
    return tar_dir(Path(root))


def tar_dir(root: Path) -> bytes:
    """The folder ``root`` as an uncompressed tar (bytes), without ``__pycache__`` and ``.pyc`` files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if "__pycache__" in rel.split("/") or rel.endswith(".pyc"):
                continue
            tf.add(p, arcname=rel, recursive=False)
    return buf.getvalue()
