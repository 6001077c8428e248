#!/usr/bin/env python3
"""Fail when a marked test suite (services, real_models, faults, load, engine) was skipped entirely.

tests/conftest.py writes, at the end of every pytest run, how many tests of each marked suite passed,
failed and were skipped ($SPECQ_SUITE_REPORT, default .pytest_cache/specq-suites.json). A suite none
of whose tests passed — every one skipped because Redis, PostgreSQL, the real models, llama_cpp or a
tool was missing, or none collected — proves nothing, so CI must not pass on it.

The compose suite (tests/test_compose_up.py) runs on its own after the others, with its own report:
`--suites compose --strict` checks only it, and `--strict` also fails on any skipped test (CI must run
all of it: a skip there means an engine, Compose or model was missing).

Usage: .ci/check_suites.py [REPORT] [--suites NAME[,NAME...]] [--strict]
       (exit 0: every suite had a passing test, and with --strict none skipped; 1 otherwise)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SUITES = ("services", "real_models", "faults", "load", "engine")


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="check_suites.py")
    ap.add_argument("report", nargs="?")
    ap.add_argument("--suites", default=",".join(SUITES), help="comma-separated markers (default: %(default)s)")
    ap.add_argument("--strict", action="store_true", help="a skipped test fails the check too")
    args = ap.parse_args(argv[1:])
    root = Path(__file__).resolve().parents[1]
    path = Path(args.report or os.environ.get("SPECQ_SUITE_REPORT") or root / ".pytest_cache" / "specq-suites.json")
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"check_suites: no suite report at {path} ({e}): run the tests first", file=sys.stderr)
        return 1
    bad = []
    for suite in (x.strip() for x in args.suites.split(",") if x.strip()):
        c = report.get("suites", {}).get(suite, {})
        passed, failed, skipped = (int(c.get(k, 0)) for k in ("passed", "failed", "skipped"))
        print(f"suite {suite:12} passed {passed:4d}  failed {failed:3d}  skipped {skipped:3d}")
        if passed == 0:
            bad.append(f"{suite}: no test passed ({skipped} skipped, {failed} failed)")
        elif args.strict and (skipped or failed):
            bad.append(f"{suite}: {skipped} skipped, {failed} failed (--strict: all must pass)")
    if bad:
        print("check_suites: a marked suite did not run: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
