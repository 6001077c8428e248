#!/usr/bin/env python
"""Client TTFT and where it goes, of one code tree against another, side by side on this machine.

For each round, each stack (`embedded`: `specq up` on SQLite + the embedded broker; `redis_pg`: `specq
api` + `specq worker` on the local Redis and a throwaway PostgreSQL database) and each code tree
(`NAME=PATH`, e.g. the commit before a change, `git archive`d into a folder, and this checkout), it starts
the service from that tree on tiny random-weight models (CPU, written here), runs `specq bench serve`'s
driver (this checkout's client: the same client for every tree) with arrival per-doc, then t0
(`--arrivals`), and stops it. The trees alternate inside each round, so a load that changes over the run touches both.

    git archive 9cba8d2 | tar -x -C /tmp/before
    .venv/bin/python scripts/measure_followup_latency.py --tree before=/tmp/before --tree after=. \\
        --rounds 2 --json bench/results/cpu-followup-latency-2026-12-06.json

The report holds each run's summary (client TTFT p50/p95, jobs/min and, where the server stamps its
jobs, `breakdown_ms`), the load average before it, the command and the commit of this checkout, and
`pooled`: per stack, tree and arrival over all rounds, outside-the-engine time and each gap's p50/p90.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from specq.bench.stats import percentile  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _models(root: Path):
    from specq.testing.synthetic import write_qwen2_gguf

    return (write_qwen2_gguf(root / "target.gguf", "tiny", seed=0, n_layer=4),
            write_qwen2_gguf(root / "speculator.gguf", "tiny", seed=0, n_layer=2))


@contextlib.contextmanager
def _service(tree: Path, stack: str, models, home: Path, port: int):
    """The service from `tree` (its specq first on the path), ready (a worker's heartbeat), then stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(PYTHONPATH=str(tree), SPECQ_HOME=str(home), SPECQ_TARGET=str(models[0]),
               SPECQ_SPECULATOR=str(models[1]), SPECQ_N_GPU_LAYERS="0", SPECQ_N_CTX="4096", SPECQ_THREADS="2",
               SPECQ_API_PORT=str(port), SPECQ_CACHE_BYTES="0", PYTHONUNBUFFERED="1")
    with contextlib.ExitStack() as stack_:
        if stack == "redis_pg":
            from service_helpers import REDIS_URL, pg_database

            url = stack_.enter_context(pg_database())
            env.update(SPECQ_DATABASE_URL=url, SPECQ_BROKER_URL=REDIS_URL, SPECQ_QUEUE=f"followup-{port}")
            services = [["api"], ["worker"]]
        else:
            services = [["up"]]
        run = lambda *a: subprocess.run([sys.executable, "-m", "specq", *a], env=env, cwd=tree, check=True,  # noqa: E731
                                        capture_output=True)
        run("db", "upgrade")
        procs = []
        try:
            for args in services:
                log = open(home / f"{args[0]}.log", "wb")
                procs.append(subprocess.Popen([sys.executable, "-m", "specq", *args], env=env, cwd=tree, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            deadline = time.monotonic() + 180
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).json().get("workers_ready", 0) >= 1:
                        break
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"{stack} from {tree} did not get ready: see {home}")
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}"
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, 15)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
                    p.wait()


#: the gaps pooled over a (stack, tree, arrival)'s runs: (name, from, to); "sent" and "client_first_text" are
#: the client's clocks, the rest the server's trace (specq.storage.trace)
POOLED_GAPS = (("send_to_accept", "sent", "accepted"), ("accept_to_stored", "accepted", "stored"),
               ("stored_to_queued", "stored", "queued"), ("stored_to_claimed", "stored", "claimed"),
               ("claimed_to_engine_start", "claimed", "engine_start"),
               ("engine_start_to_first_token", "engine_start", "first_token"),
               ("first_token_to_first_text", "first_token", "first_text"),
               ("first_text_to_client", "first_text", "client_first_text"))


