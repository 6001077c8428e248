"""Shadow checks as policy: which mode-auto specprefill jobs are answered in baseline too, whether the two
answers agree, and when a key's agreement disables the evidence rows that sent its jobs to specprefill.

A shadow check re-runs a finished job in baseline (full prefill, same greedy settings) while the worker
has nothing else to do (worker/shadow.py) and compares the answers. The evidence rows (evidence.py)
were measured on someone's documents; shadow checks watch the deployment's own traffic.

* **Which jobs** (`eligible`, `sampled`): a job that asked for mode auto, ran specprefill on one-off
  evidence (rule 3, not a group-sparse prefill: group answers are their own arm) and decodes greedily
  (temperature 0: sampling would make two runs of one prompt differ by chance); of those, the fraction
  SPECQ_SHADOW_RATE, picked by a hash of the job id (the same job is picked on every worker, a retry too).
* **Agreement** (`agrees`): the two answers are the same generated tokens (one target, one tokenizer:
  the same answer token for token; where a run has no token ids, the texts equal after trimming
  surrounding whitespace). Exact: it needs no labels and no grader, and for the short answers mode
  auto's evidence is measured on, a different answer is a changed answer. Free-form answers disagree more often without being worse; a
  deployment of long answers reads the agreement as a lower bound of quality, not as quality.
* **Disabling** (`disable_reason`, `apply`): agreement is counted per job key (evidence_key.EvidenceKey:
  the settings the job ran with); a row counts the checks of every key it is evidence for
  (first_difference). Once a row has >= MIN_CHECKS answered checks (cancelled ones do not count) and the
  one-sided 90% Clopper-Pearson lower bound of the agreement is below MIN_AGREEMENT, the row is disabled
  (its `disabled` reason says so), mode auto stops using it, and the job's reason names it ("... does
  not pass (1200: disabled: shadow checks: ...)"). 20 checks: with every answer agreeing the bound is
  0.89, so a key that agrees is never disabled by the first few checks; one disagreement in 20 still
  passes (0.82), two do not (0.75). The checks are about the deployment's traffic, not about one row: a
  new row for the same settings is disabled by them too, until the key's checks agree again (the bound
  rises above the bar with further agreeing checks) or an operator deletes them (table `shadow_checks`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from .auto import chose_group
from .evidence import EvidenceRow
from .evidence_bound import cp_lower
from .evidence_key import FIELDS, EvidenceKey, first_difference

#: answered checks a key needs before its agreement can disable a row
MIN_CHECKS = 20
#: the agreement's 90% lower bound below which a row is disabled
MIN_AGREEMENT = 0.8
#: the confidence of that bound
CONFIDENCE = 0.9
#: a shadow check's outcomes, as stored (storage/shadow.py)
OUTCOMES = ("agree", "disagree", "cancelled")


def eligible(asked_mode: str, ran_mode: str, reason: str, temperature: float) -> bool:
    """Whether a finished job may get a shadow check (module doc): auto sent it to one-off specprefill, greedy."""
    return asked_mode == "auto" and ran_mode == "specprefill" and not chose_group(reason) and temperature == 0.0


def sampled(job_id: str, rate: float) -> bool:
    """Whether `job_id` is among the `rate` fraction picked for a shadow check (by a hash of the id)."""
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    h = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")
    return h / 2.0**64 < rate


def agrees(answer: str, baseline: str, answer_tokens: Sequence[int] = (), baseline_tokens: Sequence[int] = ()) -> bool:
    """The two answers are the same tokens (where both runs have them), else the same text, surrounding
    whitespace aside."""
    if answer_tokens and baseline_tokens:
        return list(answer_tokens) == list(baseline_tokens)
    return answer.strip() == baseline.strip()


def key_id(key: EvidenceKey) -> str:
    """A key's identity as stored: sha256 of its compared fields (labels left out)."""
    data = {name: getattr(key, name) for name in FIELDS}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Agreement:
    """Shadow checks of one key (or of every key a row is evidence for)."""

    agreed: int = 0
    disagreed: int = 0
    cancelled: int = 0

    @property
    def n(self) -> int:
        """Answered checks (cancelled ones excluded)."""
        return self.agreed + self.disagreed

    @property
    def rate(self) -> float | None:
        return self.agreed / self.n if self.n else None

    @property
    def bound(self) -> float:
        """The one-sided 90% lower bound of the agreement (0 with no check)."""
        return cp_lower(self.agreed, self.n, CONFIDENCE)

    def __add__(self, other: "Agreement") -> "Agreement":
        return Agreement(self.agreed + other.agreed, self.disagreed + other.disagreed, self.cancelled + other.cancelled)

    def as_dict(self) -> dict:
        return {"n": self.n, "agreed": self.agreed, "disagreed": self.disagreed, "cancelled": self.cancelled,
                "agreement": None if self.rate is None else round(self.rate, 4), "bound": round(self.bound, 4),
                "disables": bool(disable_reason(self))}


