"""Local, offline image builds: the Debian base image and Dockerfile recipes with content-hash tags.

Needs a real Docker engine: skipped only when none answers and ``AGENTFLY_REQUIRE_DOCKER`` is
unset.  The base image is built once (debootstrap, a few minutes) and reused afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentfly_gym.cli.images import images_main
from agentfly_gym.errors import ConfigError
from agentfly_gym.images.base import base_image_tag, base_rootfs_dir, build_base_image, debian_mirror
from agentfly_gym.images.build import build_image, build_lock_path, recipe_digest
from agentfly_gym.images.engine import ImageBuildError

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ no engine needed

def test_debian_mirror_reads_both_apt_formats(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTFLY_DEBIAN_MIRROR", raising=False)
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    keyring = tmp_path / "k.gpg"
    keyring.write_bytes(b"")
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb deb-src\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        f"Components: main\nSigned-By: {keyring}\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n")
    (apt / "sources.list.d" / "other.list.disabled").write_text("deb http://ignored.example/debian bookworm main\n")
    assert debian_mirror("bookworm", apt_dir=apt) == ("http://mirror.example/debian", str(keyring))
    assert debian_mirror("bookworm-security", apt_dir=apt) == ("http://mirror.example/debian-security", None)
    (apt / "sources.list").write_text("# old style\ndeb [arch=amd64 signed-by=/nonexistent] http://one.example/d trixie main\n")
    assert debian_mirror("trixie", apt_dir=apt) == ("http://one.example/d", None)
    with pytest.raises(ImageBuildError, match="sid"):
        debian_mirror("sid", apt_dir=apt)
    monkeypatch.setenv("AGENTFLY_DEBIAN_MIRROR", "http://override.example/debian")
    assert debian_mirror("sid", apt_dir=apt) == ("http://override.example/debian", None)


def test_recipe_digest_follows_content_not_noise(tmp_path):
    r = tmp_path / "recipe"
    r.mkdir()
    (r / "Dockerfile").write_text("FROM x\n")
    d0 = recipe_digest(r, "sha256:base1")
    assert recipe_digest(r, "sha256:base1") == d0
    assert len(d0) == 12
    (r / ".hidden").write_text("ignored")
    (r / "wheels").mkdir()
    (r / "wheels" / "a.whl").write_text("ignored")
    assert recipe_digest(r, "sha256:base1") == d0
    assert recipe_digest(r, "sha256:base2") != d0  # a new base means a new image
    (r / "extra.txt").write_text("1")
    d1 = recipe_digest(r, "sha256:base1")
    (r / "extra.txt").write_text("2")
    assert len({d0, d1, recipe_digest(r, "sha256:base1")}) == 3


def test_images_main_rejects_unknown_recipe(capsys):
    assert images_main(["build", "no-such-recipe"]) == 2
    assert "no image recipe 'no-such-recipe'" in capsys.readouterr().err
    assert images_main(["list"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed[0] == "base"
    assert "r2egym" in listed


# ------------------------------------------------------------------ real engine

@pytest.fixture(scope="module")
def engine(docker_client):
    return docker_client


@pytest.fixture(scope="module")
def base_image(engine) -> str:
    return build_base_image()


def _run(engine, image: str, cmd: list[str]) -> str:
    out = engine.containers.run(image, cmd, remove=True, network_mode="none", stderr=True)
    return out.decode()


def test_base_image_is_idempotent_and_keeps_its_rootfs(engine, base_image):
    t0 = time.monotonic()
    assert build_base_image() == base_image  # present: nothing rebuilt
    assert time.monotonic() - t0 < 60  # a debootstrap takes minutes
    assert base_image == base_image_tag()
    assert engine.images.get(base_image).id == engine.images.get("agentfly/base:latest").id
    root = base_rootfs_dir()
    assert (root / ".agentfly-rootfs.json").is_file()
    assert (root / "usr" / "bin" / "python3").exists()
    script = ("python3 --version; git --version; id agent; timeout --version | head -1; "
              "ls /usr/lib/python3*/EXTERNALLY-MANAGED 2>&1 | grep -c 'No such'")
    out = _run(engine, base_image, ["sh", "-c", script])
    assert "Python 3.11" in out
    assert "git version" in out
    assert "uid=1000(agent)" in out
    assert "timeout (GNU" in out
    assert out.rstrip().endswith("1")  # pip may install into the system Python


@pytest.mark.slow
def test_recipe_build_is_content_addressed(engine, base_image, tmp_path):
    recipe = tmp_path / "hello"
    recipe.mkdir()
    (recipe / "Dockerfile").write_text(
        "ARG BASE_IMAGE=agentfly/base:latest\nFROM ${BASE_IMAGE}\nCOPY msg.txt /msg.txt\n"
        "RUN python3 -c \"print(open('/msg.txt').read().upper())\" > /upper.txt\n")
    (recipe / "msg.txt").write_text("one")
    lines: list[str] = []
    tags = []
    try:
        tag = build_image(recipe, name="agentfly-test/hello", base=base_image, progress=lines.append)
        tags.append(tag)
        assert tag.startswith("agentfly-test/hello:")
        assert any("Step" in line for line in lines)
        assert _run(engine, tag, ["cat", "/upper.txt"]) == "ONE\n"
        image_id = engine.images.get(tag).id
        lines.clear()
        assert build_image(recipe, name="agentfly-test/hello", base=base_image, progress=lines.append) == tag
        assert not any("Step" in line for line in lines)  # unchanged: no build
        assert engine.images.get(tag).id == image_id
        assert engine.images.get("agentfly-test/hello:latest").id == image_id
        (recipe / "msg.txt").write_text("two")
        tag2 = build_image(recipe, name="agentfly-test/hello", base=base_image)
        tags.append(tag2)
        assert tag2 != tag
        assert _run(engine, tag2, ["cat", "/upper.txt"]) == "TWO\n"
        # a failing step fails clearly, with the build's own output
        (recipe / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo about-to-fail && false\n")
        with pytest.raises(ImageBuildError, match="about-to-fail"):
            build_image(recipe, name="agentfly-test/hello", base=base_image)
        # the build has no network: a recipe cannot fetch anything
        (recipe / "Dockerfile").write_text(
            "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN python3 -c \"import socket; socket.create_connection(('192.0.2.1', 9), 3)\"\n")
        with pytest.raises(ImageBuildError, match="unreachable"):
            build_image(recipe, name="agentfly-test/hello", base=base_image)
        (recipe / "Dockerfile").unlink()
        with pytest.raises(ConfigError, match="no Dockerfile"):
            build_image(recipe, base=base_image)
    finally:
        for t in tags + ["agentfly-test/hello:latest"]:
            try:
                engine.images.remove(t, force=True)
            except Exception:
                pass


def test_r2egym_recipe_has_python_pytest_git(engine, base_image, capsys):
    assert images_main(["build", "r2egym"]) == 0
    tag = capsys.readouterr().out.split()[-1]
    assert tag.startswith("agentfly/r2egym:")
    out = _run(engine, tag, ["sh", "-c", "pwd; python3 -m pytest --version; git --version; git config user.name"])
    assert out.startswith("/testbed\n")
    assert "pytest 8." in out
    assert "git version" in out
    assert out.endswith("agent\n")


@pytest.mark.slow
def test_a_second_build_of_one_tag_waits_for_the_first(engine, base_image, tmp_path):
    """Two processes building one recipe (two test workers) would share its wheel folder half-written: a build waits
    while another holds the tag's lock, then builds (here the first built nothing, so it does)."""
    import fcntl
    import threading
    import uuid

    recipe = tmp_path / "locked"
    recipe.mkdir()
    (recipe / "Dockerfile").write_text(f"ARG BASE_IMAGE\nFROM ${{BASE_IMAGE}}\nRUN echo {uuid.uuid4().hex} > /id\n")
    tag = f"agentfly-test/locked:{recipe_digest(recipe, engine.images.get(base_image).id)}"
    lock_path = build_lock_path(tag)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    result: list[str] = []
    try:
        with open(lock_path, "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # the other builder
            builder = threading.Thread(target=lambda: result.append(
                build_image(recipe, name="agentfly-test/locked", base=base_image)))
            builder.start()
            builder.join(3)  # a window in which an unlocked build would at least have started
            assert builder.is_alive()
            assert not engine.images.list(name="agentfly-test/locked")
            fcntl.flock(held, fcntl.LOCK_UN)
        builder.join(300)
        assert result == [tag]
        assert engine.images.get(tag)
    finally:
        for image in engine.images.list(name="agentfly-test/locked"):
            engine.images.remove(image.id, force=True)
