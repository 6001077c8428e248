"""`specq bench shadow-cost` / `calibrate-service` (bench/gpu/serve.sh calshadow): the client-side arithmetic and the
docs' tables rendered from their result files (the runs themselves need a service: the CPU smoke in
bench/gpu/README.md)."""

from __future__ import annotations

from specq.bench import report
from specq.bench.shadow_cost import Scraper, busy_fraction, compare

REPO = report.REPO


def test_busy_fraction_is_the_union_of_the_jobs_spans_over_the_makespan():
    jobs = [{"sent_s": 0.0, "end_s": 2.0}, {"sent_s": 1.0, "end_s": 3.0}, {"sent_s": 5.0, "end_s": 10.0},
            {"sent_s": 6.0, "end_s": None}]  # a failed job has no end and adds nothing
    assert busy_fraction(jobs) == 0.8  # (3 + 5) / 10
    assert busy_fraction([]) is None


def test_the_window_reads_the_last_scrape_at_or_before_its_end():
    sc = Scraper("http://unused")
    sc.samples = [(10.0, {"checks": 0.0}), (11.0, {"checks": 1.0}), (12.0, {"checks": 3.0})]
    assert sc.at(11.5) == {"checks": 1.0} and sc.at(12.0) == {"checks": 3.0} and sc.at(5.0) == {"checks": 0.0}


def _run(rate: float, jpm: float, p50: float, checks: float) -> dict:
    return {"shadow_rate": rate, "arrival_rate": 0.5, "jobs": 32, "jobs_per_min": jpm, "client_ttft_ms_p50": p50,
            "client_ttft_ms_p90": 2 * p50, "busy_fraction": 0.7, "shadow_seconds_share_of_makespan": 0.02,
            "shadow_window": {"checks": checks, "cancelled": 1.0, "seconds": 1.5},
            "run": {"workload": {"doc_tokens": 15360, "max_tokens": 64}}}


def test_tables_say_not_run_on_a_gpu_until_a_gpu_result_exists():
    for name in ("calibrate-service", "shadow-cost"):
        assert report.RENDERERS[name]([], REPO / "docs").startswith("**Not run on a GPU yet**")
    off, on = _run(0.0, 30.0, 400.0, 0.0), _run(0.05, 27.0, 500.0, 2.0)
    prov = {"code": {"describe": "abc"}, "host": {"gpu": "NVIDIA H100 80GB HBM3, 81559 MiB, 550.1"}}
    shadow = report.Result(REPO / "bench/results/x/shadow-cost.json",
                           {"benchmark": "shadow-cost", "routing": "override", "without": off, "with": on,
                            "ratio_with_over_without": compare(off, on), "provenance": prov})
    text = report.shadow_cost_table([shadow], REPO / "docs")
    assert "Not run on a GPU" not in text and "NVIDIA H100 80GB HBM3" in text
    assert "**0.900×**" in text and "1.250×" in text and "| 2 / 1 |" in text and "Routing: override." in text
    cal = report.Result(REPO / "bench/results/x/calibrate-service.json",
                        {"benchmark": "calibrate-service", "workload": {"docs": 8, "questions": 2, "doc_tokens": 7680},
                         "units": 16, "units_done": 16, "wall_s": 60.0, "questions_per_min": 16.0, "unit_s_p50": 3.5,
                         "unit_engine_s_p50": 3.2, "rows_written": 3, "provenance": prov})
    text = report.calibrate_service_table([cal], REPO / "docs")
    assert "Not run on a GPU" not in text and "| 16/16 | 60.0 | **16.0** | 3.50 | 3.20 | 3 |" in text
