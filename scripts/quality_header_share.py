"""Would `scope` keep its recall gain if only the strongest chunks' header lines rose? (#18, offline)

Why: the opt-in `scope` rule (selection.rank_scores) met the 95% recall goal at 8K but the target
answered worse from its kept sets at 4K, and it swaps ~9 of the ~75 kept chunks of an 8K document.
A rule that lifts only the headers of the top share of chunks (by `border` rank) would swap fewer.
This ranks scores saved by `specq bench quality recall --scores-dir D` (no model, no scoring) under
`border`, `scope` and `scope` restricted to sources in the top share T, and prints each one's recall
at keep 0.2 / 0.3 / 0.5 and how many of `border`'s kept chunks (keep 0.3) it swaps out per task.

The document tokens' bytes are cut from the saved document at the saved token bounds (the bench's
`token_char_bounds`); on the 8K families this gives the journal's own `windowed-scope` rank for every
question (checked when this was written).

    .venv/bin/python scripts/quality_header_share.py /tmp/sc8 [--shares 0.02,0.05,0.1,0.15,0.2,0.3]
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specq.engine.blocks import header_pairs  # noqa: E402
from specq.engine.selection import HEADER_WEIGHT, rank_scores, window_budget  # noqa: E402

KEEPS = (0.2, 0.3, 0.5)


def pieces_of(document: str, bounds: np.ndarray) -> list[bytes]:
    ends = list(bounds[1:]) + [len(document)]
    return [document[a:b].encode() for a, b in zip(bounds, ends)]


def lift_top_share(ranks: np.ndarray, pairs: np.ndarray, share: float) -> np.ndarray:
    """`scope`, but only chunks among the top ceil(share × n) by `border` rank lift their headers."""
    out = ranks.copy()
    if not pairs.size:
        return out
    k = max(1, math.ceil(share * ranks.shape[0]))
    cut = np.sort(ranks)[::-1][k - 1]
    sel = ranks[pairs[:, 0]] >= cut
    np.maximum.at(out, pairs[sel, 1], HEADER_WEIGHT * ranks[pairs[sel, 0]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="directories of saved windowed scores (--scores-dir)")
    ap.add_argument("--shares", default="0.02,0.05,0.1,0.15,0.2,0.3")
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    for d in args.dirs:
        files = sorted(glob.glob(f"{d}/*-windowed.npz"))
        names = ["border", "scope"] + [f"scope top {s:g}" for s in shares]
        kept = {n: dict.fromkeys(KEEPS, 0) for n in names}
        swapped = dict.fromkeys(names, 0)
        for f in files:
            with np.load(f) as z:
                scores, chunk = z["scores"].astype(np.float32), int(z["chunk"])
                ev = [int(c) for c in z["evidence_chunks"]]
                pieces = pieces_of(str(z["document"]), z["bounds"])
            border = rank_scores(scores, chunk, "border")
            pairs = header_pairs(pieces, chunk)
            n = border.shape[0]
            base = set(np.argsort(-border, kind="stable")[: window_budget(n, 0.3)].tolist())
            ranked = {"border": border, "scope": rank_scores(scores, chunk, "scope", pairs)}
            ranked.update({f"scope top {s:g}": lift_top_share(border, pairs, s) for s in shares})
            for name, r in ranked.items():
                order = np.argsort(-r, kind="stable")
                place = np.empty_like(order)
                place[order] = np.arange(n)
                need = max(int(place[c]) for c in ev) + 1
                for k in KEEPS:
                    kept[name][k] += need <= window_budget(n, k)
                swapped[name] += len(base - set(order[: window_budget(n, 0.3)].tolist()))
        print(f"{d}: {len(files)} tasks")
        print("| rule | " + " | ".join(f"recall keep {k}" for k in KEEPS) + " | border's kept chunks swapped out (keep 0.3, per task) |")
        print("|---|" + "---:|" * (len(KEEPS) + 1))
        for name in names:
            cells = " | ".join(f"{kept[name][k] / len(files):.3f}" for k in KEEPS)
            print(f"| {name} | {cells} | {swapped[name] / len(files):.2f} |")


if __name__ == "__main__":
    main()
