"""The GPU-pinned Celery worker: one Engine per process, one job at a time.

* `specq.worker.runtime` — loads the Engine once and runs one job: claim it in the store, run the
  engine with a progress callback that reports progress and honours cancel requests and the time
  limit, then save the result and timings in one transaction (or fail / retry / cancel it).
* `specq.worker.app` — the Celery app and the `specq.run_job` task (imports no model code).
* `specq.worker.main` — `specq worker`: pins the GPU, loads the models, starts consuming.

Settings: `specq.settings.ServiceSettings` (SPECQ_* environment variables).
"""
