"""The real source files the non-lookup task kinds ask about (issue 49), and how a row can be re-run on them.

The catalogue (bench/kinds-documents.json, written by scripts/kinds_documents.py) lists each file by
where it comes from and a fingerprint: a standard-library file by the Python version and its path under
the interpreter's stdlib directory, a dependency's file by package name, version and its path in the
installed distribution; both with the file's sha256. `resolve` refuses a file whose version or sha256
differs from the catalogue's, so a row is never re-run on other text under the same name.

Every file is in exactly one `split`: `tuning` files may be used to choose a default, `reported` files
give the rows that vouch for one; never both (`check_catalogue`).
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .quality_tasks import stdlib_dir

CATALOGUE = Path(__file__).resolve().parents[2] / "bench" / "kinds-documents.json"
SPLITS = ("tuning", "reported")
ORIGINS = ("stdlib", "dependency")


class DocumentError(ValueError):
    """A catalogue entry that cannot be read back as it was fingerprinted."""


@dataclass(frozen=True)
class SourceFile:
    id: str  #: "stdlib:<path>" or "<package>:<path>"
    origin: str  #: stdlib | dependency
    path: str  #: under the stdlib directory, or in the distribution (as its RECORD names it)
    version: str  #: Python version (stdlib) or the package's version
    sha256: str
    split: str  #: tuning | reported
    package: str = ""  #: dependency only

    def fingerprint(self) -> dict:
        return {"id": self.id, "origin": self.origin, "path": self.path, "version": self.version, "sha256": self.sha256,
                "split": self.split, **({"package": self.package} if self.package else {})}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def locate(entry: SourceFile) -> Path:
    """Where the entry's file is on this machine (not yet checked)."""
    if entry.origin == "stdlib":
        return stdlib_dir() / entry.path
    try:
        dist = metadata.distribution(entry.package)
    except metadata.PackageNotFoundError:
        raise DocumentError(f"{entry.id}: package {entry.package} is not installed") from None
    return Path(dist.locate_file(entry.path))


def installed_version(entry: SourceFile) -> str:
    if entry.origin == "stdlib":
        return platform.python_version()
    try:
        return metadata.version(entry.package)
    except metadata.PackageNotFoundError:
        return ""


def resolve(entry: SourceFile) -> str:
    """The entry's text, after checking that this machine has the very file the catalogue fingerprinted."""
    have = installed_version(entry)
    if have != entry.version:
        what = "Python" if entry.origin == "stdlib" else entry.package
        raise DocumentError(f"{entry.id}: catalogued from {what} {entry.version}, this machine has {have or 'none'}")
    path = locate(entry)
    if not path.is_file():
        raise DocumentError(f"{entry.id}: {path} is missing")
    digest = sha256_of(path)
    if digest != entry.sha256:
        raise DocumentError(f"{entry.id}: sha256 {digest[:12]}… differs from the catalogue's {entry.sha256[:12]}…")
    return path.read_text(encoding="utf-8")


def entry_from_dict(d: dict) -> SourceFile:
    try:
        e = SourceFile(id=d["id"], origin=d["origin"], path=d["path"], version=d["version"], sha256=d["sha256"],
                       split=d["split"], package=d.get("package", ""))
    except KeyError as k:
        raise DocumentError(f"catalogue entry {d.get('id', '?')}: {k.args[0]} missing") from None
    if e.origin not in ORIGINS or e.split not in SPLITS or len(e.sha256) != 64 or (e.origin == "dependency") != bool(e.package):
        raise DocumentError(f"catalogue entry {e.id}: origin, split, sha256 or package out of range")
    return e


def check_catalogue(entries: list[SourceFile]) -> None:
    """Ids unique and no file (by sha256) in both splits."""
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        raise DocumentError("catalogue: duplicate ids")
    by_split = {s: {e.sha256 for e in entries if e.split == s} for s in SPLITS}
    both = by_split["tuning"] & by_split["reported"]
    if both:
        raise DocumentError(f"catalogue: {len(both)} files are in both splits")


def load_catalogue(path: Path = CATALOGUE, split: str | None = None) -> list[SourceFile]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    entries = [entry_from_dict(d) for d in data["documents"]]
    check_catalogue(entries)
    return [e for e in entries if split is None or e.split == split]


__all__ = ["SourceFile", "DocumentError", "CATALOGUE", "SPLITS", "load_catalogue", "check_catalogue", "resolve", "locate",
           "entry_from_dict", "sha256_of", "installed_version"]
