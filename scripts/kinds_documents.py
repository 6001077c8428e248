"""Write bench/kinds-documents.json: the real source files the non-lookup task kinds ask about (issue 49).

Which files: every standard-library .py file of at least MIN_CHARS characters outside the skipped folders (the
test suite, GUI code; data tables such as html/entities.py have no functions to ask about and are left out),
and the largest .py files (at least MIN_CHARS) of the project's dependencies in DEPENDENCIES, as installed in
the running interpreter's environment. Each with its fingerprint (quality_documents.py). The split is a
function of the file's id alone (sha256 of the id, modulo 3: one third tuning, two thirds reported), so a
new version of a file keeps its side.

Run from the worktree root: `.venv/bin/python scripts/kinds_documents.py` (rewrites the file).
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specq.bench.quality_documents import CATALOGUE, SourceFile, check_catalogue, sha256_of  # noqa: E402
from specq.bench.quality_tasks import stdlib_dir  # noqa: E402

MIN_CHARS = 60_000
SKIP = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "tkinter", "turtledemo", "__pycache__",
        "ensurepip", "pydoc_data"}
LEAVE_OUT = {"html/entities.py"}  # a data table
#: package -> how many of its largest files (the project's direct dependencies and theirs, pure Python)
DEPENDENCIES = {"sqlalchemy": 2, "celery": 2, "kombu": 1, "fastapi": 1, "redis": 2, "pydantic": 2, "httpx": 1, "typer": 1,
                "click": 1, "anyio": 1, "alembic": 2, "jinja2": 2, "billiard": 1, "numpy": 1}


def split_of(ident: str) -> str:
    return "tuning" if int(hashlib.sha256(ident.encode()).hexdigest(), 16) % 3 == 0 else "reported"


def stdlib_entries() -> list[SourceFile]:
    base = stdlib_dir()
    out = []
    for f in sorted(base.rglob("*.py")):
        rel = f.relative_to(base)
        if any(p in SKIP or p.startswith("config-") for p in rel.parts[:-1]) or str(rel) in LEAVE_OUT:
            continue
        if f.stat().st_size < MIN_CHARS:
            continue
        ident = f"stdlib:{rel}"
        out.append(SourceFile(ident, "stdlib", str(rel), platform.python_version(), sha256_of(f), split_of(ident)))
    return out


def dependency_entries() -> list[SourceFile]:
    out = []
    for pkg, k in DEPENDENCIES.items():
        dist = metadata.distribution(pkg)
        files = [(p.locate().stat().st_size, str(p)) for p in dist.files or []
                 if str(p).endswith(".py") and "/tests/" not in str(p) and p.locate().is_file()]
        for size, rel in sorted(files, reverse=True)[:k]:
            if size < MIN_CHARS:
                continue
            ident = f"{pkg}:{rel}"
            out.append(SourceFile(ident, "dependency", rel, dist.version, sha256_of(Path(dist.locate_file(rel))), split_of(ident),
                                  package=pkg))
    return out


def main() -> None:
    entries = stdlib_entries() + dependency_entries()
    check_catalogue(entries)
    data = {"about": "real source files the non-lookup task kinds of `specq bench quality` ask about (issue 49; "
                     "specq/bench/quality_documents.py); written by scripts/kinds_documents.py - do not edit by hand",
            "python": platform.python_version(),
            "documents": [e.fingerprint() for e in entries]}
    CATALOGUE.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    n = {s: sum(e.split == s for e in entries) for s in ("tuning", "reported")}
    print(f"wrote {CATALOGUE.relative_to(ROOT)}: {len(entries)} files ({n['reported']} reported, {n['tuning']} tuning)")


if __name__ == "__main__":
    main()
