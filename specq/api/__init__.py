"""The REST API (FastAPI) of the job service: `specq.api.app.create_app()`; run with `specq api`."""
