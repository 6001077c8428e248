"""What the evidence and shadow-check tests share: the tiny pair's evidence key for one document, a migrated
store on each backend (`url`), and a migration's down-and-up round trip."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from service_helpers import empty_store
from specq.storage import db

#: a short document whose questions ("What is the value of item N?") have one answer each
DOC = "".join(f"line {i}: the value of item {i} is {i * 7 % 13}.\n" for i in range(40))
#: the job params the key is resolved for (a job must declare its kind to use one kind's rows, issue 49)
PARAMS = {"window": 256, "task": "lookup"}


def engine_with_stored_rows(env: dict[str, str], database_url: str):
    """An Engine of the service `env` describes (tiny documents: the CPU break-even lowered to 64 tokens) with
    the evidence rows of the store at `database_url` loaded as a worker loads them (worker.evidence.EvidenceWatch).
    The caller closes it."""
    from specq.engine.pipeline import Engine
    from specq.settings import ServiceSettings
    from specq.worker.evidence import EvidenceWatch

    opts = ServiceSettings.from_env({k: v for k, v in env.items() if k.startswith("SPECQ_")}).engine_options()
    opts.auto_min_tokens = 64  # the tiny documents are far below the CPU break-even
    e = Engine(opts)
    with db.session(database_url) as s:
        assert EvidenceWatch().refresh(s, e)
    return e


def tiny_evidence_key(models) -> dict:
    """The key a worker on `models` resolves for DOC with PARAMS (native prompt)."""
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine

    e = Engine(EngineOptions(target=str(models.target), speculator=str(models.speculator), n_gpu_layers=0,
                             n_ctx=4096, n_threads=2))
    try:
        params = RunParams(question="What is the value of item 7?", **PARAMS)
        prompt = e.tokenize_prompt(DOC, params)
        return e.evidence_key(prompt, params, "original" if e.gaps_supported else "compressed").as_dict()
    finally:
        e.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path, monkeypatch):
    """A migrated, empty job store on each backend (the process's SPECQ_DATABASE_URL), for the modules that
    import this fixture."""
    with empty_store(request.param, tmp_path) as u:
        monkeypatch.setenv("SPECQ_DATABASE_URL", u)
        db.upgrade(u)
        yield u


def migration_round_trip(url: str, revision: str, table: str) -> None:
    """Down to the revision before `revision` and up again: `table` goes, then comes back."""
    from alembic import command

    cfg = db.alembic_config(url)
    before = f"{int(revision) - 1:04d}"
    with db.get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, before)
    assert table not in inspect(db.get_engine(url)).get_table_names()
    assert db.upgrade(url) == db.head_revision() >= revision
    assert table in inspect(db.get_engine(url)).get_table_names()


__all__ = ["DOC", "PARAMS", "engine_with_stored_rows", "tiny_evidence_key", "url", "migration_round_trip"]
