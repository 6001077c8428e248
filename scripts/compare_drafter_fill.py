"""After a sparse prefill, how close is an MTP / EAGLE3 drafter's first draft distribution to the one it
has after a full prefill — fed the kept tokens at their original positions (`fill="kept"`) or
starting at the first decoded token (`fill="decoded"`)? KL(full ‖ sparse) per prompt, in nats.

Tiny random-weight models (synthetic_archs; the seeds the tests' search finds), half of each prompt's
tokens kept at random plus its last 20. Usage: python scripts/compare_drafter_fill.py [N_PROMPTS]
"""

from __future__ import annotations

import llama_cpp  # noqa: F401  (before numpy)

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specq.engine.decode.drafters_hidden import Eagle3Drafter, MtpDrafter, open_eagle3_context, open_mtp_context  # noqa: E402
from specq.engine.llama.binding import Context, Model  # noqa: E402
from specq.engine.llama.ext import set_hidden_output  # noqa: E402
from specq.engine.decode.prefill import sparse_prefill  # noqa: E402
from specq.engine.prompt.build import build_prompt  # noqa: E402
from specq.testing.synthetic_archs import write_arch_gguf  # noqa: E402


def rig(kind: str, root: Path):
    if kind == "mtp":
        target = Model(write_arch_gguf(root / "glm.gguf", "glm4moe", "tiny", seed=1, dtype="f32"), n_gpu_layers=0,
                       repack=False, load_mtp=True)
        ctx = Context(target, n_ctx=2048, n_threads=1, type_k="q8_0")
        set_hidden_output(ctx, True)
        dctx = open_mtp_context(ctx, n_threads=1)
        return target, ctx, dctx, lambda fill: MtpDrafter(dctx, fill=fill)
    target = Model(write_arch_gguf(root / "q3.gguf", "qwen3", "tiny", seed=0, dtype="f32"), n_gpu_layers=0, repack=False)
    ctx = Context(target, n_ctx=2048, n_threads=1, type_k="q8_0")
    head = Model(write_arch_gguf(root / "e3.gguf", "eagle3", "tiny", seed=0, dtype="f32"), n_gpu_layers=0)
    dctx, layers = open_eagle3_context(head, ctx, n_threads=1)
    return target, ctx, dctx, lambda fill: Eagle3Drafter(dctx, layers, target.n_embd, fill=fill)


def main() -> None:
    n_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    text = (ROOT / "examples" / "textwrap.py").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("mtp", "eagle3"):
            target, ctx, dctx, make = rig(kind, Path(tmp))

            def probs(prompt, kept, fill):
                d = make(fill)
                pre = sparse_prefill(ctx, prompt, kept, observe=d.observe)
                d.propose(prompt + [int(np.argmax(pre.logits))], 1)
                z = dctx.logits_row(-1).astype(np.float64)
                p = np.exp(z - z.max())
                return p / p.sum()

            def kl(p, q):
                return float(np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12))))

            rows = []
            for trial in range(n_prompts):
                prompt = build_prompt(target, text[trial * 700: trial * 700 + 900], "Explain.").tokens
                n = len(prompt)
                kept = sorted(set(np.random.default_rng(trial).choice(n, size=n // 2, replace=False).tolist())
                              | set(range(n - 20, n)))
                full = probs(prompt, list(range(n)), "kept")
                rows.append((kl(full, probs(prompt, kept, "kept")), kl(full, probs(prompt, kept, "decoded"))))
            print(f"{kind}: KL(full || sparse), nats, per prompt")
            print("  kept    " + " ".join(f"{a:6.3f}" for a, _ in rows))
            print("  decoded " + " ".join(f"{b:6.3f}" for _, b in rows))
            print(f"  kept closer on {sum(a < b for a, b in rows)} of {len(rows)}")
            dctx.close()
            ctx.close()


if __name__ == "__main__":
    main()
