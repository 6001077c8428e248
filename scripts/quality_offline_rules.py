"""Candidate chunk rules ranked offline on saved recall scores: what would fix 8K's misses? (#18)

Two questions about the misses left under `border` (docs/history.md, "What the misses are not"):

1. Would `scope` keep its recall gain if only the strongest chunks' header lines rose? The opt-in `scope` rule (selection.rank_scores) met the 95% recall goal at 8K but the target
answered worse from its kept sets at 4K, and it swaps ~9 of the ~75 kept chunks of an 8K document.
A rule that lifts only the headers of the top share of chunks (by `border` rank) would swap fewer.
2. Do the windows' tails waste the budget? Each window's last chunks sit next to the question in the
   speculator's context and are kept far more often than the middle (the profile printed first), so
   `windowed` spends budget on W recency spots where one full pass has one. Two de-biased rankings
   within each window: the tail's excess over the window's median halved (`tail/2 mN`: last N chunks)
   or removed (`tail to median mN`), and each chunk's rank minus its neighbourhood's median (`minus
   local median hH`: 2H+1 chunks). And `per-window`: each window keeps its own share (the engine's
   select_kept_per_window), to see whether the budget split is what loses the evidence.

This ranks scores saved by `specq bench quality recall --scores-dir D` (no model, no scoring) and
prints each rule's recall at keep 0.2 / 0.3 / 0.5, the `raises` questions kept at 0.3, and how many
of `border`'s kept chunks (keep 0.3) it swaps out per task.

The document tokens' bytes are cut from the saved document at the saved token bounds (the bench's
`token_char_bounds`); on the 8K families this gives the journal's own `windowed-scope` rank for every
question (checked when this was written).

    .venv/bin/python scripts/quality_offline_rules.py /tmp/sc8 [--shares 0.02,0.05,0.1,0.15,0.2,0.3]
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specq.engine.scoring.blocks import header_pairs  # noqa: E402
from specq.engine.scoring.scorer import plan_windows  # noqa: E402
from specq.engine.scoring.selection import HEADER_WEIGHT, rank_scores, window_budget  # noqa: E402

KEEPS = (0.2, 0.3, 0.5)


def pieces_of(document: str, bounds: np.ndarray) -> list[bytes]:
    """Each token's text (bounds: where each token starts, and the end: n + 1 offsets)."""
    return [document[a:b].encode() for a, b in zip(bounds[:-1], bounds[1:])]


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


