"""What every benchmark JSON records about the code, the library, the settings and the machine that
produced it (`provenance(...)` → the report's `provenance` key).

* `code`: `git describe --always --dirty --abbrev=12` of the checkout the package runs from, the full
  commit, whether the code is dirty, and when it is, a SHA-256 of `git diff HEAD --binary` plus the
  names and contents of untracked files, bench/results/* left out of both (so a number measured on
  uncommitted code can still be told apart from one measured on the commit, and writing a report
  does not change the code's identity);
* `library`: the llama-cpp-python version (ours is `…+specq.<patch hash>`) and the patch probe: what
  the loaded library actually does (forward position jumps: patch 0001; the per-context eval-callback
  setter: patch 0002; the hidden-state API of llama_ext) — a stock wheel shows False;
* `numerics`: every setting that changes the numbers, of the target and of the speculator: weight
  repacking, flash attention, K/V cache types, batch-invariant mode, n_batch/n_ubatch, threads,
  n_ctx, backend, n_gpu_layers; the speculator's as its scoring context was (or would be) built;
* `positions` actually used and `warnings` the runs returned (deduplicated, in order);
* `host`: CPU model, cores, load average before and after (1/5/15 min), memory, GPU, the command line,
  and the time in UTC.

A report without a `provenance` key (docs/benchmarks.md marks those rows) cannot be reproduced.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

#: the checkout the package runs from (its git metadata, if it is one)
REPO = Path(__file__).resolve().parents[2]


#: left out of the code's identity: what benchmarks write (a report written by one run must not change
#: the hash of the code that the next run reports)
RESULTS = "bench/results"


def _git(*args: str, repo: Path | None = None) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, timeout=20, cwd=repo or REPO)
    except (OSError, subprocess.SubprocessError):
        return None


def code_state(repo: Path | None = None) -> dict[str, Any]:
    """git describe --dirty, the commit, dirty or not, and when dirty a hash of what differs from the
    commit: `git diff HEAD --binary` and the names *and contents* of untracked files, both without
    bench/results/* (RESULTS). `dirty` is about the code: a tree whose only changes are results is clean."""
    repo = repo or REPO
    desc = _git("describe", "--always", "--dirty", "--abbrev=12", repo=repo)
    if desc is None or desc.returncode != 0:
        return {"describe": "unknown (not a git checkout)", "commit": None, "dirty": None, "diff_sha256": None}
    describe = desc.stdout.decode().strip()
    head = _git("rev-parse", "HEAD", repo=repo)
    out: dict[str, Any] = {"describe": describe,
                           "commit": head.stdout.decode().strip() if head and head.returncode == 0 else None}
    outside_results = ("--", ".", f":(exclude){RESULTS}")
    diff = _git("diff", "HEAD", "--binary", *outside_results, repo=repo)
    diff_bytes = diff.stdout if diff is not None and diff.returncode == 0 else b""
    # -z: names as they are (without it git quotes non-ASCII names, and such a file's contents were lost)
    untracked = _git("ls-files", "--others", "--exclude-standard", "-z", *outside_results, repo=repo)
    names = sorted(n for n in untracked.stdout.decode("utf-8", "surrogateescape").split("\0") if n) \
        if untracked is not None and untracked.returncode == 0 else []
    dirty = bool(diff_bytes) or bool(names)
    out["dirty"] = dirty
    if dirty:
        h = hashlib.sha256(diff_bytes)
        for name in names:  # untracked files are part of what ran: their names and their contents
            h.update(b"\0untracked\0" + os.fsencode(name) + b"\0")
            try:
                h.update((repo / name).read_bytes())
            except OSError as e:  # unreadable: say so in the hash rather than hash the name alone
                h.update(f"\0unreadable: {type(e).__name__}\0".encode())
        out["diff_sha256"] = h.hexdigest()
        out["diff_bytes"] = len(diff_bytes)
        out["untracked"] = names[:50]
    else:
        out["diff_sha256"] = None
    return out


def library_state(engine: Any = None) -> dict[str, Any]:
    """The llama-cpp-python version and what the loaded library does (the patch probe)."""
    import llama_cpp

    from ..engine.llama import binding as L
    from ..engine.llama import ext as llama_ext

    probe: dict[str, Any] = {
        "eval_callback_setter (patch 0002)": L.can_toggle_eval_callback(),
        "hidden_state_api": getattr(llama_ext, "_SET_NEXTN", None) is not None,
    }
    if engine is not None:
        probe["position_gaps (patch 0001)"] = bool(getattr(engine, "gaps_supported", False))
    extra = getattr(engine, "library_probe", None)  # e.g. the capture layout probe, where the engine has one
    if callable(extra):
        try:
            probe.update(extra())
        except Exception as e:  # recorded, not raised: the report says what failed
            probe["probe_error"] = f"{type(e).__name__}: {e}"
    return {"llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"), "backend": L.backend_name(),
            "probe": probe}


def _ctx_numerics(ctx: Any) -> dict[str, Any]:
    return {k: getattr(ctx, k) for k in ("n_ctx", "n_batch", "n_ubatch", "n_threads", "flash_attn", "type_k",
                                          "type_v", "n_seq_max") if hasattr(ctx, k)}


def numerics_of(model: Any, ctx: Any) -> dict[str, Any]:
    """The numerics of one model and one context of it (benchmarks below the engine)."""
    return {"model": model.path.name, "repack": bool(getattr(model, "repack", True)),
            "n_gpu_layers": getattr(model, "n_gpu_layers", None), **_ctx_numerics(ctx)}


def numerics(engine: Any) -> dict[str, Any]:
    """Every numerics setting of the target and of the speculator (module doc)."""
    if engine is None:
        return {}
    opts = engine.options
    num = engine.numerics
    target = {
        "model": engine.target_path.name,
        "batch_invariant": num.batch_invariant,
        "repack": num.repack,
        "flash_attn": num.flash_attn,
        "type_k": num.type_k,
        "max_draft": num.max_draft,
        "n_gpu_layers": engine.target.n_gpu_layers,
        # process-wide (llama.set_cuda_graphs): the speculator's decodes run under the same setting
        "cuda_graphs": engine.info.cuda_graphs,
        **_ctx_numerics(engine.ctx),
    }
    target.setdefault("n_threads", opts.resolved_threads())
    spec_model = getattr(engine, "_speculator", None)
    scorer = getattr(engine, "_scorer", None)
    speculator: dict[str, Any] = {
        "model": spec_model.path.name if spec_model is not None else str(opts.speculator),
        "loaded": spec_model is not None,
        # the speculator is loaded without batch-invariant settings: llama.cpp's defaults
        "batch_invariant": False,
        "repack": bool(getattr(spec_model, "repack", True)),
        "n_gpu_layers": getattr(spec_model, "n_gpu_layers", opts.n_gpu_layers),
        "cuda_graphs": engine.info.cuda_graphs,
    }
    if scorer is not None:
        speculator.update(_ctx_numerics(scorer.ctx))
        speculator["n_parallel"] = scorer.n_parallel
        speculator["score_math"] = scorer.score_math
    else:  # as Engine.scorer() would build it
        speculator.update({"flash_attn": opts.flash_attn, "type_k": "f16", "type_v": "f16", "n_batch": opts.n_batch,
                           "n_ubatch": engine.n_ubatch, "n_threads": opts.resolved_threads()})
    return {"target": target, "speculator": speculator}


def host(load_before: tuple[float, float, float] | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"machine": platform.machine(), "cpu": platform.processor() or "",
                            "cores": os.cpu_count(), "python": platform.python_version(), "node": platform.node()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["mem_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        info["affinity_cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if gpu.returncode == 0 and gpu.stdout.strip():
            lines = gpu.stdout.strip().splitlines()
            info["gpu"], info["gpu_count"] = lines[0], len(lines)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        now = os.getloadavg()
        if load_before is not None:
            info["loadavg_before"] = [round(x, 2) for x in load_before]
        info["loadavg_after"] = [round(x, 2) for x in now]
    except OSError:
        pass
    try:
        info["nice"] = os.nice(0)
    except OSError:
        pass
    return info


def load_now() -> tuple[float, float, float] | None:
    """The load average now (call before a benchmark; `provenance` records it as `loadavg_before`)."""
    try:
        return os.getloadavg()
    except OSError:
        return None


class Start:
    """What a benchmark notes when it starts: the load average and the code (the tree may change while
    a long run goes on; the report must name the code that was loaded)."""

    def __init__(self) -> None:
        self.load = load_now()
        self.code = code_state()


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(str(x) for x in items))


def provenance(engine: Any = None, *, positions: Iterable[str] = (), warnings: Iterable[str] = (),
               start: Start | None = None, numerics_by_mode: dict[str, Any] | None = None,
               **extra: Any) -> dict[str, Any]:
    """The `provenance` object of a benchmark report (module doc). `start`: noted when the benchmark
    started (its code state and load average; without it, both are taken now). `numerics_by_mode`: for
    a report that ran several engines (batch-invariant on and off), each one's `numerics(engine)`."""
    load_before = start.load if start is not None else None
    out: dict[str, Any] = {
        "code": start.code if start is not None else code_state(),
        "library": library_state(engine),
        "numerics": numerics_by_mode if numerics_by_mode is not None else numerics(engine),
        "positions": _unique(positions),
        "warnings": _unique(warnings),
        "host": host(load_before),
        "argv": list(sys.argv),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out.update(extra)
    return out


__all__ = ["Start", "provenance", "code_state", "library_state", "numerics", "numerics_of", "host", "load_now"]
