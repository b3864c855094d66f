"""``agentfly-gym data``: downloads from a real HTTP server on 127.0.0.1 (no internet in tests) that honours
``Range``, can cut a response short, and can serve wrong bytes: an interrupted download resumes, a corrupted
file is refused, an offline run says what to do, and the prepared data sets load in the real loaders."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentfly_gym.data.datasets import DATASETS, MANIFEST_NAME, download_dataset, verify_dataset
from agentfly_gym.cli.data import data_main
from agentfly_gym.data.download import download_file, sha256_file
from agentfly_gym.errors import ChecksumError, ConfigError, DownloadError

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "agentfly_gym" / "samples"


class FileServer:
    """Serves ``files`` (URL path -> bytes) with single ``bytes=N-`` ranges, records each request's Range header.

    ``cut[path] = n``: the next response for ``path`` sends only ``n`` body bytes, then drops the connection.
    ``honour_range = False``: answer 200 with the whole file whatever the Range header says.
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.types: dict[str, str] = {}
        self.cut: dict[str, int] = {}
        self.honour_range = True
        self.requests: list[tuple[str, str | None]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                owner.requests.append((self.path, rng))
                body = owner.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", rng or "")
                if m and owner.honour_range:
                    start = int(m.group(1))
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Type", owner.types.get(self.path, "application/octet-stream"))
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                data = body[start:]
                n = owner.cut.pop(self.path, None)
                if n is not None:
                    self.wfile.write(data[:n])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    with FileServer() as s:
        yield s


def _payload(n: int = 300_000) -> bytes:
    return b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(n // 32 + 1))[:n]


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_interrupted_download_resumes_with_a_range_request(server, tmp_path):
    body = _payload()
    server.files["/f.bin"] = body
    server.cut["/f.bin"] = 100_000
    dest = tmp_path / "d" / "f.bin"
    pin = hashlib.sha256(body).hexdigest()
    with pytest.raises(DownloadError, match=r"stopped at 100,000 of 300,000 bytes.*run the same command again"):
        download_file(f"{server.url}/f.bin", dest, sha256=pin, progress=False)
    assert not dest.exists()
    assert (tmp_path / "d" / "f.bin.part").stat().st_size == 100_000
    assert download_file(f"{server.url}/f.bin", dest, sha256=pin, progress=False) == pin
    assert dest.read_bytes() == body
    assert not (tmp_path / "d" / "f.bin.part").exists()
    assert server.requests == [("/f.bin", None), ("/f.bin", "bytes=100000-")]
    # an existing file is checked, not fetched again
    assert download_file(f"{server.url}/f.bin", dest, sha256=pin, progress=False) == pin
    assert len(server.requests) == 2


def test_a_server_that_ignores_range_is_read_again_from_the_start(server, tmp_path):
    body = _payload(50_000)
    server.files["/f.bin"] = body
    server.cut["/f.bin"] = 20_000
    server.honour_range = False
    dest = tmp_path / "f.bin"
    with pytest.raises(DownloadError):
        download_file(f"{server.url}/f.bin", dest, progress=False)
    assert download_file(f"{server.url}/f.bin", dest, progress=False) == hashlib.sha256(body).hexdigest()
    assert dest.read_bytes() == body


def test_corrupted_file_is_refused_and_deleted(server, tmp_path):
    body = _payload(40_000)
    pin = hashlib.sha256(body).hexdigest()
    server.files["/f.bin"] = body[:1000] + b"X" + body[1001:]
    dest = tmp_path / "f.bin"
    with pytest.raises(ChecksumError, match=f"not the pinned {pin}: refused"):
        download_file(f"{server.url}/f.bin", dest, sha256=pin, progress=False)
    assert list(tmp_path.iterdir()) == []
    # a corrupted partial file on disk is caught too, after the resume
    server.files["/f.bin"] = body
    (tmp_path / "f.bin.part").write_bytes(b"Y" * 10_000)
    with pytest.raises(ChecksumError):
        download_file(f"{server.url}/f.bin", dest, sha256=pin, progress=False)
    assert server.requests[-1] == ("/f.bin", "bytes=10000-")
    assert list(tmp_path.iterdir()) == []
    assert download_file(f"{server.url}/f.bin", dest, sha256=pin, progress=False) == pin


def test_a_partial_file_that_does_not_fit_upstream_is_dropped(server, tmp_path):
    body = _payload(10_000)
    server.files["/f.bin"] = body
    (tmp_path / "f.bin.part").write_bytes(b"Z" * 20_000)  # longer than the file upstream: the server answers 416
    with pytest.raises(DownloadError, match="does not fit the file upstream"):
        download_file(f"{server.url}/f.bin", tmp_path / "f.bin", progress=False)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f.bin.part").write_bytes(body)  # exactly whole: 416 means done, nothing is fetched
    assert download_file(f"{server.url}/f.bin", tmp_path / "f.bin", progress=False) == hashlib.sha256(body).hexdigest()
    assert (tmp_path / "f.bin").read_bytes() == body


def test_a_second_download_of_the_same_file_is_refused_while_one_runs(server, tmp_path):
    import fcntl

    server.files["/f.bin"] = _payload(1000)
    part = tmp_path / "f.bin.part"
    with open(part, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(DownloadError, match="another process is downloading"):
            download_file(f"{server.url}/f.bin", tmp_path / "f.bin", progress=False)
    assert download_file(f"{server.url}/f.bin", tmp_path / "f.bin", progress=False)
    assert server.requests == [("/f.bin", None)]


def test_offline_says_what_to_do(tmp_path):
    dest = tmp_path / "chess" / "lichess_db_puzzle.csv.zst"
    with pytest.raises(DownloadError) as info:
        download_file(f"http://127.0.0.1:{_closed_port()}/x.zst", dest, progress=False)
    msg = str(info.value)
    assert "cannot reach 127.0.0.1" in msg
    assert "offline" in msg
    assert "agentfly-gym data verify NAME" in msg
    assert "--dest" in msg
    assert "resumes" in msg
    assert not dest.parent.joinpath(dest.name + ".part").exists()
    # through the command: exit 1, the same advice, no traceback
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTFLY_GYM_DATA",)}
    r = subprocess.run([sys.executable, "-m", "agentfly_gym", "data", "download", "chess", "--no-progress",
                        "--dest", str(tmp_path / "c"), "--mirror", f"http://127.0.0.1:{_closed_port()}"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "offline" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert f"agentfly-gym data verify chess --dest {tmp_path / 'c'}" in r.stderr.replace("\n", " "), r.stderr


def test_web_page_instead_of_file_is_refused(server, tmp_path):
    server.files["/f.json"] = b"<html>sign in</html>"
    server.types["/f.json"] = "text/html; charset=utf-8"
    with pytest.raises(DownloadError, match="web page"):
        download_file(f"{server.url}/f.json", tmp_path / "f.json", progress=False)
    assert not (tmp_path / "f.json").exists()


def test_bad_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="ftp://x"):
        download_file("ftp://x/y", tmp_path / "y")
    with pytest.raises(ConfigError, match="64 hexadecimal"):
        download_file("http://127.0.0.1/y", tmp_path / "y", sha256="abc")
    with pytest.raises(ConfigError, match="unknown data set 'nope'; choose one of chess"):
        download_dataset("nope", tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot create the data set's folder .*--dest"):
        download_dataset("chess", tmp_path / "file" / "chess")


def test_chess_download_records_the_digest_decompresses_and_verifies(server, tmp_path, capsys):
    """The Lichess dump has no fixed digest: the first download records it, verify then checks against it."""
    import zstandard

    from agentfly_gym.envs.chess.puzzles import find_puzzles_file, load_puzzles

    csv = (SAMPLES / "chess" / "lichess_puzzles_sample.csv").read_bytes()
    server.files["/chess/lichess_db_puzzle.csv.zst"] = zstandard.ZstdCompressor().compress(csv)
    dest = tmp_path / "chess"
    assert data_main(["download", "chess", "--dest", str(dest), "--mirror", server.url, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "no pinned checksum" in out
    assert "recorded sha256" in out
    assert (dest / "lichess_db_puzzle.csv").read_bytes() == csv
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    rec = manifest["files"]["lichess_db_puzzle.csv.zst"]
    assert rec["pinned"] is False
    assert rec["sha256"] == sha256_file(dest / "lichess_db_puzzle.csv.zst")
    assert find_puzzles_file(data_dir=dest) == dest / "lichess_db_puzzle.csv"
    assert len(load_puzzles(dest / "lichess_db_puzzle.csv")) == 300
    assert data_main(["verify", "chess", "--dest", str(dest), "--no-progress"]) == 0
    assert "OK   lichess_db_puzzle.csv.zst" in capsys.readouterr().out
    # a changed file fails verify; a file nobody recorded has no pin until one is given
    with open(dest / "lichess_db_puzzle.csv.zst", "ab") as f:
        f.write(b"\0")
    assert data_main(["verify", "chess", "--dest", str(dest), "--no-progress"]) == 1
    assert "FAIL lichess_db_puzzle.csv.zst: sha256" in capsys.readouterr().out
    (dest / MANIFEST_NAME).unlink()
    assert data_main(["verify", "chess", "--dest", str(dest), "--no-progress"]) == 1
    assert "no pin to check against" in capsys.readouterr().out
    digest = sha256_file(dest / "lichess_db_puzzle.csv.zst")
    assert data_main(["verify", "chess", "--dest", str(dest), "--no-progress", "--sha256",
                      f"lichess_db_puzzle.csv.zst={digest}"]) == 0


def test_a_download_that_does_not_unpack_is_refused_and_nothing_recorded(server, tmp_path, capsys):
    """A file with no pin that is not a zstd stream (a corrupted copy, a wrong --mirror) is deleted with a
    clear error, never recorded as the digest that verify would then trust, and leaves no temporary file."""
    server.files["/chess/lichess_db_puzzle.csv.zst"] = b"not zstd!"
    dest = tmp_path / "chess"
    assert data_main(["download", "chess", "--dest", str(dest), "--mirror", server.url, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "not a valid zstd stream" in err
    assert "refused and deleted" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in dest.iterdir()) == []
    assert data_main(["verify", "chess", "--dest", str(dest), "--no-progress"]) == 1
    # a cut-off zstd stream (unpacks to nothing) and a valid one holding something else are refused too
    import zstandard

    whole = zstandard.ZstdCompressor().compress((SAMPLES / "chess" / "lichess_puzzles_sample.csv").read_bytes())
    for body in (whole[: len(whole) // 2], zstandard.ZstdCompressor().compress(b"<html>not found</html>\n" * 100)):
        server.files["/chess/lichess_db_puzzle.csv.zst"] = body
        assert data_main(["download", "chess", "--dest", str(dest), "--mirror", server.url, "--no-progress"]) == 1
        err = capsys.readouterr().err
        assert "cut off or holds something else" in err and "refused and deleted" in err, err
        assert sorted(p.name for p in dest.iterdir()) == []


def test_pinned_webshop_file_with_other_bytes_is_refused(server, tmp_path, capsys):
    """items_ins_v2_1000.json is pinned: the bundled copy passes, any other bytes are refused."""
    good = (SAMPLES / "webshop" / "items_ins_v2_1000.json").read_bytes()
    server.files["/webshop/items_shuffle_1000.json"] = b"[]"
    dest = tmp_path / "webshop"
    assert data_main(["download", "webshop-small", "--dest", str(dest), "--mirror", server.url,
                      "--no-progress"]) == 1
    assert "refused" in capsys.readouterr().err
    assert not (dest / "items_shuffle_1000.json").exists()
    results = verify_dataset("webshop-small", dest, progress=False)
    assert [ok for _, ok, _ in results] == [False, False, False]
    assert "missing" in results[0][2]
    (dest / "items_ins_v2_1000.json").write_bytes(good)
    assert verify_dataset("webshop-small", dest, progress=False)[1][1] is True
    assert "pinned in agentfly-gym" in verify_dataset("webshop-small", dest, progress=False)[1][2]


def test_alfworld_archives_unpack_into_the_alfworld_download_layout(server, tmp_path):
    from agentfly_gym.envs.alfworld.games import TASK_TYPES, load_index

    zips = {"json_2.1.1_json.zip": "traj_data.json", "json_2.1.2_tw-pddl.zip": "game.tw-pddl"}
    for zname, member in zips.items():
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted((SAMPLES / "alfworld").glob(f"json_2.1.1/valid_seen/*/*/{member}")):
                z.write(p, p.relative_to(SAMPLES / "alfworld").as_posix())
        server.files[f"/alfworld/{zname}"] = buf.getvalue()
    dest = download_dataset("alfworld", tmp_path / "alfworld", mirror=server.url, progress=False, log=None)
    assert (dest / "logic" / "alfred.twl2").is_file()
    assert (dest / ".json_2.1.2_tw-pddl.zip.extracted").is_file()
    index = load_index(dest, "valid_seen", use_disk_cache=False)
    assert len(index) == 24
    assert set(index.counts()) == set(TASK_TYPES.values())
    assert [ok for _, ok, _ in verify_dataset("alfworld", dest, progress=False)] == [True, True]


def test_status_lists_every_data_set_and_what_the_envs_read(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTFLY_GYM_DATA", "ALFWORLD_DATA", "WEBSHOP_DATA")}
    env.update(HOME=str(tmp_path), AGENTFLY_GYM_CACHE=str(tmp_path / "cache"), COLUMNS="250")
    r = subprocess.run([sys.executable, "-m", "agentfly_gym", "data", "status"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in DATASETS:
        assert name in r.stdout
    assert r.stdout.count("bundled sample") == 3
    assert "not downloaded" in r.stdout


def test_status_ignores_an_empty_alfworld_download(tmp_path):
    """An interrupted download leaves ``json_2.1.1/`` empty: the env reads the bundled sample, and so must status."""
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTFLY_GYM_DATA", "ALFWORLD_DATA", "WEBSHOP_DATA")}
    env.update(HOME=str(tmp_path), AGENTFLY_GYM_CACHE=str(tmp_path / "cache"), COLUMNS="250")
    code = ("import os, sys; from agentfly_gym.data.paths import default_download_dir; "
            "p = default_download_dir('alfworld') / 'json_2.1.1' / 'valid_seen'; p.mkdir(parents=True); print(p)")
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert made.returncode == 0 and str(tmp_path) in made.stdout, made.stderr
    r = subprocess.run([sys.executable, "-m", "agentfly_gym", "data", "status"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [[c.strip() for c in line.split("\u2502")[1:-1]] for line in r.stdout.splitlines()
            if line.startswith("\u2502")]
    status = next(c for c in rows if len(c) == 6 and c[0] == "alfworld")
    in_use = next(c for c in rows if len(c) == 3 and c[0] == "alfworld")
    assert "not downloaded" in status[2], status
    assert "bundled sample" in in_use[1], in_use
