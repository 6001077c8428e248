"""The docs' generated parts match what their sources render: the tables of measured numbers
(`specq bench report`, from bench/results/*.json), the configuration reference (from
specq/settings.py) and the history index; and README.md stays a short front door that starts with
its two commands.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specq.bench import report
from specq.settings_reference import settings_markdown

REPO = Path(__file__).resolve().parents[1]

#: README's two commands, byte for byte: a fresh machine runs the first, CI runs the second
SETUP_COMMAND = ('scripts/setup.sh && .venv/bin/specq up --detach && .venv/bin/specq submit examples/python-license.txt '
                 '-q "In what year did the Python core team move to BeOpen.com?" --wait')
TEST_COMMAND = ".venv/bin/python -m pytest -q"


def test_every_committed_table_is_what_specq_bench_report_renders():
    differs = report.render_all(write=False)
    assert not differs, ("these files differ from what `specq bench report` renders (run it and commit): "
                         + ", ".join(str(p.relative_to(REPO)) for p in differs))


def test_specq_bench_report_check_exits_1_on_a_stale_table_and_rewrites_it(tmp_path):
    """The command itself, on a copy of the docs whose results table is stale."""
    for name in ("README.md", "docs", "bench", "specq"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("*.jsonl", "*.png", "*.log", "__pycache__"))
        else:
            shutil.copy2(src, tmp_path / name)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("**6.67×**", "**9.99×**"))
    run = lambda *args: subprocess.run([sys.executable, "-m", "specq", "bench", "report", *args], cwd=tmp_path,  # noqa: E731
                                       capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    got = run("--check")
    assert got.returncode == 1, got.stdout + got.stderr
    assert "differs: README.md" in got.stdout
    assert "9.99" in readme.read_text()  # --check writes nothing
    got = run()
    assert got.returncode == 0, got.stderr
    assert "rendered: README.md" in got.stdout
    assert "**6.67×**" in readme.read_text() and "9.99" not in readme.read_text()
    assert run("--check").returncode == 0


def test_a_changed_result_changes_its_rows():
    results = report.load_results()
    ttft = next(r for r in results if r.rel == "bench/results/h200-2026-12-04e/m1-ttft-7b.json")
    before = report.ttft_table(results, REPO / "docs")
    assert "| 2,138 | 889 | **2.41×** |" in before
    data = copy.deepcopy(ttft.data)
    data["rows"][0].update(baseline_ttft_ms=3000.0, ratio=3.376)
    changed = [report.Result(r.path, data) if r is ttft else r for r in results]
    after = report.ttft_table(changed, REPO / "docs")
    assert "| 3,000 | 889 | **3.38×** |" in after and "**2.41×**" not in after


def test_ttft_rows_show_the_speculator_throughput_where_the_report_has_it():
    """Reports from before the speculator throughput fields render "–" there; one with them shows them."""
    results = report.load_results()
    ttft = next(r for r in results if r.rel == "bench/results/h200-2026-12-04e/m1-ttft-7b.json")
    assert "| **2.41×** | – | – |" in report.ttft_table(results, REPO / "docs")
    data = copy.deepcopy(ttft.data)
    data["rows"][0].update(speculator_tokens=32700, speculator_tokens_per_s=125432.1, fraction_of_peak=0.1534)
    changed = [report.Result(r.path, data) if r is ttft else r for r in results]
    assert "| **2.41×** | 125,432 | 15.3% |" in report.ttft_table(changed, REPO / "docs")
    # a CPU run: tokens/s, no peak
    data["rows"][0].update(fraction_of_peak=None)
    assert "| **2.41×** | 125,432 | – |" in report.ttft_table(changed, REPO / "docs")


def test_rows_carry_the_recorded_code_and_reports_without_provenance_go_to_history():
    results = report.load_results()
    base = REPO / "docs"
    serve = report.serve_table(results, base)
    # the JSON says 658ff31acc05-dirty: the table says so (not a hand-typed "658ff31")
    assert "`658ff31acc05-dirty`" in serve
    history = report.history_table(results, base)
    no_prov = [r for r in results if r.provenance is None]
    assert no_prov, "bench/results holds reports from before the provenance object"
    for r in no_prov:
        assert f"({Path('../' + r.rel).as_posix()})" in history
        assert r.rel.removeprefix("bench/results/") + "]" not in report.ttft_table(results, base)
        assert r.rel.removeprefix("bench/results/") + "]" not in serve
    with_prov = [r for r in results if r.provenance is not None]
    assert all(f"({Path('../' + r.rel).as_posix()})" not in history for r in with_prov)


def test_readme_quality_rows_include_the_30k_row():
    """The old README said the real-pair quality rows "stop at 16K" while a 30K row existed."""
    readme = (REPO / "README.md").read_text()
    assert "stop at 16K" not in readme
    assert re.search(r"30K: 1\.15 \(≥ 0\.96, n 40\)", readme)


def test_an_unknown_marker_is_an_error(tmp_path):
    with pytest.raises(report.ReportError, match="names no table"):
        report.render_text("<!-- report:nope -->\nx\n<!-- /report:nope -->\n", tmp_path, [])


def test_prose_outside_the_markers_is_kept():
    text = "before\n<!-- report:settings -->\nSTALE TEXT\n<!-- /report:settings -->\nafter\n"
    out = report.render_text(text, REPO / "docs", [])
    assert out.startswith("before\n<!-- report:settings -->\n") and out.endswith("<!-- /report:settings -->\nafter\n")
    assert "STALE TEXT" not in out and "`SPECQ_TIME_LIMIT`" in out


def test_the_configuration_reference_names_every_setting_with_its_default_and_comment():
    import dataclasses

    from specq.settings import ServiceSettings

    md = settings_markdown()
    for f in dataclasses.fields(ServiceSettings):
        assert f"| `SPECQ_{f.name.upper()}` |" in md, f.name
    assert "| `SPECQ_TIME_LIMIT` | `3600.0` | hard wall-clock limit of one job attempt" in md
    assert "| `SPECQ_CACHE_BYTES` | `2147483648` (`2 << 30`) |" in md
    assert "* `SPECQ_DATABASE_URL` — the job store" in md
    committed = (REPO / "docs" / "configuration.md").read_text()
    assert md.strip() in committed


def test_readme_is_short_and_starts_with_its_two_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme) <= 10_000, f"README.md is {len(readme):,} characters (at most 10,000)"
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", readme, re.S | re.M)
    assert blocks[:2] == [SETUP_COMMAND + "\n", TEST_COMMAND + "\n"]


def test_readme_links_the_user_guide_and_the_three_ways_to_use_it():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for target in ("docs/README.md", "docs/cli.md", "docs/openai.md", "docs/deploy.md", "docs/benchmarks.md", "docs/quality.md"):
        assert f"]({target}" in readme, target
    assert "docker compose up -d --build" in readme and "from openai import OpenAI" in readme



def test_readme_says_where_mode_auto_runs_specprefill_and_links_the_evidence():
    """Issue 47's "Done when": README's mode-auto paragraph says where `auto` runs specprefill today
    (nowhere by default: no shipped row passes; the operator override) and links the evidence."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    para = next(p for p in readme.split("\n\n") if p.startswith("Mode `auto` (the default)"))
    assert "no shipped row passes" in para and "SPECQ_AUTO_QUALITY_MIN_TOKENS" in para
    assert "/ui/evidence" in para and "](docs/quality.md#evidence-rows-issue-47)" in para
    from specq.engine.policy import evidence
    assert not [r for r in evidence.shipped_rows() if r.passes], "a shipped row passes: README must say where"


def test_the_user_pages_hold_no_dated_lab_notebook():
    """The dated narrative lives in docs/history.md (newest first); benchmarks.md and quality.md keep
    the explanation and the rendered tables, so a dated section added there is a section misplaced."""
    for page in ("benchmarks.md", "quality.md"):
        dated = [line for line in (REPO / "docs" / page).read_text(encoding="utf-8").splitlines()
                 if re.match(r"^#{1,3}\s.*\d{4}-\d{2}-\d{2}", line)]
        assert not dated, f"docs/{page}: move to docs/history.md: {dated}"
    history = (REPO / "docs" / "history.md").read_text(encoding="utf-8")
    dates = re.findall(r"^## .*?(\d{4}-\d{2}-\d{2})", history, re.M)
    assert len(dates) > 20 and dates == sorted(dates, reverse=True), "history.md: newest first"