@dataclass(frozen=True)
class KeyChecks:
    """The stored checks of one job key (storage/shadow.py `by_key`, parsed)."""

    key: EvidenceKey
    checks: Agreement


def disable_reason(a: Agreement) -> str:
    """Why checks `a` disable a row ("" = they do not): >= MIN_CHECKS answered, lower bound < MIN_AGREEMENT."""
    if a.n < MIN_CHECKS or a.bound >= MIN_AGREEMENT:
        return ""
    return (f"shadow checks: {a.agreed} of {a.n} answers agreed with baseline, {CONFIDENCE:.0%} lower bound "
            f"{a.bound:.2f} < {MIN_AGREEMENT} (SPECQ_SHADOW_RATE; docs/quality.md)")


def row_checks(row: EvidenceRow, keys: Iterable[KeyChecks]) -> Agreement:
    """The checks that count for `row`: those of every job key it is evidence for."""
    return key_checks(row.key, keys)


def key_checks(row_key: EvidenceKey, keys: Iterable[KeyChecks]) -> Agreement:
    total = Agreement()
    for k in keys:
        if first_difference(k.key, row_key) is None:
            total = total + k.checks
    return total


def apply(rows: Sequence[EvidenceRow], keys: Sequence[KeyChecks]) -> tuple[EvidenceRow, ...]:
    """`rows` with the specprefill rows whose checks disable them (`disable_reason`) marked disabled;
    a row disabled already keeps its own reason."""
    if not keys:
        return tuple(rows)
    out = []
    for r in rows:
        if r.arm == "specprefill" and not r.disabled:
            why = disable_reason(row_checks(r, keys))
            if why:
                r = replace(r, disabled=why)
        out.append(r)
    return tuple(out)


def annotate(listed: list[dict], keys: Sequence[KeyChecks]) -> list[dict]:
    """evidence.listing's row dicts with their shadow checks (`shadow`: Agreement.as_dict) and, where the
    checks disable a row, `disabled`, `passes` and `fails` as the workers see it (`apply`)."""
    out = []
    for d in listed:
        d = dict(d)
        if d.get("arm") == "specprefill":
            total = key_checks(EvidenceKey.from_dict(d["key"]), keys)
            d["shadow"] = total.as_dict()
            why = disable_reason(total)
            if why and not d.get("disabled"):
                d.update(disabled=why, passes=False, fails=f"disabled: {why}")
        out.append(d)
    return out


def parse_keys(stored: Iterable[dict]) -> list[KeyChecks]:
    """storage/shadow.by_key's dicts as KeyChecks; a stored key that no longer validates is left out."""
    out = []
    for d in stored:
        try:
            key = EvidenceKey.from_dict(d["key"])
        except (ValueError, KeyError, TypeError):
            continue
        out.append(KeyChecks(key, Agreement(int(d.get("agree", 0)), int(d.get("disagree", 0)), int(d.get("cancelled", 0)))))
    return out


__all__ = ["MIN_CHECKS", "MIN_AGREEMENT", "CONFIDENCE", "OUTCOMES", "Agreement", "KeyChecks", "eligible", "sampled",
           "agrees", "key_id", "disable_reason", "row_checks", "key_checks", "apply", "annotate", "parse_keys"]
