"""The full public data sets, their upstream files and pinned checksums; downloading and verifying them.

The command is ``agentfly-gym data`` (:mod:`agentfly_gym.cli.data`): ``data status`` shows, per data set,
where it would be downloaded, what is there and which folder each environment reads now; ``data download NAME`` fetches the upstream files
(resumable, verified, see :mod:`agentfly_gym.data.download`) and prepares them in the layout the
environments read; ``data verify NAME`` checks the downloaded files against their pins; ``data precompute alfworld``
fills ALFWorld's engine cache for whole splits (:mod:`agentfly_gym.envs.alfworld.precompute`).

Checksums.  A file's SHA-256 is pinned here where the project knows it (:attr:`RemoteFile.sha256`,
with :attr:`RemoteFile.pin_source` saying where the value comes from).  Where it does not — the
file changes upstream (the Lichess dump is re-published every month) or it could not be computed
(the project's machines have no internet access) — the pin is ``None`` and the first download
records the digest in ``<folder>/.agentfly-data.json`` (trust on first use, said on screen);
``verify`` then needs a pin, from this module, from that record, or given with ``--sha256 FILE=HEX``.
No digest in this module was made up: each pinned one names its source.

Archives are kept next to what they were unpacked into, so ``verify`` can recheck them later (delete them
by hand to save space; ``verify`` then reports them missing).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import zipfile
from pathlib import Path

from .paths import default_download_dir, sample_dir
from .download import download_file, sha256_file
from ..errors import ConfigError, DownloadError

__all__ = ["DATASETS", "DataSet", "RemoteFile", "download_dataset", "read_manifest", "verify_dataset", "MANIFEST_NAME"]

#: the record of downloaded files (url, sha256, pinned or recorded, when) inside a data set's folder
MANIFEST_NAME = ".agentfly-data.json"


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """One upstream file of a data set.

    Attributes:
        name: the file name inside the data set's folder (the archive's name for archives).
        url: where it is downloaded from.
        sha256: the pinned SHA-256 (64 hex characters), or ``None`` when the project cannot pin it
            (then the first download records it; see the module docstring).
        pin_source: where the pin comes from, or why there is none.
        extract: ``None`` (used as is), ``"zst"`` (decompressed as a stream to ``name`` without
            ``.zst``) or ``"zip"`` (unpacked into the folder, as ``alfworld-download`` does).
        starts_with: the bytes a decompressed ``zst`` file begins with (e.g. a CSV header); a file
            that is empty (a cut-off stream) or begins otherwise is refused.
    """

    name: str
    url: str
    sha256: str | None
    pin_source: str
    extract: str | None = None
    starts_with: bytes | None = None


@dataclasses.dataclass(frozen=True)
class DataSet:
    """A public data set: its files and the folder the environments read it from.

    Attributes:
        name: what ``agentfly-gym data download`` takes.
        folder: the data set's folder name under a data root (``chess``, ``alfworld``, ``webshop``, ``r2egym``),
            the name :func:`agentfly_gym.data.paths.resolve_data_dir` looks for.
        files: the upstream files.
        ready: a path inside the folder whose presence means the data set is prepared.
        licence: the data's licence.  ``source``: the upstream page.  ``note``: how the env uses it.
        copy_logic: copy ALFWorld's ``logic/`` files from the bundled sample (what ``alfworld-download``
            copies from the ``alfworld`` package).
    """

    name: str
    folder: str
    files: tuple[RemoteFile, ...]
    ready: str
    licence: str
    source: str
    note: str
    copy_logic: bool = False


_NO_PIN_OFFLINE = "not pinned: the project's machines have no internet access to compute it; recorded on first download"
_GDRIVE = "https://drive.usercontent.google.com/download?id={}&export=download&confirm=t"  # WebShop's setup.sh ids
_WEBSHOP_PIN = "sha256 of the upstream file listed in the project's WebShop data notes"
_ALFWORLD_RELEASES = "https://github.com/alfworld/alfworld/releases/download"

#: the public data sets by name
DATASETS: dict[str, DataSet] = {d.name: d for d in (
    DataSet(
        name="chess", folder="chess", ready="lichess_db_puzzle.csv", licence="CC0",
        source="https://database.lichess.org/#puzzles",
        note="the full Lichess puzzle database (millions of puzzles); Chess-v0 prefers it over the sample",
        files=(RemoteFile("lichess_db_puzzle.csv.zst", "https://database.lichess.org/lichess_db_puzzle.csv.zst", None,
                          "not pinned: Lichess re-publishes this file every month, so no fixed digest exists; "
                          "recorded on first download", extract="zst",
                          starts_with=b"PuzzleId,FEN,Moves,Rating,"),)),
    DataSet(
        name="alfworld", folder="alfworld", ready="json_2.1.1/*/*/*/game.tw-pddl", licence="MIT",
        source="https://github.com/alfworld/alfworld (alfworld-download of alfworld==0.4.2)",
        note="json_2.1.1/ (train, valid_seen, valid_unseen) and logic/, the layout alfworld-download writes",
        copy_logic=True,
        files=(RemoteFile("json_2.1.1_json.zip", f"{_ALFWORLD_RELEASES}/0.2.2/json_2.1.1_json.zip", None,
                          _NO_PIN_OFFLINE, extract="zip"),
               RemoteFile("json_2.1.2_tw-pddl.zip", f"{_ALFWORLD_RELEASES}/0.4.0/json_2.1.2_tw-pddl.zip", None,
                          _NO_PIN_OFFLINE, extract="zip"))),
    DataSet(
        name="webshop-small", folder="webshop", ready="items_shuffle_1000.json", licence="MIT",
        source="https://github.com/princeton-nlp/WebShop (setup.sh -d small)",
        note="the 1,000-product catalog with human instructions (WebShop-v0 human_goals=True needs them)",
        files=(RemoteFile("items_shuffle_1000.json", _GDRIVE.format("1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib"),
                          "30a4765c3a327af72d9a9a95a6b2486d516f0fa1d3ecd83681901ce82a21b269", _WEBSHOP_PIN),
               RemoteFile("items_ins_v2_1000.json", _GDRIVE.format("1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu"),
                          "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f",
                          _WEBSHOP_PIN + "; the bundled sample holds this file byte for byte"),
               RemoteFile("items_human_ins.json", _GDRIVE.format("14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O"),
                          "cf78667548a71786e1d9049c24b802e48e1084ad4bb021cae56ce1f6d96954a3", _WEBSHOP_PIN))),
    DataSet(
        name="webshop", folder="webshop", ready="items_shuffle.json", licence="MIT",
        source="https://github.com/princeton-nlp/WebShop (setup.sh -d all)",
        note="the full catalog (about 1.18 M products, several GB); WebShop-v0 reads the 1,000-product files first "
             "when both are in the folder, so pass products_file='items_shuffle.json', "
             "attributes_file='items_ins_v2.json'",
        files=(RemoteFile("items_shuffle.json", _GDRIVE.format("1A2whVgOO0euk5O13n2iYDM0bQRkkRduB"), None,
                          _NO_PIN_OFFLINE),
               RemoteFile("items_ins_v2.json", _GDRIVE.format("1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi"), None,
                          _NO_PIN_OFFLINE),
               RemoteFile("items_human_ins.json", _GDRIVE.format("14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O"),
                          "cf78667548a71786e1d9049c24b802e48e1084ad4bb021cae56ce1f6d96954a3", _WEBSHOP_PIN))),
    DataSet(
        name="r2egym-lite", folder="r2egym", ready="r2e-gym-lite-train-0000.parquet", licence="see the data set's page",
        source="https://huggingface.co/datasets/R2E-Gym/R2E-Gym-Lite",
        note="R2E-Gym rows (the hub's Parquet export of the train split, first shard; check the page for more "
             "shards); use with R2EGym-v0 tasks=<file>, each row runs in its docker_image",
        files=(RemoteFile("r2e-gym-lite-train-0000.parquet",
                          "https://huggingface.co/datasets/R2E-Gym/R2E-Gym-Lite/resolve/refs%2Fconvert%2Fparquet/"
                          "default/train/0000.parquet", None, _NO_PIN_OFFLINE),)),
)}


def _get(name: str) -> DataSet:
    if name not in DATASETS:
        raise ConfigError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[name]


def read_manifest(folder: Path) -> dict:
    """The record of downloaded files in ``folder`` (:data:`MANIFEST_NAME`), or ``{}`` when there is none."""
    try:
        return json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_manifest(folder: Path, manifest: dict) -> None:
    tmp = folder / f"{MANIFEST_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST_NAME)


def _pin(f: RemoteFile, manifest: dict, given: dict[str, str]) -> tuple[str | None, str]:
    """(the digest to check against, where it comes from)."""
    if f.name in given:
        return given[f.name], "given with --sha256"
    if f.sha256:
        return f.sha256, "pinned in agentfly-gym"
    rec = manifest.get("files", {}).get(f.name, {})
    if rec.get("sha256"):
        return rec["sha256"], f"recorded at the first download ({rec.get('recorded', '?')})"
    return None, "no pin"


class _BadArchive(Exception):
    """A downloaded archive that cannot be unpacked."""


def _extract(f: RemoteFile, archive: Path, folder: Path, progress: bool) -> None:
    if f.extract == "zst":
        out = folder / f.name.removesuffix(".zst")
        if out.is_file():
            return
        try:
            import zstandard
        except ImportError as e:
            raise ConfigError(f"decompressing {archive.name} needs the zstandard package (pip install "
                              "'agentfly-gym[chess]')") from e
        tmp = out.with_name(out.name + ".tmp")
        try:
            with open(archive, "rb") as src, open(tmp, "wb") as dst:
                zstandard.ZstdDecompressor().copy_stream(src, dst)  # a stream: constant memory
        except zstandard.ZstdError as e:
            tmp.unlink(missing_ok=True)
            raise _BadArchive(f"not a valid zstd stream ({e})") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with open(tmp, "rb") as got:
            head = got.read(len(f.starts_with or b"") or 1)
        if not head or (f.starts_with and head != f.starts_with):
            tmp.unlink(missing_ok=True)
            raise _BadArchive("a zstd stream that is cut off or holds something else "
                              f"(it unpacks to {'nothing' if not head else repr(head[:40])})")
        os.replace(tmp, out)
    elif f.extract == "zip":
        marker = folder / f".{f.name}.extracted"
        if marker.is_file():
            return
        try:
            z = zipfile.ZipFile(archive)
        except zipfile.BadZipFile as e:
            raise _BadArchive(f"not a valid zip archive ({e})") from None
        with z:
            members = z.infolist()
            if progress:
                from tqdm import tqdm

                members = tqdm(members, desc=f"unpacking {f.name}", unit="file", leave=False)
            try:
                for m in members:
                    z.extract(m, folder)  # ZipFile.extract drops absolute paths and ".." components
            except (zipfile.BadZipFile, EOFError) as e:
                raise _BadArchive(f"a damaged zip archive ({e})") from None
        marker.touch()


def download_dataset(name_or_set: str | DataSet, dest: str | os.PathLike | None = None, *,
                     sha256: dict[str, str] | None = None, mirror: str | None = None, progress: bool = True,
                     log=print) -> Path:
    """Download and prepare a data set; return its folder.

    Args:
        name_or_set: a name in :data:`DATASETS` or a :class:`DataSet`.
        dest: the folder; default :func:`agentfly_gym.data.paths.default_download_dir` of the data set's folder name.
        sha256: file name -> expected digest, overriding (or supplying) the pins.
        mirror: a base URL to fetch ``<mirror>/<folder>/<file name>`` from instead of upstream (a local copy).
        progress: show progress bars.
        log: printer for one-line messages (``None`` for silence).

    Raises:
        ConfigError: unknown data set, bad ``sha256`` value, a folder that cannot be created.
        DownloadError: see :func:`agentfly_gym.data.download.download_file` (offline, HTTP error, cut off), or
            a downloaded archive that does not unpack (deleted, nothing recorded).
        ChecksumError: a file does not match its pin (it was refused and deleted).
    """
    ds = _get(name_or_set) if isinstance(name_or_set, str) else name_or_set
    say = log or (lambda _m: None)
    folder = Path(dest).expanduser() if dest is not None else default_download_dir(ds.folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the data set's folder {folder} ({e.strerror}); choose a writable one with "
                          "--dest DIR (or dest=...)") from None
    given = {k: v.lower() for k, v in (sha256 or {}).items()}
    manifest = read_manifest(folder)
    for f in ds.files:
        pin, pin_from = _pin(f, manifest, given)
        url = f"{mirror.rstrip('/')}/{ds.folder}/{f.name}" if mirror else f.url
        say(f"{ds.name}: {f.name} from {url}")
        digest = download_file(url, folder / f.name, sha256=pin, progress=progress,
                               verify=f"agentfly-gym data verify {ds.name}" + (f" --dest {dest}" if dest else ""))
        if f.extract:  # unpack before recording anything: a file that does not unpack is refused
            try:
                _extract(f, folder / f.name, folder, progress)
            except _BadArchive as e:
                (folder / f.name).unlink(missing_ok=True)
                raise DownloadError(f"{url} gave {f.name}, which is {e}: refused and deleted, nothing recorded. "
                                    "Check the URL or --mirror and run the download again.") from None
        if pin is None:
            say(f"{ds.name}: {f.name} has no pinned checksum ({f.pin_source}); recorded sha256 {digest} in "
                f"{folder / MANIFEST_NAME} so that `agentfly-gym data verify {ds.name}` can check it later")
        else:
            say(f"{ds.name}: {f.name} matches its sha256 ({pin_from})")
        manifest.setdefault("files", {})[f.name] = {
            "url": url, "sha256": digest, "pinned": pin is not None, "pin_source": pin_from if pin else f.pin_source,
            "size": (folder / f.name).stat().st_size,
            "recorded": manifest.get("files", {}).get(f.name, {}).get("recorded")
            or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        _write_manifest(folder, manifest)
    if ds.copy_logic:
        logic = folder / "logic"
        logic.mkdir(exist_ok=True)
        sample = sample_dir("alfworld")
        for n in ("alfred.pddl", "alfred.twl2"):
            if sample is not None and not (logic / n).is_file():
                shutil.copyfile(sample / "logic" / n, logic / n)
    say(f"{ds.name}: ready in {folder}")
    return folder


def verify_dataset(name_or_set: str | DataSet, dest: str | os.PathLike | None = None, *,
                   sha256: dict[str, str] | None = None, progress: bool = True) -> list[tuple[str, bool, str]]:
    """Check every downloaded file of a data set against its pin.

    Returns:
        One ``(file name, ok, detail)`` per file.  A file is not ok when it is missing, has no pin
        (neither in this module, nor recorded at download, nor given) or does not match.

    Raises:
        ConfigError: unknown data set or bad ``sha256`` value.
    """
    ds = _get(name_or_set) if isinstance(name_or_set, str) else name_or_set
    folder = Path(dest).expanduser() if dest is not None else default_download_dir(ds.folder)
    manifest = read_manifest(folder)
    given = {k: v.lower() for k, v in (sha256 or {}).items()}
    out = []
    for f in ds.files:
        p = folder / f.name
        pin, pin_from = _pin(f, manifest, given)
        if not p.is_file():
            out.append((f.name, False, f"missing in {folder}: run `agentfly-gym data download {ds.name}`"))
        elif pin is None:
            out.append((f.name, False, f"no pin to check against ({f.pin_source}; nothing was recorded because the "
                                       "file was not downloaded by agentfly-gym): pass --sha256 "
                                       f"{f.name}=<digest> from a source you trust, or download it again"))
        else:
            digest = sha256_file(p, progress=progress)
            out.append((f.name, digest == pin, f"sha256 {digest} {'matches' if digest == pin else 'differs from'} "
                                               f"{pin} ({pin_from})"))
    return out


