"""The benchmark harness itself, with the tiny random-weight models: every report records its
provenance (code, library and patch probe, numerics of both models, positions, warnings, host), `bench
ttft` runs baseline and specprefill in the same numerics in both batch-invariant modes and quotes the
fastest baseline, and `bench decode` books the model drafter's own prompt prefill apart from decode."""

from __future__ import annotations

import json

import pytest

from specq.engine.options import EngineOptions

NUMERICS_KEYS = {"batch_invariant", "repack", "flash_attn", "type_k", "type_v", "n_batch", "n_ubatch", "n_threads",
                 "n_ctx", "n_gpu_layers", "model", "cuda_graphs"}


def _opts(tiny_models, n_ctx: int = 1024, **kw) -> EngineOptions:
    return EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                         n_ctx=n_ctx, n_threads=1, **kw)


def _check_provenance(prov: dict) -> None:
    code = prov["code"]
    assert code["describe"] and code["describe"] != "unknown" and code["commit"] and len(code["commit"]) == 40
    assert isinstance(code["dirty"], bool)
    if code["dirty"]:  # a dirty tree is flagged and its diff identified
        assert code["describe"].endswith("-dirty") or code["untracked"]
        assert len(code["diff_sha256"]) == 64
    else:
        assert code["diff_sha256"] is None
    lib = prov["library"]
    assert "+specq." in lib["llama_cpp_python"]  # our patched build
    assert lib["probe"]["eval_callback_setter (patch 0002)"] is True
    host = prov["host"]
    assert host["cpu"] and host["cores"] >= 1 and len(host["loadavg_before"]) == len(host["loadavg_after"]) == 3
    assert prov["date_utc"].endswith("Z") and prov["argv"]
    assert isinstance(prov["warnings"], list) and isinstance(prov["positions"], list)


def test_ttft_report_both_modes_same_numerics_and_provenance(tiny_models, tmp_path):
    from specq.bench.ttft import run_ttft_modes, write_outputs

    report = run_ttft_modes(_opts(tiny_models), [300], modes=("on", "off"), default_mode="on", reps=1, keep=0.5,
                            say=lambda m: None)
    write_outputs(report, tmp_path / "ttft.json", None)
    report = json.loads((tmp_path / "ttft.json").read_text())  # what a reader of the JSON gets
    prov = report["provenance"]
    _check_provenance(prov)
    assert prov["library"]["probe"]["position_gaps (patch 0001)"] is True
    assert prov["positions"] == ["original"]
    assert report["batch_invariant_modes"] == ["on", "off"]
    # in each mode, every baseline and specprefill run had the same target numerics ...
    assert report["same_numerics"] == {"on": True, "off": True}
    seen = {}
    for mode, rep in report["per_mode"].items():
        runs = rep["runs"]
        assert {r["mode"] for r in runs} == {"baseline", "specprefill"}
        numerics = {json.dumps(r["numerics"], sort_keys=True) for r in runs}
        assert len(numerics) == 1, numerics
        seen[mode] = json.loads(numerics.pop())
        assert rep["batch_invariant"] is (mode == "on")
        _check_provenance(rep["provenance"])
    # ... and the two modes really differ (on: no repack, q8_0 K cache; off: repack, f16)
    assert seen["on"]["batch_invariant"] and not seen["off"]["batch_invariant"]
    assert (seen["on"]["repack"], seen["on"]["type_k"]) == (False, "q8_0")
    assert (seen["off"]["repack"], seen["off"]["type_k"]) == (True, "f16")
    # every numerics setting of both models, per mode
    for mode in ("on", "off"):
        num = prov["numerics"][mode]
        assert NUMERICS_KEYS <= set(num["target"]), set(num["target"])
        assert {"repack", "flash_attn", "type_k", "type_v", "n_batch", "n_ubatch", "n_threads", "model", "cuda_graphs"} \
            <= set(num["speculator"])
        assert num["speculator"]["loaded"] and num["speculator"]["batch_invariant"] is False
        assert num["target"]["batch_invariant"] is (mode == "on")
    # the headline quotes the fastest baseline of both modes
    row = report["rows"][0]
    fastest = min(report["per_mode"][m]["rows"][0]["baseline_ttft_ms"] for m in ("on", "off"))
    assert row["fastest_baseline_ms"] == row["baseline_ttft_ms"] == fastest
    assert row["headline_mode"] == "on"
    # the ratio is rounded to 3 decimals (±5e-4) and computed from unrounded milliseconds
    assert row["ratio"] == pytest.approx(fastest / row["modes"]["on"]["specprefill_ttft_ms"], abs=6e-4)
    for m in ("on", "off"):
        # both ratios are rounded to 3 decimals (equal before rounding when the mode's baseline is the fastest)
        assert row["modes"][m]["ratio_vs_fastest_baseline"] <= row["modes"][m]["ratio"] + 1e-3
    # the speculator's pass as throughput: the window tokens its prefill phase ran, per second; on a CPU no
    # peak is measured, so no fraction of it
    assert report["speculator_throughput"]["peak"] is None
    assert report["speculator_throughput"]["shape"]["n_layer"] == 2
    for m in ("on", "off"):
        r = report["per_mode"][m]["rows"][0]
        # one window of ~300 document tokens + template + question, less the token the lookahead decodes
        assert r["windows"] == 1 and 300 < r["speculator_tokens"] < r["prompt_tokens"]
        assert r["speculator_tokens_per_s"] > 0 and r["speculator_tflops"] > 0
        assert r["speculator_tokens_per_s"] == pytest.approx(
            r["speculator_tokens"] / (r["specprefill_phases_ms"]["speculator_prefill"] / 1000), rel=0.01)
        assert r["fraction_of_peak"] is None
    assert row["speculator_tokens_per_s"] == row["modes"]["on"]["speculator_tokens_per_s"]
    assert row["fraction_of_peak"] is None


