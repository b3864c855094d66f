"""The documentation site (mkdocs.yml, docs/) builds with ``--strict`` and says what the code does.

The build (MkDocs, the Material theme, mkdocstrings' API reference, the CLI reference generated from the parsers
by ``docs/hooks/generated.py``) takes 25-35 s on the loaded 2-core machine, so it is marked slow; the fast tests
check what a reader relies on without building: the navigation names every page, the CLI reference covers every
command, the README fits a screen-sized budget and lists every environment, and no page cites an issue number.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_BYTES = 12 * 1024


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def _load_hook():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hook", DOCS / "hooks" / "generated.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_nav_names_every_page_and_only_pages_that_exist():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert "glossary.md" in nav


def test_the_cli_reference_covers_every_command():
    from agentfly_gym.cli import DELEGATED, build_parser

    commands = set(_load_hook().COMMANDS)
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {(name,) for name in sub.choices} - {("resources",), ("r2e",)} <= commands
    assert set(DELEGATED) <= commands
    assert ("dataset", "check") in commands


def test_the_readme_fits_and_lists_every_environment():
    import gymnasium

    import agentfly_gym  # noqa: F401
    from agentfly_gym.registration import MULTIAGENT_ENVS

    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= README_MAX_BYTES, f"README.md is {len(text.encode())} bytes"
    for command in ("make demo", "make test"):
        assert f"\n{command} " in text
    listed = set(re.findall(r"^\| \[`(agentfly/[\w-]+)`\]", text, re.M))
    registered = {k for k in gymnasium.registry if k.startswith("agentfly/")} | {f"agentfly/{n}" for n in MULTIAGENT_ENVS}
    assert listed == registered
    site = (DOCS / "environments" / "index.md").read_text(encoding="utf-8")
    assert set(re.findall(r"^\| \[`(agentfly/[\w-]+)`\]", site, re.M)) == registered
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).is_file(), target


def test_no_page_a_user_reads_cites_an_issue_number():
    files = [README, ROOT / "benchmarks" / "README.md", ROOT / "plugins" / "verl" / "README.md",
             *DOCS.rglob("*.md")]
    pattern = re.compile(r"\bissues? #?\d+|\(#\d+\)", re.I)
    hits = [f"{f.relative_to(ROOT)}:{n}: {line.strip()[:80]}" for f in files
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    """``mkdocs build --strict`` (what ``make docs`` runs): no broken link, anchor or API reference, and the
    generated parts are there (every command's help, the benchmark plots)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    site = tmp_path / "site"
    cli = (site / "cli" / "index.html").read_text()
    assert "agentfly-gym dataset check" in cli
    assert "--env-kwargs" in cli
    assert "<!-- cli-reference -->" not in cli
    assert (site / "benchmarks" / "results" / "fidelity_alfworld.png").is_file()
    api = (site / "api" / "index.html").read_text()
    assert "make_tool_env" in api
    assert "TaskRunner" in api