def window_chunks(n_doc: int, windows: int, chunk: int) -> list[tuple[int, int]]:
    """The chunk range each scoring window covers (scoring.plan_windows' equal slices; a chunk cut by
    a window border counts in both)."""
    return [(a // chunk, -(-b // chunk)) for a, b in plan_windows(n_doc, -(-n_doc // windows))]


def local_median(x: np.ndarray, h: int) -> np.ndarray:
    pad = np.pad(x, h, mode="edge")
    return np.median(np.lib.stride_tricks.sliding_window_view(pad, 2 * h + 1), axis=1)


def per_window(ranks: np.ndarray, wins: list[tuple[int, int]], fn) -> np.ndarray:
    out = ranks.copy()
    for a, b in wins:
        out[a:b] = fn(ranks[a:b])
    return out


def shrink_tail(x: np.ndarray, m: int, factor: float) -> np.ndarray:
    """The last m chunks' excess over the window's median times `factor` (never raised)."""
    out, med = x.copy(), float(np.median(x))
    out[-m:] = np.minimum(out[-m:], med + factor * (out[-m:] - med))
    return out


def per_window_place(ranks: np.ndarray, wins: list[tuple[int, int]], ev: list[int], keep: float) -> bool:
    """Whether every evidence chunk is kept when each window keeps window_budget(its chunks, keep) of
    its own chunks by `border` rank (chunks are the document's grid here; the engine cuts each window
    from its own start, which moves the grid by < 1 chunk)."""
    kept: set[int] = set()
    for a, b in wins:
        order = np.argsort(-ranks[a:b], kind="stable")[: window_budget(b - a, keep)]
        kept.update(int(c) + a for c in order)
    return all(c in kept for c in ev)


PROFILE = 16  #: chunks from each window's end and start in the kept-share profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="directories of saved windowed scores (--scores-dir)")
    ap.add_argument("--shares", default="0.02,0.05,0.1,0.15,0.2,0.3")
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    for d in args.dirs:
        files = sorted(glob.glob(f"{d}/*-windowed.npz"))
        tails, heads = (0, 4, 8, 16), (4, 8, 16)
        names = (["border", "scope"] + [f"scope top {s:g}" for s in shares] + [f"tail/2 m{m}" for m in tails[1:]]
                 + [f"tail to median m{m}" for m in tails[1:]] + [f"minus local median h{h}" for h in heads])
        pw = dict.fromkeys(KEEPS, 0)
        kept = {n: dict.fromkeys(KEEPS, 0) for n in names}
        raises = dict.fromkeys(names, 0)
        swapped = dict.fromkeys(names, 0)
        end, start, middle, middle_n, n_windows, n_raises = np.zeros(PROFILE), np.zeros(PROFILE), 0.0, 0, 0, 0
        for f in files:
            with np.load(f) as z:
                scores, chunk = z["scores"].astype(np.float32), int(z["chunk"])
                ev = [int(c) for c in z["evidence_chunks"]]
                kind, n_win = str(z["kind"]), int(z["windows"])
                pieces = pieces_of(str(z["document"]), z["bounds"])
            border = rank_scores(scores, chunk, "border")
            pairs = header_pairs(pieces, chunk)
            n = border.shape[0]
            base_order = np.argsort(-border, kind="stable")[: window_budget(n, 0.3)]
            base = set(base_order.tolist())
            wins = window_chunks(scores.shape[0], n_win, chunk)
            is_kept = np.zeros(n, dtype=bool)
            is_kept[base_order] = True
            for a, b in wins:
                seg = is_kept[a:b]
                if seg.shape[0] >= 2 * PROFILE:
                    end += seg[::-1][:PROFILE]
                    start += seg[:PROFILE]
                    middle += float(seg[PROFILE:-PROFILE].sum())
                    middle_n += seg.shape[0] - 2 * PROFILE
                    n_windows += 1
            n_raises += kind == "raises"
            ranked = {"border": border, "scope": rank_scores(scores, chunk, "scope", pairs)}
            ranked.update({f"scope top {s:g}": lift_top_share(border, pairs, s) for s in shares})
            ranked.update({f"tail/2 m{m}": per_window(border, wins, lambda x, m=m: shrink_tail(x, m, 0.5)) for m in tails[1:]})
            ranked.update({f"tail to median m{m}": per_window(border, wins, lambda x, m=m: shrink_tail(x, m, 0.0))
                           for m in tails[1:]})
            for k in KEEPS:
                pw[k] += per_window_place(border, wins, ev, k)
            ranked.update({f"minus local median h{h}": per_window(border, wins, lambda x, h=h: x - local_median(x, h))
                           for h in heads})
            for name, r in ranked.items():
                order = np.argsort(-r, kind="stable")
                place = np.empty_like(order)
                place[order] = np.arange(n)
                need = max(int(place[c]) for c in ev) + 1
                for k in KEEPS:
                    kept[name][k] += need <= window_budget(n, k)
                raises[name] += kind == "raises" and need <= window_budget(n, 0.3)
                swapped[name] += len(base - set(order[: window_budget(n, 0.3)].tolist()))
        print(f"{d}: {len(files)} tasks, {n_windows} windows of at least {2 * PROFILE} chunks")
        print("share kept under border at keep 0.3, by chunk from each window's end:",
              " ".join(f"{x / max(n_windows, 1):.2f}" for x in end))
        print("                                       from each window's start:",
              " ".join(f"{x / max(n_windows, 1):.2f}" for x in start))
        print(f"                                       between them: {middle / max(middle_n, 1):.3f}")
        print("| rule | " + " | ".join(f"recall keep {k}" for k in KEEPS)
              + " | raises kept (0.3) | border's kept chunks swapped out (keep 0.3, per task) |")
        print("|---|" + "---:|" * (len(KEEPS) + 2))
        for name in names:
            cells = " | ".join(f"{kept[name][k] / len(files):.3f}" for k in KEEPS)
            print(f"| {name} | {cells} | {raises[name]}/{n_raises} | {swapped[name] / len(files):.2f} |")
        print("| border, per-window budget | " + " | ".join(f"{pw[k] / len(files):.3f}" for k in KEEPS) + " | | |")


if __name__ == "__main__":
    main()
