"""The task kinds beyond lookups (issue 49): questions users send about code, derived with `ast` from real files.

Kinds (`KINDS`), each with its reference answer computed from the document's own syntax tree:

* `two-place` — "Which functions in the code above call X?": every function of the document whose body
  calls X (`X(...)`, `self.X(...)`, `cls.X(...)`); asked where 2-5 functions do and every `X(` of the
  text is one of those calls or X's `def`, so the answer needs places far apart;
* `aggregation` — "How many functions take a parameter named P?" (`timeout` first where it occurs) and
  "Which exception classes does the code raise?": a count or a set over the whole document;
* `review` — one comparison operator of a real function flipped (`<` → `<=`, `==` → `!=`, `in` → `not in`,
  ...); the question names the function and asks for the line: graded on the line only. Several functions
  of one document get one bug each, so their questions share one prefill;
* `summary` — "Explain what the function F does": graded by how many of the identifiers the reference
  names (its parameters, the document's functions and classes it calls) the answer names
  (quality_grade.ids_named), its own metric, never answer-right.

A document is a cut of one catalogued file (quality_documents.py) of at most `length` tokens, cut only
where no function is open, so every function in it is whole and the references count only whole
functions. Nothing is planted except review's flipped operators. Deterministic for (file, length, window).
"""

from __future__ import annotations

import ast
import bisect
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .quality_documents import CATALOGUE, load_catalogue, resolve
from .quality_tasks import DEPTHS, Task

KINDS = ("two-place", "aggregation", "review", "summary")
#: the kinds' answers need more tokens than a lookup's: the answer half generates at least these
ANSWER_TOKENS = {"two-place": 48, "aggregation": 48, "review": 64, "summary": 160}
#: review: the operator flips a bug injects
FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"), ast.Eq: ("==", "!="),
         ast.NotEq: ("!=", "=="), ast.Is: (" is ", " is not "), ast.IsNot: (" is not ", " is "),
         ast.In: (" in ", " not in "), ast.NotIn: (" not in ", " in ")}
_SKIP_PARAMS = {"self", "cls", "args", "kwargs"}
#: no token of code is longer than this many characters on average over a window (windows' search bound)
MAX_CHARS_PER_TOKEN = 8

Count = Callable[[str], int]


@dataclass
class Func:
    name: str
    start: int  #: first line (its first decorator's), 1-based
    def_line: int
    end: int  #: last line, inclusive
    node: ast.AST = field(repr=False)


def _functions(tree: ast.AST) -> list[Func]:
    """The functions and methods that are not nested in another function (a nested one's calls count as its
    outer function's)."""
    out: list[Func] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([d.lineno for d in child.decorator_list] + [child.lineno])
                out.append(Func(child.name, start, child.lineno, child.end_lineno or child.lineno, child))
            elif isinstance(child, ast.ClassDef) or isinstance(child, (ast.If, ast.Try)):
                visit(child)
    visit(tree)
    return out


def cut_points(lines: Sequence[str], tree: ast.AST) -> list[int]:
    """0-based line indices where a document may start or end: no statement open across them but a class
    (a document may hold some of a class's methods), so every function and string in it is whole."""
    inside = [False] * (len(lines) + 1)
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, ast.ClassDef):
            start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
            for i in range(start, node.end_lineno or node.lineno):  # lines start+1 … end (1-based) are inside
                inside[i] = True
    return [i for i in range(len(lines) + 1) if not inside[i]]


def windows(text: str, length: int, count: Count) -> list[tuple[int, int]]:
    """Consecutive [a, b) line ranges of `text` of at most `length` tokens and at least 90% of it, cut at
    cut_points (a stretch that cannot reach 90% before a long statement, and the file's tail, are left out)."""
    lines = text.splitlines(keepends=True)
    cuts = cut_points(lines, ast.parse(text))
    offset = [0]
    for x in lines:
        offset.append(offset[-1] + len(x))
    cut_at = [offset[c] for c in cuts]
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(cuts) - 1:
        a = cuts[i]
        lo, hi, best = i + 1, len(cuts) - 1, None
        # (tokenize no more than can fit)
        hi = max(lo, min(hi, bisect.bisect_right(cut_at, offset[a] + MAX_CHARS_PER_TOKEN * length) - 1))
        while lo <= hi:  # the last cut that keeps the window within `length`
            mid = (lo + hi) // 2
            if count("".join(lines[a:cuts[mid]])) <= length:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        if best is None:  # one statement longer than the window: start after it
            i += 1
            continue
        if best == len(cuts) - 1 and count("".join(lines[a:cuts[best]])) < 0.9 * length:
            break  # the file's short tail
        if count("".join(lines[a:cuts[best]])) < 0.9 * length:  # a long function next: no document here
            i = best
            continue
        try:
            parse_doc("".join(lines[a:cuts[best]]))
            out.append((a, cuts[best]))
        except SyntaxError:  # a cut inside a nested class: no document here
            pass
        i = best
    return out


