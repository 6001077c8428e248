"""A worker whose model files are missing says so in its readiness (issue 52: "a missing model volume ->
the worker's readiness says why"), and with SPECQ_PULL_MODELS=0 (compose.yaml) waits for them instead
of pulling or crashing: the real `specq up` on the embedded default, tiny models, one of them not there
yet. tests/test_compose_up.py checks the same on the real images with no models volume at all."""

from __future__ import annotations

import shutil
import time

import httpx

from specq.worker.model_wait import model_problems

from service_helpers import embedded_up


def _readyz(url: str) -> dict:
    return httpx.get(f"{url}/readyz", timeout=5).json()


def test_a_registry_model_not_pulled_is_named_with_its_path_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_HOME", str(tmp_path))  # no models/ at all: the volume was not mounted
    from specq.engine import models

    waiting = model_problems({"target": models.DEFAULT_TARGET, "speculator": models.DEFAULT_SPECULATOR}, pulling=False)
    path = tmp_path / "models" / models.get_spec(models.DEFAULT_TARGET).filename
    assert len(waiting) == 2 and waiting[0].startswith(f"target model {models.DEFAULT_TARGET} is missing: {path} "), waiting
    assert "SPECQ_PULL_MODELS=0" in waiting[0] and f"mount the models volume at {tmp_path}" in waiting[0]
    assert "speculator model " + models.DEFAULT_SPECULATOR in waiting[1]
    pulling = model_problems({"target": models.DEFAULT_TARGET}, pulling=True)
    assert pulling[0].endswith("it is being pulled now"), pulling
    # a file the size of nothing is not taken for the model either (a pull cut short, a wrong mount)
    path.parent.mkdir()
    path.write_bytes(b"")
    assert f"is wrong size: {path}" in model_problems({"target": models.DEFAULT_TARGET}, pulling=False)[0]
    assert model_problems({"target": ""}, pulling=False) == []


def test_a_worker_without_its_model_file_is_not_ready_says_why_and_loads_once_it_is_there(tmp_path, tiny_models):
    later = tmp_path / "volume" / "target.gguf"
    (tmp_path / "home").mkdir()
    with embedded_up(tmp_path / "home", tiny_models, SPECQ_TARGET=str(later), SPECQ_PULL_MODELS="0",
                     SPECQ_WARM_UP="0") as st:
        deadline = time.monotonic() + 60
        while not (ready := _readyz(st.url)).get("workers_not_ready"):
            assert time.monotonic() < deadline, (ready, st.log("up")[-3000:])
            time.sleep(0.3)
        assert ready["status"] == "ready" and ready["workers_ready"] == 0, ready  # the API takes jobs; they wait
        (line,) = ready["workers_not_ready"]
        assert line.endswith(f": target model file not found: {later}"), line
        (worker,) = httpx.get(f"{st.url}/v1/workers", timeout=5).json()["data"]
        assert worker["ready"] is False and worker["not_ready"] == f"target model file not found: {later}", worker
        time.sleep(3)  # it waits: still there, still saying why (no exit, no restart loop)
        assert _readyz(st.url)["workers_not_ready"] == [line]
        assert "not ready: target model file not found" in st.log("up")

        later.parent.mkdir()
        shutil.copy(tiny_models.target, later)  # the volume is there now: it loads, and says it is ready
        deadline = time.monotonic() + 90
        while (ready := _readyz(st.url))["workers_ready"] < 1:
            assert time.monotonic() < deadline, (ready, st.log("up")[-3000:])
            time.sleep(0.5)
        assert ready["workers_not_ready"] == [], ready
        (worker,) = httpx.get(f"{st.url}/v1/workers", timeout=5).json()["data"]
        assert worker["ready"] is True and worker["not_ready"] is None, worker