def pooled(runs: list[dict]) -> list[dict]:
    """Per stack, tree and arrival, over all rounds' jobs: outside-the-engine time (client TTFT less the
    engine's) and each gap of POOLED_GAPS, p50/p90 in ms, with the load averages before its runs."""
    out = []
    for key in dict.fromkeys((r["stack"], r["tree"], r["arrival"]) for r in runs):
        rs = [r for r in runs if (r["stack"], r["tree"], r["arrival"]) == key]
        jobs = [j for r in rs for j in r["jobs"]]
        over = [j["ttft_ms"] - j["engine"]["ttft"] for j in jobs if j["ttft_ms"] is not None and "ttft" in j["engine"]]
        row = {"stack": key[0], "tree": key[1], "arrival": key[2], "rounds": len(rs), "jobs": len(jobs),
               "load_1min_before": [r["load_before"][0] for r in rs],
               "outside_engine_ms": {"p50": percentile(over, 0.5), "p90": percentile(over, 0.9), "n": len(over)},
               "gaps_ms": {}}
        for name, a, b in POOLED_GAPS:
            ms = []
            for j in jobs:
                t = {**(j["trace"] or {}), "sent": j["sent_unix"], "client_first_text": j["first_unix"]}
                if t.get(a) is not None and t.get(b) is not None:
                    ms.append((t[b] - t[a]) * 1000.0)
            if ms:
                row["gaps_ms"][name] = {"p50": percentile(ms, 0.5), "p90": percentile(ms, 0.9), "n": len(ms)}
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a code tree to serve from")
    ap.add_argument("--stacks", nargs="+", default=["embedded", "redis_pg"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--doc-tokens", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--arrivals", nargs="+", default=["per-doc", "t0"], choices=["per-doc", "t0"])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from specq.bench.provenance import Start, provenance
    from specq.bench.serve import Workload, run_serve_bench

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the services and drop the database

    start = Start()
    trees = [(n, Path(p).resolve()) for n, p in (t.split("=", 1) for t in a.tree)]
    runs = []
    with tempfile.TemporaryDirectory(prefix="specq-followup-") as tmp:
        models = _models(Path(tmp))
        for rnd in range(a.rounds):
            for stack in a.stacks:
                for name, tree in trees:
                    home = Path(tempfile.mkdtemp(dir=tmp))
                    with _service(tree, stack, models, home, _free_port()) as url:
                        for arrival in a.arrivals:
                            w = Workload(docs=a.docs, doc_tokens=a.doc_tokens, questions=a.questions,
                                         max_tokens=a.max_tokens, arrival=arrival, chars_per_token=1.0,
                                         mode="baseline", seed=rnd)
                            load = os.getloadavg()
                            rep = run_serve_bench(url, w, kind="specq", timeout=300)
                            s = rep["summary"]
                            # the service's own part of each TTFT: the client's TTFT less the engine's
                            # (submission to the engine loop -> first token), a measure both trees report
                            over = [j["ttft_ms"] - j["engine"]["ttft"] for j in rep["jobs"]
                                    if j["ttft_ms"] is not None and "ttft" in j["engine"]]
                            s["outside_engine_ms_p50"] = percentile(over, 0.5)
                            s["outside_engine_ms_p90"] = percentile(over, 0.9)
                            row = {"round": rnd, "stack": stack, "tree": name, "arrival": arrival,
                                   "load_before": [round(x, 2) for x in load], "summary": s,
                                   "jobs": [{k: j[k] for k in ("ttft_ms", "engine", "trace", "sent_unix", "first_unix")}
                                            for j in rep["jobs"]]}
                            runs.append(row)
                            print(f"round {rnd} {stack:9} {name:7} {arrival:8} load {load[0]:.1f}: client TTFT p50 "
                                  f"{s['client_ttft_ms_p50']} ms p95 {s['client_ttft_ms_p95']} ms, outside the engine "
                                  f"p50 {s['outside_engine_ms_p50']} ms p90 {s['outside_engine_ms_p90']} ms, "
                                  f"{s['jobs_per_min']} jobs/min, {s['succeeded']}/{s['jobs']} ok", flush=True)
    report = {"command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "cpus": os.cpu_count(),
              "trees": {n: str(p) for n, p in trees}, "models": "tiny random-weight qwen2 GGUFs (byte vocabulary; "
              "target 4 layers, speculator 2), CPU, SPECQ_THREADS=2, SPECQ_CACHE_BYTES=0, mode baseline",
              "provenance": provenance(None, start=start, measured_from="client"), "pooled": pooled(runs), "runs": runs}
    for row in report["pooled"]:
        o = row["outside_engine_ms"]
        print(f"pooled {row['stack']:9} {row['tree']:7} {row['arrival']:8} ({row['jobs']} jobs): outside the engine "
              f"p50 {o['p50']:.1f} ms p90 {o['p90']:.1f} ms; " + ", ".join(
                  f"{k} {v['p50']:.1f}/{v['p90']:.1f}" for k, v in row["gaps_ms"].items()), flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
