"""The worker's copy of mode auto's quality evidence: the shipped rows merged with the store's
(engine/evidence.merge), with the rows that shadow checks disable marked so (engine/policy/shadow.apply),
handed to the engine (`Engine.set_evidence`; the engine reads no database).

Loaded when the worker starts and again whenever the store's evidence revision changes, checked at
claim time (one `SELECT max(revision)` and one `SELECT max(id)` of the shadow checks per claim), so a row written through POST /v1/evidence counts
from the next claimed job on, without a restart. A stored row that no longer validates (written around
the API, or by an older version) is left out and logged, never read half-way.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from ..engine.policy import shadow
from ..engine.policy.evidence import merge, row_from_dict, shipped_rows
from ..storage import evidence as store, shadow as shadow_store

log = logging.getLogger("specq.worker")


class EvidenceWatch:
    def __init__(self) -> None:
        self.version: tuple[int, int] = (-1, -1)  # (evidence revision, last shadow check); nothing loaded yet

    def refresh(self, session: Session, engine) -> bool:
        """Reload into `engine` if the store's rows changed since the last load; whether it reloaded."""
        v = (store.version(session), shadow_store.version(session))
        if v == self.version:
            return False
        rows = []
        for d in store.list_rows(session):
            try:
                rows.append(row_from_dict(d))
            except ValueError as e:
                log.warning("evidence row %s left out: %s", d.get("id"), e)
        used = merge(shipped_rows(), rows)
        if v[1]:
            used = shadow.apply(used, shadow.parse_keys(shadow_store.by_key(session)))
        engine.set_evidence(used)
        self.version = v
        log.info("quality evidence: %d rows (%d stored, revision %d), %d passing, %d disabled by shadow checks",
                 len(used), len(rows), v[0], sum(r.passes for r in used),
                 sum(r.disabled.startswith("shadow checks") for r in used))
        return True


__all__ = ["EvidenceWatch"]
