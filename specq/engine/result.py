"""The run result object: one JSON shape used by the CLI, the API, the store and batch results.

Documented field by field in docs/result.md. `timings_ms` keys are phase names; the store keeps them
as rows (job_id, phase, ms), so a new phase needs no migration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..contracts import CORE_PHASES, SCORE_PHASES  # noqa: F401  (re-exported: the result's phase names)


@dataclass
class Usage:
    prompt_tokens: int = 0
    kept_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class SpecInfo:
    mode: str = "baseline"  # the mode that actually ran (specprefill may fall back to baseline)
    #: why that mode ran (mode auto's decision, a fallback, or "asked for")
    reason: str = ""
    positions: str = "original"  # the position mode that actually ran
    keep: float = 1.0
    #: specprefill runs: where `keep` came from: job (the job set it), certified (the job set none and mode auto
    #: ran the keep `specq calibrate` certified for its band: the reason names the row), default (none set and
    #: none certified: options.DEFAULT_KEEP); "" where nothing was selected
    keep_source: str = ""
    lookahead: int = 0
    windows: int = 0
    scorer: str = "none"
    #: the engine's caches on this run: {"speculator": {"hits", "misses", "bytes_restored", …} or
    #: "off", "target": {"hit", "reused_tokens", "bytes_restored", …} or "off", "bytes_restored": total}
    cache: dict = field(default_factory=dict)
    #: how the keep budget was spent: global (over the whole document) or per-window (per scoring window)
    selection: str = "global"
    #: how chunks were ranked (RunParams.chunk_rule); "" where no selection ran
    chunk_rule: str = ""
    #: the target prefilled each window's chunks as the window was scored (RunParams.pipelined)
    pipelined: bool = False


@dataclass
class EngineInfo:
    n_gpu_layers: int = 0
    flash_attn: bool = True
    n_batch: int = 0
    n_ubatch: int = 0
    #: most tokens per prefill llama_decode call (EngineOptions.call_tokens, resolved)
    call_tokens: int = 0
    backend: str = "cpu"
    target: str = ""
    speculator: str = ""
    #: the target ran in batch-invariant mode (EngineOptions.batch_invariant): greedy output is the
    #: same with every drafter
    batch_invariant: bool = False
    #: the target's weights were repacked for the CPU; its K cache's element type
    repack: bool = True
    type_k: str = "f16"
    #: where the scoring math ran: numpy (host) or torch (the speculator's device); "" = not scored
    score_math: str = ""
    #: who ran the speculator's scoring windows: llama (llama.cpp) or torch (scoring/torch_speculator.py); "" = not scored
    speculator_impl: str = ""
    #: the target's MTP block is loaded (`--draft mtp` possible; its hidden states are output on every
    #: run, drafting or not, so every run shares the same numerics)
    mtp: bool = False
    #: the EAGLE3 head's file, once loaded
    drafter: str = ""
    #: ggml's CUDA graphs were on for this process's decodes (EngineOptions.cuda_graphs; CUDA only)
    cuda_graphs: bool = False


@dataclass
class DraftInfo:
    method: str = "none"
    drafted: int = 0
    accepted: int = 0
    accept_rate: float = 0.0
    mean_accepted_len: float = 0.0
    verify_batches: int = 0


@dataclass
class RunResult:
    text: str = ""
    finish_reason: str = "stop"  # stop | length
    usage: Usage = field(default_factory=Usage)
    timings_ms: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in CORE_PHASES})
    spec: SpecInfo = field(default_factory=SpecInfo)
    engine: EngineInfo = field(default_factory=EngineInfo)
    draft: DraftInfo = field(default_factory=DraftInfo)
    #: things the user should know (a fallback that ran instead of what was asked, …)
    warnings: list[str] = field(default_factory=list)
    #: generated token ids (not part of the JSON object; tests and benchmarks compare them)
    tokens: list[int] = field(default_factory=list, repr=False)
    #: kept prompt indices (not part of the JSON object)
    kept_indices: list[int] = field(default_factory=list, repr=False)
    #: specprefill runs: the kept spans and chunk scores in character offsets (kept_spans.py); a key of
    #: the JSON object only when set
    selection: dict[str, Any] | None = field(default=None, repr=False)
    #: a question answered as one of a group (engine/group_sparse.py): group size, this question's index,
    #: the union's and its own kept fractions, the shared phases and the group's wall time; a key of the
    #: JSON object only when set
    group: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("tokens")
        d.pop("kept_indices")
        if d["selection"] is None:
            d.pop("selection")
        if d["group"] is None:
            d.pop("group")
        d["timings_ms"] = {k: round(float(v), 3) for k, v in self.timings_ms.items()}
        return d

    @property
    def kept_ratio(self) -> float:
        return self.usage.kept_tokens / self.usage.prompt_tokens if self.usage.prompt_tokens else 0.0
