#!/usr/bin/env python
"""Where a cached follow-up's engine time goes (issue 50 item 1), on this CPU, at the engine's level.

A random-weight model whose compute is small (the `tiny` shape with the real Qwen2 vocabulary, so
tokenizing a document costs what it costs the 7B) in the serving loop as production runs it on the
GPU (bench/gpu/serve.sh per-doc: 8 slots, mode auto, stored documents, SPECQ_SPEC_CACHE_SAVE=repeat, a
prompt cache). Per length: `--beside` other documents' jobs decode beside (their slots busy, as under
per-doc arrival), one document's first question is prefilled, then its follow-ups are sent one after
another (each when the last ended). Each follow-up's `ft_*` timings (engine/serving/loop.py module doc:
the parts of its time to first token) are recorded; the report has each part's p50 per length.

    .venv/bin/python scripts/measure_followup_engine.py --vocab /path/ggml-vocab-qwen2.gguf \\
        --lengths 8192,32768 --followups 8 --json /tmp/after.json

`--label` names the run (e.g. before/after); `--merge A.json B.json --json OUT [--note TEXT]` writes one
result file holding the runs and each label's p50s over all its follow-ups (bench/results/...). A tree
exported with `git archive` has no git metadata: say its commit in --note.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARTS = ("ft_tokenize", "ft_admit", "ft_pick", "ft_decide", "ft_setup", "ft_between", "ft_fill", "ft_sample")


#: the smallest model llama.cpp runs: one layer, one 64-dim head. A CPU's attention over a long context
#: is real compute (the `tiny` shape, 4 layers x 4 heads, took ~0.4 s to prefill a 19-token question at
#: 8K tokens on the 2-core CPU), which would hide the host's own overheads this script is after
SHAPE = dict(n_layer=1, n_embd=64, n_head=1, n_head_kv=1, n_ff=128)


def _models(root: Path, vocab: str, n_ctx: int):
    from specq.testing.synthetic import write_qwen2_gguf

    return (write_qwen2_gguf(root / "target.gguf", "tiny", vocab=vocab, seed=0, n_ctx=n_ctx, **SHAPE),
            write_qwen2_gguf(root / "speculator.gguf", "tiny", vocab=vocab, seed=1, n_ctx=n_ctx, **SHAPE))


def _p50(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def run(args) -> dict:
    import llama_cpp  # noqa: F401  (before numpy)

    from specq.bench.provenance import Start, provenance
    from specq.bench.serve import make_document, question_text
    from specq.engine.options import EngineOptions, RunParams
    from specq.engine.pipeline import Engine
    from specq.engine.serving.loop import ServingEngine

    start = Start()
    lengths = [int(x) for x in args.lengths.split(",")]
    n_ctx = max(lengths) + max(lengths) // 32
    root = Path(tempfile.mkdtemp(prefix="followup-engine-"))
    target, speculator = _models(root, args.vocab, n_ctx)
    eng = Engine(EngineOptions(target=str(target), speculator=str(speculator), n_gpu_layers=0, n_ctx=n_ctx,
                               slots=args.slots, n_threads=args.threads, cache_bytes=args.cache_bytes,
                               spec_cache_save="repeat"))
    loop = ServingEngine(eng).start()
    out: dict = {"label": args.label, "lengths": {}}
    try:
        for L in lengths:
            doc_tokens = L - L // 16
            beside = [loop.submit(make_document(100 + b, doc_tokens // 8, args.chars_per_token),
                                  RunParams(question=question_text(100 + b, 0), mode="auto", max_tokens=n_ctx // 2,
                                            ignore_eos=True), reused_document=True) for b in range(args.beside)]
            doc = make_document(L, doc_tokens, args.chars_per_token)
            first = loop.submit(doc, RunParams(question=question_text(0, 0), mode="auto", max_tokens=args.max_tokens,
                                               ignore_eos=True), reused_document=True).result(3600)
            rows = []
            for q in range(1, args.followups + 1):
                r = loop.submit(doc, RunParams(question=question_text(0, q), mode="auto", max_tokens=args.max_tokens,
                                               ignore_eos=True), reused_document=True).result(600)
                t = r.timings_ms
                rows.append({"question": q, "prompt_tokens": r.usage.prompt_tokens, "mode": r.spec.mode,
                             "target_cache": r.spec.cache.get("target"), "ttft": round(t["ttft"], 3),
                             **{k: t.get(k) for k in PARTS}, "tokens": r.tokens})
            for h in beside:
                h.cancel()
            for h in beside:
                try:
                    h.result(600)
                except Exception:
                    pass
            out["lengths"][str(L)] = {
                "prompt_tokens": first.usage.prompt_tokens, "first_question_ttft_ms": round(first.timings_ms["ttft"], 1),
                "followups": len(rows), "p50_ms": {k: _p50([r.get(k) for r in rows]) for k in ("ttft", *PARTS)},
                "rows": rows}
            print(L, json.dumps(out["lengths"][str(L)]["p50_ms"]), flush=True)
        out["loop"] = loop.stats()
    finally:
        loop.close()
        out["provenance"] = provenance(eng, start=start)
        eng.close()
    out["settings"] = {"slots": args.slots, "threads": args.threads, "cache_bytes": args.cache_bytes,
                       "beside": args.beside, "max_tokens": args.max_tokens, "model": {"shape": SHAPE, "weights": "random",
                       "vocab": "Qwen2 (llama.cpp's ggml-vocab-qwen2.gguf)"}, "spec_cache_save": "repeat", "mode": "auto",
                       "reused_document": True, "chars_per_token": args.chars_per_token}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", default="bytes", help="a GGUF with the Qwen2 vocabulary (llama.cpp's ggml-vocab-qwen2.gguf)")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--followups", type=int, default=8)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beside", type=int, default=2, help="other documents' jobs decoding beside the follow-ups")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--cache-bytes", type=int, default=2 << 30)
    ap.add_argument("--chars-per-token", type=float, default=2.6)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--merge", nargs="*", default=None, help="runs' JSON files to merge into --json")
    ap.add_argument("--note", default="", help="with --merge: what the runs' code trees were (e.g. a git archive's commit)")
    args = ap.parse_args()
    if args.merge:
        runs = [json.loads(Path(p).read_text()) for p in args.merge]
        pooled: dict = {}
        for r in runs:  # per label and length: each part's p50 over all the label's follow-ups
            for L, v in r["lengths"].items():
                rows = pooled.setdefault(r["label"], {}).setdefault(L, [])
                rows += v["rows"]
        summary = {label: {L: {"followups": len(rows), "p50_ms": {k: _p50([x.get(k) for x in rows]) for k in ("ttft", *PARTS)},
                                "outside_fill_p50_ms": _p50([x["ttft"] - x["ft_fill"] for x in rows])}
                           for L, rows in by_len.items()} for label, by_len in pooled.items()}
        report = {"what": "cached follow-up: where its engine time to first token goes (issue 50 item 1)",
                  "script": "scripts/measure_followup_engine.py", "command": " ".join(sys.argv),
                  "note": args.note, "summary": summary, "runs": runs}
    else:
        report = run(args)
    text = json.dumps(report, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
