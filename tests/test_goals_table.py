"""Issue 50's goals table (specq/bench/goals_table.py): each line's ratio, status and bound from its result."""

from specq.bench import goals_table as gt


def _get(files):
    return lambda rel, text: (files[rel], "dev", "abc", f"[{text}]({rel})")


def test_ttft_goal_names_the_scoring_time_the_bar_needs():
    data = {"rows": [{"prompt_tokens": 100, "baseline_ttft_ms": 3000.0, "specprefill_ttft_ms": 1200.0,
                      "specprefill_phases_ms": {"score": 500.0, "sparse_prefill": 650.0}}]}
    row = gt.TtftGoal("x", "r.json", 100, 3.0).row(_get({"r.json": data}))
    assert "**2.50×**" in row[2] and row[3] == "not met"
    # 3000 / 3 = 1000 ms allowed; the rest (1200 - 500 = 700) stays, so scoring must fit in 300 ms; free: 3000 / 700
    assert "≤ 300 ms" in row[4] and "4.29×" in row[4]
    met = gt.TtftGoal("x", "r.json", 100, 2.0).row(_get({"r.json": data}))  # a met goal names nothing
    assert met[3] == "**met**" and met[4] == "–"


def _jobs(ends):
    return [{"question": q, "end_s": e} for q, e in ends]


def test_followup_goal_splits_the_first_questions_from_the_follow_ups():
    a = {"summary": {"jobs_per_min": 90.0, "client_ttft_ms_later_questions_p50": 120.0},
         "workload": {"mode": "auto"}, "jobs": _jobs([(0, 10.0), (0, 21.0), (1, 30.0), (1, 39.5)])}
    b = {"summary": {"jobs_per_min": 100.0, "client_ttft_ms_later_questions_p50": 100.0},
         "workload": {"mode": "baseline"}, "jobs": _jobs([(0, 19.4), (1, 38.4)])}
    row = gt.FollowupGoal("a", "b").row(_get({"a": a, "b": b}))
    assert "**0.90×**" in row[2] and "**1.20×**" in row[2]
    assert row[3] == "jobs/min not met, TTFT **met**"
    assert "done at 21.0 s against 19.4 s" in row[4] and "18.5 s against 19.0 s" in row[4]


def test_distinct_goal_takes_the_job_the_engine_started_first_in_the_one_slot_run():
    jobs = [{"index": i, "engine": {"ttft": t}, "trace": {"engine_start": s}}
            for i, (t, s) in enumerate([(900.0, 5.0), (4000.0, 1.0), (1000.0, 6.0)])]
    one = {"summary": {"jobs_per_min": 20.0}, "jobs": jobs}
    a = {"summary": {"jobs_per_min": 60.0, "makespan_s": 64.0}, "workload": {"docs": 3, "doc_tokens": 100}, "jobs": []}
    b = {"summary": {"jobs_per_min": 15.0, "makespan_s": 256.0}, "jobs": []}
    row = gt.DistinctGoal("a", "b", "one").row(_get({"a": a, "b": b, "one": one}))
    # job 1 started first; its 4000 ms against the median 1000 ms
    assert "**4.00×**" in row[2] and "**4.00**" in row[2]
    assert row[3] == "jobs/min **met**, first job not met" and "4,000 ms" in row[4]
    alone = gt.DistinctGoal("a", "b").row(_get({"a": a, "b": b}))
    assert alone[3] == "jobs/min **met**, first job not measured (no 1-slot run)" and alone[4] == "–"


def test_every_shipped_goal_renders_from_its_result():
    from specq.bench import report

    text = report.goals_50_table(report.load_results(), report.REPO / "docs")
    assert text.count("\n") >= len(gt.GOALS) + 1
