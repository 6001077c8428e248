"""`.ci/check_suites.py` and the conftest hook behind it: CI fails when a marked suite (services,
real_models, faults, load, engine) had no passing test, e.g. every one skipped for a missing server;
and a llama_cpp that is installed but fails to import fails the engine tests instead of skipping them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / ".ci" / "check_suites.py"


def _check(report: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(report)], capture_output=True, text=True, timeout=60)


@pytest.mark.services
def test_probe_services():
    """Not a real services test: the probe the test below runs in a child pytest (skipped otherwise,
    so it never counts as a passing services test in a real run)."""
    how = os.environ.get("SPECQ_CI_PROBE")
    if how != "pass":
        pytest.skip("probe for test_ci_suites (SPECQ_CI_PROBE unset or skip)")


@pytest.mark.engine
def test_probe_engine():
    """Not a real engine test: the probe the test below runs in a child pytest, as an engine test
    guards itself (skipped otherwise, so it never counts as a passing engine test in a real run)."""
    from tests.conftest import llama_cpp

    if llama_cpp is None:
        pytest.skip("llama-cpp-python is not installed")
    if os.environ.get("SPECQ_CI_PROBE") != "engine":
        pytest.skip("probe for test_ci_suites (SPECQ_CI_PROBE unset)")


def test_a_broken_llama_cpp_fails_the_engine_tests_visibly(tmp_path):
    """Issue 44 item 13: conftest swallowed any error of `import llama_cpp` and the engine tests then
    skipped. Now an installed-but-broken llama_cpp fails every `engine` test with its error (the
    report's header and summary name it); a missing one skips them, and the check fails the run for it."""
    runs = {}
    for kind, body in (("broken", "raise RuntimeError('broken build: undefined symbol: llama_decode')"),
                       ("missing", "raise ModuleNotFoundError(\"No module named 'llama_cpp'\", name='llama_cpp')")):
        fake = tmp_path / kind / "llama_cpp"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text(body + "\n")
        report = tmp_path / f"{kind}.json"
        env = {**os.environ, "SPECQ_CI_PROBE": "engine", "SPECQ_SUITE_REPORT": str(report),
               "PYTHONPATH": os.pathsep.join([str(fake.parent), str(REPO)])}
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                              f"{Path(__file__).name}::test_probe_engine"], cwd=Path(__file__).parent,
                             env=env, capture_output=True, text=True, timeout=300)
        runs[kind] = (out, json.loads(report.read_text())["suites"]["engine"], _check(report))
    out, engine, check = runs["broken"]
    assert out.returncode == 1 and "llama_cpp failed to import: RuntimeError: broken build" in out.stdout, out.stdout
    assert "llama_cpp could not be imported: RuntimeError: broken build" in out.stdout  # the run's summary says so
    assert engine == {"passed": 0, "failed": 1, "skipped": 0}
    assert check.returncode == 1 and "engine: no test passed (0 skipped, 1 failed)" in check.stderr
    out, engine, check = runs["missing"]
    assert out.returncode == 0 and engine == {"passed": 0, "failed": 0, "skipped": 1}, out.stdout
    assert "not installed" in out.stdout
    assert check.returncode == 1 and "engine: no test passed (1 skipped" in check.stderr


def test_a_suite_skipped_entirely_fails_the_check(tmp_path):
    report = tmp_path / "suites.json"
    runs = {}
    for how in ("skip", "pass"):
        env = {**os.environ, "SPECQ_CI_PROBE": how, "SPECQ_SUITE_REPORT": str(report)}
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              f"{Path(__file__).name}::test_probe_services"], cwd=Path(__file__).parent,
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        runs[how] = json.loads(report.read_text())["suites"]
    assert runs["skip"]["services"] == {"passed": 0, "failed": 0, "skipped": 1}
    assert runs["pass"]["services"] == {"passed": 1, "failed": 0, "skipped": 0}
    assert runs["pass"]["faults"] == {"passed": 0, "failed": 0, "skipped": 0}

    # every suite passed something: the check passes; one suite all skipped (or none ran): it fails
    ok = {m: {"passed": 2, "failed": 0, "skipped": 1} for m in ("services", "real_models", "faults", "load", "engine")}
    report.write_text(json.dumps({"suites": ok}))
    assert _check(report).returncode == 0
    report.write_text(json.dumps({"suites": {**ok, "real_models": {"passed": 0, "failed": 0, "skipped": 3}}}))
    got = _check(report)
    assert got.returncode == 1 and "real_models: no test passed (3 skipped" in got.stderr
    report.write_text(json.dumps({"suites": {**ok, "load": runs["pass"]["load"]}}))
    assert _check(report).returncode == 1
    assert _check(tmp_path / "missing.json").returncode == 1


def test_ci_runs_the_readme_test_command_then_the_check():
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    command = ".venv/bin/python -m pytest -q"
    assert f"`{command}` runs everything" in readme
    lines = [line.strip() for line in ci.splitlines()]
    assert command in lines and lines.index(command) < lines.index('.venv/bin/python .ci/check_suites.py "$SPECQ_SUITE_REPORT"')


def test_the_compose_suite_is_checked_alone_and_strictly(tmp_path):
    """Issue 52: .ci/run runs tests/test_compose_up.py after the suite, with its own report, and
    `--suites compose --strict` fails it when it did not run all of it (a skip, a failure, none run)."""
    report = tmp_path / "compose.json"

    def check(counts: dict, *extra: str) -> subprocess.CompletedProcess:
        report.write_text(json.dumps({"suites": {"compose": counts}}))
        return subprocess.run([sys.executable, str(CHECK), str(report), "--suites", "compose", *extra],
                              capture_output=True, text=True, timeout=60)

    assert check({"passed": 5, "failed": 0, "skipped": 0}, "--strict").returncode == 0
    got = check({"passed": 4, "failed": 0, "skipped": 1}, "--strict")
    assert got.returncode == 1 and "compose: 1 skipped, 0 failed (--strict" in got.stderr
    assert check({"passed": 4, "failed": 0, "skipped": 1}).returncode == 0  # not strict: one passed is enough
    got = check({"passed": 0, "failed": 0, "skipped": 5}, "--strict")
    assert got.returncode == 1 and "compose: no test passed (5 skipped" in got.stderr
    assert check({}, "--strict").returncode == 1  # no compose test ran at all
    # the default suites do not include compose (the README run skips it): a report without it passes them
    ok = {m: {"passed": 1, "failed": 0, "skipped": 0} for m in ("services", "real_models", "faults", "load", "engine")}
    report.write_text(json.dumps({"suites": {**ok, "compose": {"passed": 0, "failed": 0, "skipped": 5}}}))
    assert _check(report).returncode == 0


def test_ci_runs_the_compose_test_after_the_suite_and_requires_it():
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    suite_check = lines.index('.venv/bin/python .ci/check_suites.py "$SPECQ_SUITE_REPORT"')
    compose = next(i for i, line in enumerate(lines) if "tests/test_compose_up.py" in line and "pytest" in line)
    assert compose > suite_check
    assert "SPECQ_REQUIRE_DOCKER=1" in lines[compose] and "-m compose" in lines[compose]
    assert lines[compose + 1] == '.venv/bin/python .ci/check_suites.py "$SPECQ_COMPOSE_REPORT" --suites compose --strict'
