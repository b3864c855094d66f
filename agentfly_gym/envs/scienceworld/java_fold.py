"""The ScienceWorld step in one py4j call: a small Java class of ours, loaded into the package's JVM.

``java/src/agentflygym/scienceworld/FoldedStep.java`` calls, on the package's own
``PythonInterface``, what the package's Python ``ScienceWorldEnv.step`` calls first (``step``,
``getScore``, ``getCompleted``, ``getNumMoves``, in that order) and returns the four answers as one
string (see :func:`decode`).  The compiled class ships in ``java/classes`` (Java 8 class files, the
release of the package's own jar, so any JVM that runs ScienceWorld loads it; no ``javac`` is needed
at run time).  :func:`load` puts it into a running JVM through a ``URLClassLoader`` whose parent is
``PythonInterface``'s loader; py4j then calls its methods by reflection like any other object's.
One version of the class per JVM: py4j caches reflected methods by class name, so a second class of
the same name from another loader would be called with the first one's methods.

Rebuild the class after editing the source (needs a JDK; checked by ``tests/test_scienceworld_fold.py``)::

    python -m agentfly_gym.envs.scienceworld.java_fold
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...errors import AgentFlyError

__all__ = ["CLASSES_DIR", "CLASS_NAME", "JAVA_RELEASE", "SOURCE", "FoldUnavailable", "build", "decode", "load"]

_HERE = Path(__file__).resolve().parent / "java"
#: The Java source (kept in the repository and the package).
SOURCE = _HERE / "src" / "agentflygym" / "scienceworld" / "FoldedStep.java"
#: The class path root of the compiled class that ships with the package.
CLASSES_DIR = _HERE / "classes"
#: The class's binary name.
CLASS_NAME = "agentflygym.scienceworld.FoldedStep"
#: ``javac --release``: 8, as the package's ``scienceworld.jar`` (class file version 52).
JAVA_RELEASE = 8


class FoldUnavailable(AgentFlyError, RuntimeError):
    """The Java class could not be loaded or did not answer as the package's getters (the caller
    falls back to separate py4j calls)."""


def scienceworld_jar() -> Path:
    """The ``scienceworld.jar`` of the installed package (the class compiles against it)."""
    from scienceworld.constants import JAR_PATH

    return Path(JAR_PATH)


def build(dest: Path | str = CLASSES_DIR, *, javac: str | None = None) -> Path:
    """Compile :data:`SOURCE` into ``dest`` (a class path root) for Java :data:`JAVA_RELEASE`.

    Returns the ``.class`` file written.  Raises ``FileNotFoundError`` when no ``javac`` is on
    PATH and ``subprocess.CalledProcessError`` (with javac's output) when it fails.
    """
    javac = javac or shutil.which("javac")
    if javac is None:
        raise FileNotFoundError("building the ScienceWorld fold class needs a JDK ('javac' on PATH)")
    dest = Path(dest)
    subprocess.run([javac, "--release", str(JAVA_RELEASE), "-Xlint:all", "-encoding", "UTF-8",
                    "-cp", str(scienceworld_jar()), "-d", str(dest), str(SOURCE)],
                   check=True, capture_output=True, text=True)
    return dest.joinpath(*CLASS_NAME.split(".")).with_suffix(".class")


def decode(text: str) -> tuple[str | None, float, bool, int | None]:
    """``(observation, score, completed, moves)`` from ``FoldedStep.step``'s string.

    The string is ``Double.toString(score)``, ``true``/``false``, the move count (``null`` for
    none), each ended by a newline, then ``s`` + the observation (or ``n`` for a null one).  py4j
    sends a double as its ``toString`` too and Python reads it with ``float()``, so the score is the
    same value the separate ``getScore`` call gives.  Raises ``ValueError`` on a malformed string.
    """
    score, completed, moves, obs = text.split("\n", 3)
    if completed not in ("true", "false") or obs[:1] not in ("s", "n"):
        raise ValueError(f"not an encoded ScienceWorld step: {text[:200]!r}")
    return (obs[1:] if obs[:1] == "s" else None), float(score), completed == "true", (
        None if moves == "null" else int(moves))


def decode_state(text: str) -> tuple[float, bool, int | None]:
    """``(score, completed, moves)`` from ``FoldedStep.state``'s string (as :func:`decode`, no observation)."""
    _obs, score, completed, moves = decode(text + "n")
    return score, completed, moves


def load(gateway: Any, server: Any, classes_dir: Path | str = CLASSES_DIR) -> Any:
    """Load the class into ``gateway``'s JVM and return a new ``FoldedStep`` bound to ``server``
    (the package's ``PythonInterface``; a py4j ``JavaObject``).

    Its ``step(action)`` returns the string :func:`decode` reads.  Before returning, its
    ``state()`` is checked against the package's own getters called one by one.

    Raises:
        FoldUnavailable: no class file, the JVM refused the class (version, linkage, a changed
            ``PythonInterface``) or its answers differ from the getters'.
        py4j.protocol.Py4JNetworkError: the JVM is not answering.
    """
    from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError

    classes_dir = Path(classes_dir)
    if not classes_dir.joinpath(*CLASS_NAME.split(".")).with_suffix(".class").is_file():
        raise FoldUnavailable(f"no {CLASS_NAME} class under {classes_dir}")
    jvm = gateway.jvm
    try:
        urls = gateway.new_array(jvm.java.net.URL, 1)
        urls[0] = jvm.java.io.File(str(classes_dir)).toURI().toURL()
        loader = jvm.java.net.URLClassLoader(urls, server.getClass().getClassLoader())
        cls = loader.loadClass(CLASS_NAME)
        param_types = gateway.new_array(jvm.java.lang.Class, 1)
        param_types[0] = jvm.java.lang.Class.forName("java.lang.Object")
        args = gateway.new_array(jvm.java.lang.Object, 1)
        args[0] = server
        helper = cls.getConstructor(param_types).newInstance(args)
        got = decode_state(helper.state())
        expected = (float(server.getScore()), bool(server.getCompleted()), server.getNumMoves())
    except Py4JNetworkError:
        raise
    except (Py4JJavaError, Py4JError, ValueError) as e:
        raise FoldUnavailable(f"{type(e).__name__}: {str(e)[:300]}") from e
    if got != expected:
        raise FoldUnavailable(f"{CLASS_NAME}.state gave {got}, the getters {expected}")
    return helper


def main() -> int:
    """Rebuild the shipped class from the source."""
    out = build()
    print(f"wrote {out} (javac --release {JAVA_RELEASE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
