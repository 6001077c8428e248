"""How a further question's scoring (a speculator-cache hit) grows with the document: one `specq bench
quality` family at length L on the CPU real pair, its first question scored cold (every window's head +
document slice prefilled and saved), the next ones warm (restored; only the question tail and the
lookahead run per window), each question's phases printed (ScoreResult.timings_ms).

    .venv/bin/python scripts/measure_warm_scoring.py 16000 3
    .venv/bin/python scripts/measure_warm_scoring.py 30000 3

A diagnostic (docs/history.md "Recall at 30K"): it prints no provenance object, so its numbers are not
benchmark rows; compare lengths from runs on one machine.
"""

import sys
import time

from specq.bench import quality as q
from specq.engine.options import EngineOptions, RunParams
from specq.engine.pipeline import Engine

L = int(sys.argv[1])
nq = int(sys.argv[2]) if len(sys.argv) > 2 else 3
eng = Engine(EngineOptions(n_threads=2, n_ctx=L + 1024, cache_bytes=2 << 30))
settings = q.QualitySettings(lengths=[L], n=nq, family=16, chunk_rule="border", scorers=["windowed"])
scorer, cache = eng.scorer(), eng.spec_cache()
print("n_parallel", scorer.n_parallel, "n_ctx", scorer.n_ctx, flush=True)
for i, (task, scope) in enumerate(q.tasks_for(settings, L, q._count(eng))):
    if i >= nq:
        break
    prompt, _ev, _pieces, _bounds = q.task_prompt(eng, task, RunParams(question=task.question, chunk=settings.chunk))
    use = cache.begin()
    t0 = time.perf_counter()
    res = scorer.score(prompt, scorer="windowed", lookahead=settings.lookahead, pool=settings.pool, cache=cache, scope=scope)
    dt = (time.perf_counter() - t0) * 1000
    print(task.id, "doc", len(prompt.document), "tail", len(prompt.tail), "windows", res.windows, "total_ms", round(dt),
          {k: round(v) for k, v in res.timings_ms.items()}, "restored", use.bytes_restored, flush=True)
