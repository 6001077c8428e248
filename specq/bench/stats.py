"""Percentiles of the benchmarks' per-job timings (one definition for every report)."""

from __future__ import annotations


def percentile(xs: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of xs, linearly interpolated between order statistics; None for no values."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 3)


__all__ = ["percentile"]