def test_decode_books_the_drafters_prefill_apart_and_records_provenance(tiny_models):
    from specq.bench.decode import default_jobs, run_bench

    prov: dict = {}
    rows = run_bench(_opts(tiny_models, n_ctx=4096, batch_invariant="on"), methods=("none", "model"), jobs=default_jobs()[:1],
                     max_tokens=8, provenance=prov)
    none, model = rows
    assert none.draft_prefill_ms == 0.0
    assert model.draft_prefill_ms > 0.0  # baseline mode: the speculator decoded the prompt itself ...
    assert model.decode_ms > 0.0  # ... and that time is not in decode_ms
    _check_provenance(prov)
    assert prov["positions"] == ["original"] and prov["settings"]["methods"] == ["none", "model"]
    assert prov["numerics"]["target"]["batch_invariant"] is True and prov["numerics"]["speculator"]["loaded"]
    assert any("cap" in w or "batch-invariant" in w for w in prov["warnings"]) or prov["warnings"] == []


def _git(repo, *args):
    import subprocess

    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_code_hash_covers_untracked_contents_and_leaves_results_out(tmp_path, monkeypatch):
    """Issue 44 item 14: the code's hash changes with the *contents* of an untracked file (a non-ASCII
    name too, which git quotes unless asked not to), and not with anything under bench/results/."""
    from specq.bench import provenance

    repo = tmp_path / "checkout"
    (repo / "bench/results").mkdir(parents=True)
    (repo / "engine.py").write_text("x = 1\n")
    (repo / "bench/results/old.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    monkeypatch.setattr(provenance, "REPO", repo)

    clean = provenance.code_state()
    assert clean["dirty"] is False and clean["diff_sha256"] is None
    # results written by a benchmark (a new report, a changed one) leave the code clean
    (repo / "bench/results/new.json").write_text('{"ratio": 1.2}\n')
    (repo / "bench/results/old.json").write_text('{"changed": true}\n')
    assert provenance.code_state()["dirty"] is False

    (repo / "engine.py").write_text("x = 2\n")
    edited = provenance.code_state()
    assert edited["dirty"] is True and len(edited["diff_sha256"]) == 64
    (repo / "bench/results/new.json").write_text('{"ratio": 0.9}\n')  # another report: same code, same hash
    assert provenance.code_state()["diff_sha256"] == edited["diff_sha256"]

    for name in ("helper.py", "réglage.py"):  # untracked: same name, other contents → another hash
        (repo / name).write_text("A = 1\n")
        first = provenance.code_state()
        (repo / name).write_text("A = 2\n")
        second = provenance.code_state()
        assert name in second["untracked"] and first["diff_sha256"] != second["diff_sha256"], name


def test_prefill_bench_times_gapped_prefill_at_original_positions(tiny_models):
    """`specq bench prefill`'s gapped arm prefills at original positions: its context must accept position
    jumps (it failed with "positions are not continuous" while the context was built without them)."""
    from specq.bench.prefill import run_prefill_bench

    report = run_prefill_bench(str(tiny_models.target), n_tokens=300, keep=0.3, decode_tokens=4, reps=1, n_gpu_layers=0,
                               n_threads=1, n_batch=512, n_ubatch=128, say=lambda m: None)
    assert report["prompt_tokens"] > 200 and 0 < report["kept_tokens"] < report["prompt_tokens"]
    assert report["full_tok_s"] > 0 and report["gapped_tok_s"] > 0 and report["decode_tok_s"] > 0
    _check_provenance(report["provenance"])
