"""`specq bench …`: benchmarks that print ratios measured side by side in one run (not timed tests).

ttft (baseline vs specprefill), decode (drafters side by side), prefill (sparse prefill cost),
selection (answer-chunk recall of global vs per-window selection);
each writes JSON with the settings and code version it ran with. report renders the docs' tables
of measured numbers from those JSON files (report.py).
"""

from pathlib import Path

#: the repository's examples/ (CPython's textwrap.py and the Python license): the benchmarks' documents
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
