"""`specq worker` with the engine loop's test seams injected (specq/engine/serving/seams.py): the tests'
way to make a job's decode batches fail or the loop block, without any variable that production
workers would read (issue 44 item 12).

    python tests/seamed_worker.py [--fails QUESTION] [--blocks QUESTION] [--loglevel INFO]

--fails Q: a job whose question is Q fails in its decode batches (after 3 tokens);
--blocks Q: the loop's thread blocks for good at the first step that holds a job whose question is Q
(stands for a thread stuck in a C call: the worker's watchdog must end the process).
Settings come from the environment, as for `specq worker`.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fails", default="")
    ap.add_argument("--blocks", default="")
    ap.add_argument("--loglevel", default="INFO")
    args = ap.parse_args(argv)

    from specq.engine.serving.seams import LoopSeams
    from specq.settings import ServiceSettings
    from specq.worker.main import run_worker

    stuck = threading.Event()  # never set

    def before_step(params) -> None:
        if args.blocks and any(p.question == args.blocks for p in params):
            print(f"seamed worker: the engine loop blocks (a job asks {args.blocks!r})", file=sys.stderr, flush=True)
            stuck.wait()

    seams = LoopSeams(fails=(lambda p: p.question == args.fails) if args.fails else None,
                      before_step=before_step if args.blocks else None)
    run_worker(ServiceSettings.from_env(), loglevel=args.loglevel, seams=seams)


if __name__ == "__main__":
    main(sys.argv[1:])
