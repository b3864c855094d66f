"""MkDocs hook: the parts of the site made from the code at build time, never copied by hand.

- ``<!-- cli-reference -->`` in a page becomes the ``--help`` of every ``agentfly-gym`` command, run as a
  subprocess (the command a user types), so the reference cannot drift from the parsers.
- The docstrings' Sphinx roles (``:class:`~pkg.mod.Name` ``), which mkdocstrings shows as written, are shown as
  the code they name (``Name``; the full path without the ``~``).
- The benchmark plots (``benchmarks/results/*.png``) are added to the site under ``benchmarks/results/``, so the
  pages show the committed figures without a copy of them in ``docs/``.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- cli-reference -->"

#: Every command, in the order of the reference: the top level, then each (sub)command with a parser of its own.
COMMANDS: tuple[tuple[str, ...], ...] = (
    (), ("rollout",), ("eval",), ("envs",), ("dataset",), ("dataset", "check"), ("data",), ("data", "download"),
    ("data", "verify"), ("data", "precompute"), ("images",), ("resources", "gc"), ("r2e", "build-tasks"),
    ("drift",), ("serve",), ("gateway",),
)


def command_help(words: tuple[str, ...]) -> str:
    """``agentfly-gym WORDS --help`` as the command prints it (80 columns).

    Raises:
        RuntimeError: the command exited with another status than 0.
    """
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "plugins" / "verl"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "agentfly_gym", *words, "--help"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"agentfly-gym {' '.join(words)} --help exited {out.returncode}: {out.stderr[-2000:]}")
    return out.stdout


def cli_reference() -> str:
    parts = []
    for words in COMMANDS:
        name = " ".join(("agentfly-gym", *words))
        parts.append(f"## `{name}`\n\n<pre><code>{html.escape(command_help(words).rstrip())}</code></pre>\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return markdown


#: ``:class:<code>~a.b.Name</code>`` as mkdocstrings renders a docstring's Sphinx role
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def _role(m: re.Match) -> str:
    target = m.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if m.group(1) else target}</code>"


def on_page_content(html_text: str, page, config, files) -> str:
    return ROLE.sub(_role, html_text)


def on_files(files, config):
    results = ROOT / "benchmarks" / "results"
    for png in sorted(results.glob("*.png")):
        files.append(File.generated(config, f"benchmarks/results/{png.name}", abs_src_path=str(png)))
    return files
