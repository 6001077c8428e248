#!/usr/bin/env python3
"""Fail when a marked test suite (services, real_models, faults, load, engine) was skipped entirely.

tests/conftest.py writes, at the end of every pytest run, how many tests of each marked suite passed,
failed and were skipped ($SPECQ_SUITE_REPORT, default .pytest_cache/specq-suites.json). A suite none
of whose tests passed — every one skipped because Redis, PostgreSQL, the real models, llama_cpp or a
tool was missing, or none collected — proves nothing, so CI must not pass on it.

Usage: .ci/check_suites.py [REPORT]   (exit 0: every suite had a passing test; 1 otherwise)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SUITES = ("services", "real_models", "faults", "load", "engine")


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    path = Path(argv[1] if len(argv) > 1 else os.environ.get("SPECQ_SUITE_REPORT") or root / ".pytest_cache" /
                "specq-suites.json")
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"check_suites: no suite report at {path} ({e}): run the tests first", file=sys.stderr)
        return 1
    bad = []
    for suite in SUITES:
        c = report.get("suites", {}).get(suite, {})
        passed, failed, skipped = (int(c.get(k, 0)) for k in ("passed", "failed", "skipped"))
        print(f"suite {suite:12} passed {passed:4d}  failed {failed:3d}  skipped {skipped:3d}")
        if passed == 0:
            bad.append(f"{suite}: no test passed ({skipped} skipped, {failed} failed)")
    if bad:
        print("check_suites: a marked suite did not run: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
