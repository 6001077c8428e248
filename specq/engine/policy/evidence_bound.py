"""The lower bound of an evidence row: a document-level (cluster) bootstrap of the accuracy ratio.

Questions about one document are not independent: a document the speculator reads badly costs all
its questions at once. So the unit resampled is the document: each of `BOOTSTRAP_DRAWS` draws
picks as many documents as were measured, with replacement, and computes the ratio of the sums
(arm right / baseline right over the drawn documents' questions); the bound is the `1 - conf`
quantile of those ratios (one-sided, 90% by default). A draw whose documents have no baseline-right
question counts as ratio 0 (the most pessimistic value). Deterministic: a fixed seed, so a row's
bound is reproducible from its per-document counts (the API recomputes it; a posted bound above
it is refused). Why not a bound over per-document ratios: with 4-10 questions a document, a single
document's ratio is 0, 0.5 or undefined as often as not; the ratio of sums weights documents by
their questions, as the point estimate does. With few documents a bootstrap is optimistic (it cannot
see variation the sample lacks: on the 16K rows' 2 documents it gave 1.2 against the exact paired
1.13), so a row's bound is the smaller of the two (`row_lower`), and a passing row also needs 8
documents (evidence.PASS_BARS). docs/quality.md "Evidence rows" says the same.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

METHOD = "min(document-bootstrap, exact-paired)"
BOOTSTRAP_DRAWS = 20_000
SEED = 47


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k), X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
    return min(1.0, total)


def cp_lower(k: int, n: int, conf: float = 0.9) -> float:
    """Exact one-sided lower bound: the p with P(X >= k | p) = 1 - conf (0 when k = 0)."""
    if n <= 0 or k <= 0:
        return 0.0
    alpha = 1.0 - conf
    lo, hi = 0.0, k / n
    for _ in range(80):
        mid = (lo + hi) / 2
        if binom_sf(k, n, mid) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


def paired_exact_lower(both: int, base_only: int, arm_only: int, conf: float = 0.9) -> float:
    """The exact conditional one-sided lower bound of the paired accuracy ratio (quality_report.paired):
    questions taken as independent. 1.0 with no discordant pair (and some both right), 0.0 with nothing right."""
    m = base_only + arm_only
    if both + base_only == 0:
        return 0.0
    if not m:
        return 1.0 if both else 0.0
    th = cp_lower(arm_only, m, conf)
    return (both + th * m) / (both + m - th * m)


def row_lower(documents: Mapping[str, Mapping[str, int]], conf: float = 0.9) -> float:
    """A row's bound (METHOD): the smaller of the document bootstrap and the exact paired bound over all
    questions, so clustering can only lower a bound, never raise it above the question-level exact one
    (with 2-4 documents the bootstrap alone is the more optimistic of the two)."""
    both = sum(int(d["both_right"]) for d in documents.values())
    base = sum(int(d["baseline_right"]) for d in documents.values())
    arm = sum(int(d["arm_right"]) for d in documents.values())
    return min(document_bootstrap_lower(documents, conf), paired_exact_lower(both, base - both, arm - both, conf))


def document_bootstrap_lower(documents: Mapping[str, Mapping[str, int]], conf: float = 0.9) -> float:
    """`documents`: per document {"n", "baseline_right", "arm_right"}; the one-sided `conf` lower bound
    of sum(arm_right) / sum(baseline_right) under resampling of documents. 0.0 with no baseline-right
    question at all."""
    base = [int(d["baseline_right"]) for d in documents.values()]
    arm = [int(d["arm_right"]) for d in documents.values()]
    if sum(base) == 0:
        return 0.0
    return bootstrap_ratio_lower(arm, base, conf)


def bootstrap_ratio_lower(num: Sequence[float], den: Sequence[float], conf: float = 0.9) -> float:
    """The clustered bootstrap itself: per document a numerator and a denominator; each draw resamples
    documents with replacement and takes sum(num) / sum(den) (0 where the drawn denominators sum to 0);
    the `1 - conf` quantile. A mean metric (evidence_metrics.py) passes per-document sums and counts."""
    import numpy as np  # here, not at import: the API validates posted rows and otherwise never loads numpy

    a0, b0 = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    k = len(b0)
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, k, size=(BOOTSTRAP_DRAWS, k))
    b, a = b0[picks].sum(axis=1), a0[picks].sum(axis=1)
    ratios = np.where(b > 0, a / np.maximum(b, 1e-300), 0.0)
    return float(np.quantile(ratios, 1.0 - conf, method="lower"))


__all__ = ["METHOD", "row_lower", "document_bootstrap_lower", "paired_exact_lower", "cp_lower", "binom_sf", "BOOTSTRAP_DRAWS",
           "bootstrap_ratio_lower"]
