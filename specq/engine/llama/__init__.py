"""llama.cpp itself: the checked bindings (`binding`: models, contexts, batches, KV cache, the
library probe), the hidden-state extension (`ext`), graph-tensor capture for scoring (`capture`),
cancel and deadline inside a call (`stop`) and batch-invariant numerics (`invariance`).

May import: specq.contracts and the engine's `options`. Every other part of the engine stands on this one.
"""
