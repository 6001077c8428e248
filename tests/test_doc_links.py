"""Every link a reader or the code follows into the docs resolves.

* Markdown (README.md and docs/**.md): every relative link `[text](path#anchor)` (and `<img src>`)
  names a file or folder that exists, and its `#anchor`, where given, is a heading of that file as
  GitHub makes anchors (lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats)
  or an explicit `<a id=…>`/`<a name=…>`.
* Code and data (every tracked text file): every `docs/…` path (not a URL path such as `/docs/static`)
  exists, and its `#anchor` where one is written.

Files move and headings get renamed; this test says which reference broke instead of a reader
finding a dead link.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_LINK = re.compile(r"(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_SRC = re.compile(r"""<(?:img|a)\s[^>]*(?:src|href)=["']([^"']+)["']""")
_EXPLICIT_ANCHOR = re.compile(r"""<a\s[^>]*(?:id|name)=["']([^"']+)["']""")
_FENCE = re.compile(r"^(```|~~~)")
_CODE_REF = re.compile(r"(?<![\w/.\-])docs/[\w\-]+(?:[./][\w\-]+|\.\*)*(?:#[\w\-]+)?")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before the duplicate suffix)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "").strip().lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in ("L", "N") or cat == "Mn":
            out.append(ch)
    return "".join(out).replace(" ", "-")


def _markdown_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for no, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            yield no, line


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """Every anchor of a Markdown file: its headings' slugs (with GitHub's -1, -2 for repeats) and
    explicit <a id/name> anchors."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _no, line in _markdown_lines(path.read_text(encoding="utf-8")):
        out.update(_EXPLICIT_ANCHOR.findall(line))
        m = re.match(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def _strip_inline_code(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _check_target(source: Path, target: str, where: str) -> str | None:
    """None when `target` (a relative link from `source`) resolves, else what is wrong."""
    path_part, _, anchor = target.partition("#")
    dest = (source.parent / path_part).resolve() if path_part else source
    shown = dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest
    if not dest.exists():
        return f"{where}: {target} -> no such file {shown}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{where}: {target} -> no heading #{anchor} in {shown}"
    return None


def broken_markdown_links() -> list[str]:
    problems = []
    for md in markdown_files():
        rel = md.relative_to(REPO)
        for no, line in _markdown_lines(md.read_text(encoding="utf-8")):
            line = _strip_inline_code(line)
            for target in _LINK.findall(line) + _IMAGE.findall(line) + _HTML_SRC.findall(line):
                if re.match(r"^[a-z][a-z0-9+.\-]*:", target, re.I) or target.startswith("//"):
                    continue  # http(s), mailto: not this test's business
                if target.startswith("/"):
                    problems.append(f"{rel}:{no}: {target} -> absolute path (use a relative link)")
                    continue
                problem = _check_target(md, target, f"{rel}:{no}")
                if problem:
                    problems.append(problem)
    return problems


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    files = [REPO / name for name in out.decode().split("\0") if name]
    extra = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout
    files += [REPO / name for name in extra.decode().split("\0") if name]
    return [f for f in files if f.is_file() and f.suffix not in (".png", ".gguf", ".whl", ".jpg", ".ico")]


def broken_code_references() -> list[str]:
    """`docs/…` references in code and data (paths from the repository root)."""
    problems = []
    for f in _tracked_text_files():
        if f == Path(__file__).resolve():  # its own examples
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if "docs/" not in text:
            continue
        rel = f.relative_to(REPO)
        for no, line in enumerate(text.splitlines(), 1):
            for ref in _CODE_REF.findall(line):
                ref = ref.rstrip(".-")
                path_part, _, anchor = ref.partition("#")
                dest = REPO / path_part
                if "*" in path_part:  # a pattern (`docs/reliability-figures.*`): something must match it
                    if not list(REPO.glob(path_part)):
                        problems.append(f"{rel}:{no}: {ref} -> nothing matches")
                    continue
                if not dest.exists():
                    problems.append(f"{rel}:{no}: {ref} -> no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.resolve()):
                    problems.append(f"{rel}:{no}: {ref} -> no heading #{anchor} in {path_part}")
    return problems


def test_github_slug_matches_githubs_rules():
    assert github_slug("Mode `auto` and the caches") == "mode-auto-and-the-caches"
    assert github_slug("Group-sparse at 30K (2026-12-05, evening)") == "group-sparse-at-30k-2026-12-05-evening"
    assert github_slug("The CLI: what it prints and sends") == "the-cli-what-it-prints-and-sends"
    assert github_slug("#17's second goal: what it would take") == "17s-second-goal-what-it-would-take"
    assert github_slug("[Link](x.md) and *stars*") == "link-and-stars"


def test_the_checker_finds_a_dead_link_and_a_dead_anchor(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n## Title\n\nsee [b](b.md), [self](#title-1), [gone](#nope)\n"
                   "```\n[in code](missing.md)\n```\n", encoding="utf-8")
    (tmp_path / "b.md").write_text("# B\n", encoding="utf-8")
    assert anchors(doc) == {"title", "title-1"}
    assert _check_target(doc, "b.md", "a") is None
    assert _check_target(doc, "#title-1", "a") is None
    assert "no heading #nope" in _check_target(doc, "#nope", "a")
    assert "no such file" in _check_target(doc, "c.md#x", "a")
    assert _CODE_REF.findall('see docs/history.md#readmes-first-job, href="/docs/static/x.css", docs/f.*') == [
        "docs/history.md#readmes-first-job", "docs/f.*"]


def test_every_relative_link_and_anchor_in_readme_and_docs_resolves():
    problems = broken_markdown_links()
    assert not problems, f"{len(problems)} broken link(s):\n" + "\n".join(problems)


def test_every_docs_reference_in_code_and_data_exists():
    problems = broken_code_references()
    assert not problems, f"{len(problems)} broken docs/ reference(s):\n" + "\n".join(problems)


def test_the_docs_index_links_every_page():
    """docs/README.md is the way in: a page it does not link is a page nobody finds."""
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {t.partition("#")[0] for t in _LINK.findall(index)}
    missing = [p.relative_to(REPO / "docs").as_posix() for p in sorted((REPO / "docs").rglob("*.md"))
               if p.name != "README.md" and p.relative_to(REPO / "docs").as_posix() not in linked]
    assert not missing, "add to docs/README.md: " + ", ".join(missing)
