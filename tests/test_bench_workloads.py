"""The mixed workload's job list (specq/bench/workloads.py) without any server: seeded, in range, the
same for specq and llama-server, and its per-band summary; the CLI refuses a bad range with a message."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specq.bench import workloads
from specq.bench import report
from specq.bench.serve import Workload, build_requests, job_plan
from specq.cli import app

MIXED = dict(docs=40, lengths_mix="4096:65536", max_tokens_mix="64:512", arrival="poisson:0.5", seed=7)


def test_same_seed_same_job_list_other_seed_another():
    a, b = job_plan(Workload(**MIXED)), job_plan(Workload(**MIXED))
    assert a == b and len(a) == 40
    c = job_plan(Workload(**{**MIXED, "seed": 8}))
    assert [j.doc_tokens for j in c] != [j.doc_tokens for j in a]
    assert [j.offset_s for j in c] != [j.offset_s for j in a]


def test_lengths_log_uniform_in_range_outputs_uniform_offsets_poisson():
    jobs = job_plan(Workload(**{**MIXED, "docs": 400}))
    lengths = [j.doc_tokens for j in jobs]
    outs = [j.max_tokens for j in jobs]
    assert min(lengths) >= 4096 and max(lengths) <= 65536 and min(outs) >= 64 and max(outs) <= 512
    # log-uniform over 4K..64K: each factor-of-2 octave holds about a quarter of the jobs (uniform would
    # put ~3% below 8K); the median is near the geometric mean, 16K
    below_8k = sum(x < 8192 for x in lengths) / len(lengths)
    assert 0.18 < below_8k < 0.32, below_8k
    assert 12000 < sorted(lengths)[200] < 22000
    assert 200 < sum(outs) / len(outs) < 380  # uniform 64..512: mean 288
    offsets = [j.offset_s for j in jobs]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert 0.35 < (len(offsets) - 1) / offsets[-1] < 0.7  # Poisson at 0.5 jobs/s
    # the output range has its own stream: another range leaves the document lengths as they were
    other = job_plan(Workload(**{**MIXED, "docs": 400, "max_tokens_mix": "8:16"}))
    assert [j.doc_tokens for j in other] == lengths


def test_both_servers_get_the_same_prompts_and_output_lengths():
    w = Workload(**{**MIXED, "docs": 6, "lengths_mix": "50:400", "chars_per_token": 1.0})
    specq, llama = build_requests(w, "specq", "m"), build_requests(w, "llama-server", "m")
    plan = job_plan(w)
    for s, ll, job in zip(specq, llama, plan):
        assert s["messages"] == ll["messages"] and s["max_tokens"] == ll["max_tokens"] == job.max_tokens
        assert s["specq"]["ignore_eos"] and ll["ignore_eos"]
        doc = s["messages"][0]["content"].split("\n\nQuestion")[0]
        assert len(doc) == job.doc_tokens  # 1 character per token here
    assert len({s["messages"][0]["content"] for s in specq}) == 6


def test_fixed_workload_plan_is_the_fixed_lengths():
    plan = job_plan(Workload(docs=2, questions=3, doc_tokens=500, max_tokens=9, arrival="per-doc"))
    assert [(j.doc_tokens, j.max_tokens, j.offset_s) for j in plan] == [(500, 9, None)] * 6


def test_bands_and_summary():
    assert [workloads.band_name(x, [8192, 32768]) for x in (4096, 8191, 8192, 32767, 32768, 65536)] == \
        ["<8K", "<8K", "8K-32K", "8K-32K", ">=32K", ">=32K"]
    assert workloads.band_name(250, [200, 300]) == "200-300"
    rows = [{"planned_doc_tokens": 5000, "sent_s": 0.0, "end_s": 6.0, "ttft_ms": 100.0, "output_tokens": 60, "error": ""},
            {"planned_doc_tokens": 6000, "sent_s": 1.0, "end_s": 3.0, "ttft_ms": 300.0, "output_tokens": 60, "error": ""},
            {"planned_doc_tokens": 40000, "sent_s": 2.0, "end_s": 12.0, "ttft_ms": 2000.0, "output_tokens": 100, "error": ""},
            {"planned_doc_tokens": 50000, "sent_s": 3.0, "end_s": 4.0, "ttft_ms": None, "output_tokens": 0, "error": "x"}]
    m = workloads.mixed_summary(rows, [8192, 32768])
    assert list(m["bands"]) == ["<8K", ">=32K"]
    small, big = m["bands"]["<8K"], m["bands"][">=32K"]
    assert small == {"jobs": 2, "succeeded": 2, "jobs_per_min": 20.0, "output_tok_s": 20.0,
                     "client_ttft_ms_p50": 200.0, "client_ttft_ms_p90": 280.0}
    assert big["jobs"] == 2 and big["succeeded"] == 1 and big["jobs_per_min"] == 6.0 and big["output_tok_s"] == 10.0
    assert m["client_ttft_ms_p90"] == pytest.approx(1660.0)


@pytest.mark.parametrize("bad", ["4096", "0:10", "10:5", "a:b", "4096-65536"])
def test_bad_range_is_refused(bad):
    with pytest.raises(ValueError, match="--lengths-mix"):
        workloads.parse_range(bad, "--lengths-mix")
    got = CliRunner().invoke(app, ["bench", "serve", "--lengths-mix", bad, "--url", "http://127.0.0.1:9"])
    assert got.exit_code != 0 and "--lengths-mix must be LO:HI" in got.output, got.output


def test_cli_refuses_mixed_with_documents_and_bad_bands():
    run = lambda *a: CliRunner().invoke(app, ["bench", "serve", "--url", "http://127.0.0.1:9", *a])  # noqa: E731
    got = run("--lengths-mix", "10:20", "--documents")
    assert got.exit_code != 0 and "one question per document" in got.output, got.output
    got = run("--max-tokens-mix", "4:8", "--length-bands", "300,200")
    assert got.exit_code != 0 and "length bands must be increasing" in got.output, got.output


def test_report_renders_the_mixed_workload_row():
    w = {"docs": 64, "lengths_mix": "4096:65536", "max_tokens_mix": "64:512", "arrival": "poisson:0.5", "mode": "auto"}
    r = report.Result(report.REPO / "bench/results/x/serve-specq8-mixed-65536.json",
                      {"label": "specq 8 slots-mixed", "model": "7b.gguf", "workload": w, "provenance": {"code": {"describe": "abc"}},
                       "summary": {"jobs": 64, "succeeded": 64, "jobs_per_min": 30.0, "client_ttft_ms_p50": 1500.0}})
    table = report.serve_table([r], report.REPO / "docs")
    assert "64 docs × 4096–65536 tokens (log-uniform), 64–512 out, poisson:0.5, mode auto" in table, table
    assert "**30.0**" in table and "| 1.5 |" in table, table
