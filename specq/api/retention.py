"""SPECQ_RETENTION in the API process: a thread that deletes finished jobs and batches older than it.

Every API process runs one when SPECQ_RETENTION is set (deleting is idempotent, so several API
processes sweeping the same store only repeat each other's empty sweeps). It sweeps at start and then
every retention/10, at least every 10 minutes and at most every second; what it deletes is
`storage.lifecycle.sweep_retention`.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from ..settings import ServiceSettings

log = logging.getLogger("specq.api")

#: longest pause between two sweeps, seconds
MAX_INTERVAL_S = 600.0


class RetentionTask(threading.Thread):
    def __init__(self, settings: ServiceSettings) -> None:
        super().__init__(name="specq-retention", daemon=True)
        self.retention_s = settings.retention_s
        self.interval = min(MAX_INTERVAL_S, max(1.0, self.retention_s / 10))
        self._stop_event = threading.Event()

    def start(self) -> None:
        if self.retention_s > 0:
            super().start()

    def sweep(self):
        from ..storage import db, lifecycle
        from ..storage.models import utcnow

        with db.session() as s:
            swept = lifecycle.sweep_retention(s, utcnow() - timedelta(seconds=self.retention_s))
        if swept.jobs or swept.batches:
            log.info("retention (SPECQ_RETENTION=%gs): %s", self.retention_s, swept.summary())
        return swept

    def run(self) -> None:
        while True:
            try:
                self.sweep()
            except Exception as e:  # the store is briefly unreachable: the next sweep tries again
                log.warning("retention sweep failed: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
            if self._stop_event.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop_event.set()


__all__ = ["RetentionTask"]
