"""Shared pytest fixtures."""

from __future__ import annotations

# llama_cpp must be imported before numpy in any process that loads a model (a known segfault
# otherwise on some setups); conftest is imported before every test module, so do it here first.
#: why `import llama_cpp` failed ("" = it imported). Not installed: the `engine` tests skip, and
#: .ci/check_suites.py fails a run where none of them passed. Installed but failing to import (a
#: half-written or broken build): every `engine` test fails with this error, and the report header
#: and summary print it, so a broken library never shrinks the suite silently.
LLAMA_CPP_ERROR = ""
LLAMA_CPP_MISSING = False
try:  # pragma: no cover - depends on whether the patched build is installed
    import llama_cpp  # noqa: F401
except Exception as _e:  # noqa: BLE001 - recorded, and reported (pytest_report_header, pytest_runtest_setup)
    llama_cpp = None
    LLAMA_CPP_ERROR = f"{type(_e).__name__}: {_e}"
    LLAMA_CPP_MISSING = isinstance(_e, ModuleNotFoundError) and getattr(_e, "name", "") == "llama_cpp"

from pathlib import Path
from typing import NamedTuple

import pytest


class TinyModels(NamedTuple):
    """Random-weight tiny Qwen2 GGUFs written by specq.testing.synthetic (see the `tiny_models` fixture)."""

    #: 4 layers, byte vocabulary, seed 0
    target: Path
    #: 2 layers, same byte vocabulary and seed: its tensors are the target's first two layers
    #: (output projections scaled for 2 layers), so its greedy guesses often, not always, match the
    #: target's (about half of the time on short prompts)
    speculator: Path
    #: 2 layers with the "bytes-alt" vocabulary (other merges, special ids and size): must be refused
    #: as a speculator/drafter for `target`
    mismatched: Path
    #: the directory holding them
    root: Path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    from specq.testing.synthetic import write_qwen2_gguf

    root = tmp_path_factory.mktemp("tiny_models")
    return TinyModels(
        target=write_qwen2_gguf(root / "target.gguf", "tiny", seed=0, n_layer=4),
        speculator=write_qwen2_gguf(root / "speculator.gguf", "tiny", seed=0, n_layer=2),
        mismatched=write_qwen2_gguf(root / "mismatched.gguf", "tiny", vocab="bytes-alt", seed=0, n_layer=2),
        root=root,
    )


@pytest.fixture(scope="module")
def real_engine():
    """An Engine on the real Qwen2.5-Coder pair (CPU); skips when the models are not pulled."""
    from specq.engine import models
    from specq.engine.options import EngineOptions

    for name in (models.DEFAULT_TARGET, models.DEFAULT_SPECULATOR):
        if models.model_status(name).state not in ("verified", "present (not hashed)"):
            pytest.skip(f"{name} not pulled (run `specq models pull`)")
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(n_gpu_layers=0, n_ctx=8192))
    yield eng
    eng.close()


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh SQLite job store (SPECQ_DATABASE_URL and SPECQ_HOME point at tmp_path), migrated."""
    from specq.storage import db

    url = f"sqlite:///{tmp_path / 'specq.sqlite'}"
    monkeypatch.setenv("SPECQ_DATABASE_URL", url)
    monkeypatch.setenv("SPECQ_HOME", str(tmp_path))
    db.upgrade(url)
    yield url
    db.dispose_engines()


# --- marked suites: CI fails when one is skipped entirely (.ci/check_suites.py) ---------------------
#: the markers of suites that need something outside Python (servers, the real models, minutes of time);
#: a run where every test of one of them skipped proves nothing about it
MARKED_SUITES = ("services", "real_models", "faults", "load", "engine", "compose")
_suite_outcomes: dict[str, dict[str, str]] = {m: {} for m in MARKED_SUITES}


def pytest_report_header(config) -> str:
    if not LLAMA_CPP_ERROR:
        return f"llama_cpp: {getattr(llama_cpp, '__version__', '?')}"
    return f"llama_cpp: NOT IMPORTABLE ({LLAMA_CPP_ERROR}): the engine tests {'skip' if LLAMA_CPP_MISSING else 'fail'}"


def pytest_runtest_setup(item) -> None:
    """An `engine` test without an importable llama_cpp: skipped when it is not installed, failed with
    the import's error when it is installed but broken (LLAMA_CPP_ERROR)."""
    if LLAMA_CPP_ERROR and item.get_closest_marker("engine") is not None:
        if LLAMA_CPP_MISSING:
            pytest.skip(f"llama-cpp-python is not installed ({LLAMA_CPP_ERROR})")
        pytest.fail(f"llama_cpp failed to import: {LLAMA_CPP_ERROR}", pytrace=False)


def pytest_terminal_summary(terminalreporter) -> None:
    if LLAMA_CPP_ERROR:
        terminalreporter.write_line(f"llama_cpp could not be imported: {LLAMA_CPP_ERROR} (engine tests "
                                    f"{'skipped' if LLAMA_CPP_MISSING else 'failed'})", red=True)


def pytest_runtest_logreport(report) -> None:
    """Each marked test's outcome (failed in any phase > passed > skipped)."""
    for marker in MARKED_SUITES:
        if marker not in report.keywords:
            continue
        seen = _suite_outcomes[marker]
        before = seen.get(report.nodeid)
        if report.failed:
            seen[report.nodeid] = "failed"
        elif report.skipped and before is None:
            seen[report.nodeid] = "skipped"
        elif report.passed and report.when == "call" and before != "failed":
            seen[report.nodeid] = "passed"


def pytest_sessionfinish(session, exitstatus) -> None:
    """Write {marker: {passed, failed, skipped}} to $SPECQ_SUITE_REPORT (default
    .pytest_cache/specq-suites.json), which .ci/check_suites.py reads."""
    import json
    import os

    path = Path(os.environ.get("SPECQ_SUITE_REPORT") or Path(str(session.config.rootpath)) / ".pytest_cache" /
                "specq-suites.json")
    counts = {m: {k: sum(1 for v in seen.values() if v == k) for k in ("passed", "failed", "skipped")}
              for m, seen in _suite_outcomes.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"exitstatus": int(exitstatus), "suites": counts}, indent=2))
    except OSError:  # pragma: no cover - a read-only checkout: nothing for the check to read
        pass