# ----------------------------------------------------------------------------------------- facts


@dataclass
class Doc:
    """One document: its text, and its functions (line numbers relative to it, 1-based)."""
    text: str
    funcs: list[Func]
    tree: ast.AST = field(repr=False)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)

    def line_span(self, first: int, last: int | None = None) -> tuple[int, int]:
        """[start, end) characters of lines first..last (1-based, inclusive)."""
        lines = self.lines
        last = first if last is None else last
        a = sum(len(x) for x in lines[: first - 1])
        return a, a + sum(len(x) for x in lines[first - 1: last]) - 1


def parse_doc(text: str) -> Doc:
    """A document cut at cut_points; its methods may stand without their class line: dedent-free parse
    by wrapping in a class when the plain parse fails."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = ast.parse("class _Cut:\n" + text)
        ast.increment_lineno(tree, -1)
    return Doc(text, _functions(tree), tree)


def _unique_funcs(doc: Doc) -> dict[str, Func]:
    names = [f.name for f in doc.funcs]
    return {f.name: f for f in doc.funcs if names.count(f.name) == 1}


def _calls(func: Func, name: str) -> list[int]:
    """Lines where `func` calls `name` (plain, or as an attribute of self / cls)."""
    out = []
    for n in ast.walk(func.node):
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Name) and f.id == name) or (
                    isinstance(f, ast.Attribute) and f.attr == name and isinstance(f.value, ast.Name) and f.value.id in ("self", "cls")):
                out.append(n.lineno)
    return out


def callers(doc: Doc) -> list[tuple[str, list[str], list[int]]]:
    """(X, its callers, the call lines) for each function X of the document that 2-5 functions call and whose
    every `X(` in the text is one of those calls or its def."""
    uniq = _unique_funcs(doc)
    out = []
    for name, f in sorted(uniq.items(), key=lambda kv: kv[1].start):
        if name.startswith("__"):
            continue
        sites = {g.name: _calls(g, name) for g in doc.funcs if g is not f}
        who = sorted(n for n, ls in sites.items() if ls)
        if not 2 <= len(who) <= 5 or any(n not in uniq for n in who):
            continue
        lines = sorted(x for ls in sites.values() for x in ls)
        if len(re.findall(rf"(?<![\w]){re.escape(name)}\(", doc.text)) != len(lines) + 1:
            continue
        out.append((name, who, lines))
    return out


def params_of(f: Func) -> list[str]:
    a = f.node.args  # type: ignore[attr-defined]
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in _SKIP_PARAMS]


def param_counts(doc: Doc) -> list[tuple[str, list[Func]]]:
    """(parameter name, the functions taking it) for names 2-8 functions take; `timeout` first."""
    by: dict[str, list[Func]] = {}
    for f in doc.funcs:
        for p in set(params_of(f)):
            by.setdefault(p, []).append(f)
    out = [(p, fs) for p, fs in by.items() if 2 <= len(fs) <= 8 and len(p) >= 3]
    return sorted(out, key=lambda x: (x[0] != "timeout", -len(x[1]), x[0]))


def raised(doc: Doc) -> tuple[list[str], list[int]]:
    """(the exception class names of the document's raise statements, their lines); a bare re-raise is none."""
    names: dict[str, list[int]] = {}
    for n in ast.walk(doc.tree):
        if isinstance(n, ast.Raise) and n.exc is not None:
            e = n.exc.func if isinstance(n.exc, ast.Call) else n.exc
            name = e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else None
            if name and name[:1].isupper():
                names.setdefault(name, []).append(n.lineno)
    return sorted(names), sorted(x for ls in names.values() for x in ls)


def bug_sites(doc: Doc) -> list[tuple[Func, int, str, str]]:
    """(function, line, original line, line with one comparison flipped) per function: the first single-line
    comparison whose operator text stands once between its operands and whose both versions of the line
    stand once in the document."""
    uniq = _unique_funcs(doc)
    lines = doc.lines
    stripped = [x.strip() for x in lines]
    out = []
    for f in doc.funcs:
        if f.name not in uniq or f.end - f.def_line < 3 or f.name.startswith("__"):
            continue
        for n in sorted((n for n in ast.walk(f.node) if isinstance(n, ast.Compare)), key=lambda n: (n.lineno, n.col_offset)):
            if len(n.ops) != 1 or type(n.ops[0]) not in FLIPS or n.lineno != n.end_lineno:
                continue
            old, new = FLIPS[type(n.ops[0])]
            line = lines[n.lineno - 1]
            raw = line.encode("utf-8")
            a, b = n.left.end_col_offset, n.comparators[0].col_offset
            seg = raw[a:b].decode("utf-8", "replace")
            if seg.strip() != old.strip():
                continue
            seg_new = seg.replace(old.strip(), new.strip(), 1)
            changed = (raw[:a].decode("utf-8") + seg_new + raw[b:].decode("utf-8"))
            if stripped.count(line.strip()) != 1 or stripped.count(changed.strip()) != 0:
                continue
            out.append((f, n.lineno, line.rstrip("\n"), changed.rstrip("\n")))
            break
    return out


def summary_ids(doc: Doc, f: Func) -> list[str]:
    """The identifiers a summary of `f` should name: its parameters and the document's functions and classes
    it calls (at most 6, in the order they appear)."""
    defined = {g.name for g in doc.funcs} | {c.name for c in ast.walk(doc.tree) if isinstance(c, ast.ClassDef) and c.name != "_Cut"}
    ids = [p for p in params_of(f) if len(p) >= 3]
    for n in ast.walk(f.node):
        if isinstance(n, ast.Call):
            c = n.func
            name = c.id if isinstance(c, ast.Name) else c.attr if isinstance(c, ast.Attribute) else ""
            if name in defined and name != f.name and len(name) >= 3 and name not in ids:
                ids.append(name)
    return ids[:6]


# ----------------------------------------------------------------------------------------- questions


def _task(kind: str, doc_text: str, length: int, question: str, answer: str, spans: list[tuple[int, int]], source: str,
          **meta) -> Task:
    spans = sorted(spans)
    t = Task("", kind, False, length, 0.0, doc_text, question, answer, spans, source=source, meta=dict(meta))
    t.depth = min(DEPTHS, key=lambda d: abs(d - t.actual_depth))
    return t


def questions(text: str, length: int, source: str, kinds: Sequence[str] = KINDS, *, per_kind: int = 2,
              seed: int = 0) -> list[Task]:
    """Up to `per_kind` questions of each kind about one document (deterministic). With `review`, the document
    every question is asked on is the one with the flipped operators (one per reviewed function): the other
    kinds' references do not depend on a comparison."""
    rng = random.Random(f"kinds:{seed}:{source}:{length}")
    doc = parse_doc(text)
    out: list[Task] = []
    bugs = bug_sites(doc) if "review" in kinds else []
    bugs = sorted(rng.sample(bugs, min(per_kind, len(bugs))), key=lambda b: b[1]) if bugs else []
    final = text
    if bugs:
        lines = doc.lines
        for _f, ln, _old, new in bugs:
            lines[ln - 1] = new + ("\n" if lines[ln - 1].endswith("\n") else "")
        final = "".join(lines)
        doc = parse_doc(final)
    # spans are computed on the final document (same line numbers: a flip never adds a line)
    if "two-place" in kinds:
        for name, who, lines_ in _pick(rng, callers(doc), per_kind):
            f = _unique_funcs(doc)[name]
            out.append(_task("two-place", final, length,
                             f"In the code above, which functions call {name}? List the names of all of them, and nothing else.",
                             ", ".join(who), [doc.line_span(f.def_line)] + [doc.line_span(x) for x in lines_], source,
                             reference=who, target=name, question_type="callers",
                             others=sorted(g.name for g in doc.funcs if g.name not in who and g.name != name)))
    if "aggregation" in kinds:
        counts = param_counts(doc)[:1]
        for p, fs in counts:
            out.append(_task("aggregation", final, length,
                             f"In the code above, how many functions or methods take a parameter named {p}? Answer with the number only.",
                             str(len(fs)), [doc.line_span(f.def_line) for f in fs], source,
                             reference=len(fs), param=p, question_type="count", functions=[f.name for f in fs]))
        names, lines_ = raised(doc)
        if 2 <= len(names) <= 6:
            out.append(_task("aggregation", final, length,
                             "In the code above, which exception classes do its raise statements raise? List each class name once, and nothing else.",
                             ", ".join(names), [doc.line_span(x) for x in lines_], source, reference=names, question_type="raises"))
    if "review" in kinds:
        for f, ln, old, new in bugs:
            out.append(_task("review", final, length,
                             f"In the code above, the function {f.name} has one bug: one comparison operator in it was changed. "
                             "Quote the line with the bug.",
                             new.strip(), [doc.line_span(ln)], source, reference=new.strip(), original=old.strip(), function=f.name,
                             function_lines=[x.strip() for x in doc.lines[f.def_line - 1: f.end] if len(x.strip()) >= 8]))
    if "summary" in kinds:
        cands = [(f, summary_ids(doc, f)) for f in _unique_funcs(doc).values() if f.end - f.def_line >= 8 and not f.name.startswith("__")]
        cands = [(f, ids) for f, ids in cands if len(ids) >= 2]
        for f, ids in _pick(rng, cands, per_kind):
            out.append(_task("summary", final, length,
                             f"In the code above, what does the function {f.name} do? Explain it in two or three sentences.",
                             ", ".join(ids), [doc.line_span(f.def_line, f.end)], source, reference=ids, function=f.name))
    return sorted(out, key=lambda t: t.evidence[0][0])


def _pick(rng: random.Random, items: list, k: int) -> list:
    if len(items) <= k:
        return list(items)
    idx = sorted(rng.sample(range(len(items)), k))
    return [items[i] for i in idx]


# ----------------------------------------------------------------------------------------- families

#: (catalogue path, split, entry id, length) -> the entry's windows; per process (counting tokens is the cost)
_WINDOWS: dict[tuple, list[tuple[int, int]]] = {}


def closed_book(task: Task) -> str:
    """The question without its document, naming where the code is from."""
    return task.question.replace("In the code above, ", f"In the source code of {task.meta['file']}, ")


def family(index: int, length: int, count: Count, *, kinds: Sequence[str] = KINDS, split: str = "reported", seed: int = 0,
           per_kind: int = 2, catalogue: str | None = None) -> list[Task]:
    """Family `index` at `length` tokens: the questions (`questions`) about one window of one file of the split,
    files taken in turn (index % files) and each file's windows in order (index // files); [] where that file
    has no such window or the window no question of these kinds. Ids `kinds-<split>-L<length>-s<seed>-<index>-q<j>`."""
    entries = load_catalogue(Path(catalogue) if catalogue else CATALOGUE, split)
    if not entries:
        raise ValueError(f"no {split} documents in the catalogue")
    entry = entries[index % len(entries)]
    w = index // len(entries)
    text = resolve(entry)
    wkey = (catalogue, split, entry.id, length)
    if wkey not in _WINDOWS:
        _WINDOWS[wkey] = windows(text, length, count)
    wins = _WINDOWS[wkey]
    if w >= len(wins):
        return []
    a, b = wins[w]
    lines = text.splitlines(keepends=True)
    fam = f"kinds-{split}-L{length}-s{seed}-{index:03d}"
    tasks = questions("".join(lines[a:b]), length, f"{entry.id} lines {a + 1}-{b}", kinds, per_kind=per_kind, seed=seed)
    for j, t in enumerate(tasks):
        t.id = f"{fam}-q{j:02d}"
        t.meta.update({"family": fam, "file": entry.id, "fingerprint": entry.fingerprint(), "lines": [a + 1, b],
                       "actual_depth": round(t.actual_depth, 4)})
    return tasks


def max_families(length: int, split: str = "reported", catalogue: str | None = None) -> int:
    """An upper bound on family indices worth trying (files x the most windows a file of the split can hold)."""
    entries = load_catalogue(Path(catalogue) if catalogue else CATALOGUE, split)
    return len(entries) * max(1, 400_000 // max(1, length))


__all__ = ["KINDS", "ANSWER_TOKENS", "FLIPS", "Func", "Doc", "cut_points", "windows", "parse_doc", "callers", "param_counts",
           "raised", "bug_sites", "summary_ids", "questions", "params_of", "family", "max_families", "closed_book"]
