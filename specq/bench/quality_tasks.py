"""Tasks for `specq bench quality`: questions about long documents made of real text on this machine.

The text is nobody's on the team: the Python standard library's sources (the interpreter's own
`stdlib` directory) and the license texts in /usr/share/common-licenses. Four kinds of task:

* `needle` (planted): one sentence "The secret code of the <colour> <animal> is <7 digits>." put
  into license prose at a chosen depth;
* `multikey` (planted, with distractors): six comment lines "# The access key for vault
  '<word>-<n>' is <6 digits>." in Python source, one of them at the chosen depth, the others (same
  word, other numbers) spread over the document; the question names one vault;
* `raises` (not planted): "Which function raises <Error> with the message "<msg>"?" for a real
  `raise` in a real function (its `def` line at most 40 lines above);
* `const` (not planted): "What value is the module-level constant <NAME> assigned?" for a real
  `NAME = <literal>` line.

Every task's answer stands once in its document (the planted code / the message and the function's
`def` / the constant's assignment occur exactly once), and its evidence — the character spans the
answer needs — lies at the requested depth (fraction of the document before the first evidence
span's start). Not-planted tasks cut the document out of the concatenated sources around the
evidence; planted ones insert into a cut. Generation is deterministic for a (seed, length, index)
on the same files: `corpus_fingerprint()` names them.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import sysconfig
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

KINDS = ("needle", "multikey", "raises", "const")
PLANTED = {"needle": True, "multikey": True, "raises": False, "const": False}
DEPTHS = tuple(round(0.1 * i, 1) for i in range(1, 10))
LICENSES = Path("/usr/share/common-licenses")
#: stdlib folders left out: the test suite (huge, repetitive) and GUI/demo code
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "tkinter", "turtledemo", "__pycache__",
              "config-3.11-x86_64-linux-gnu", "ensurepip", "pydoc_data"}
_MAX_FILE = 400_000

Count = Callable[[str], int]


@dataclass
class Task:
    id: str
    kind: str
    planted: bool
    length: int  #: requested document tokens
    depth: float  #: requested depth
    document: str
    question: str
    answer: str
    #: [start, end) character spans of the document the answer needs
    evidence: list[tuple[int, int]]
    source: str = ""  #: where the text (or the fact) comes from
    meta: dict = field(default_factory=dict)

    def describe(self) -> dict:
        d = asdict(self)
        d.pop("document")
        d["doc_chars"] = len(self.document)
        d["doc_sha1"] = hashlib.sha1(self.document.encode()).hexdigest()[:12]
        return d

    @property
    def actual_depth(self) -> float:
        return self.evidence[0][0] / max(1, len(self.document))


# ----------------------------------------------------------------------------------------- corpora


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@lru_cache(maxsize=4)
def code_corpus(root: str | None = None) -> tuple[str, tuple[tuple[int, str], ...]]:
    """The stdlib's .py files concatenated in path order, each after a `# file: <path>` line;
    (text, ((offset, path), ...))."""
    base = Path(root) if root else stdlib_dir()
    parts: list[str] = []
    index: list[tuple[int, str]] = []
    pos = 0
    for f in sorted(base.rglob("*.py")):
        rel = f.relative_to(base)
        if any(p in _SKIP_DIRS for p in rel.parts[:-1]) or f.stat().st_size > _MAX_FILE:
            continue
        try:
            body = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        chunk = f"# file: {rel}\n\n{body.rstrip()}\n\n\n"
        index.append((pos, str(rel)))
        parts.append(chunk)
        pos += len(chunk)
    return "".join(parts), tuple(index)


@lru_cache(maxsize=4)
def prose_corpus(root: str | None = None) -> tuple[str, tuple[tuple[int, str], ...]]:
    """The license texts (symlinked duplicates once), concatenated in name order."""
    base = Path(root) if root else LICENSES
    parts: list[str] = []
    index: list[tuple[int, str]] = []
    seen: set[str] = set()
    pos = 0
    for f in sorted(base.iterdir()):
        if not f.is_file():
            continue
        real = str(f.resolve())
        if real in seen:
            continue
        seen.add(real)
        try:
            body = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        chunk = body.strip() + "\n\n\n"
        index.append((pos, f.name))
        parts.append(chunk)
        pos += len(chunk)
    return "".join(parts), tuple(index)


def corpus_fingerprint() -> dict:
    code, ci = code_corpus()
    prose, pi = prose_corpus()
    return {
        "code": {"root": str(stdlib_dir()), "files": len(ci), "chars": len(code), "sha1": hashlib.sha1(code.encode()).hexdigest()[:12]},
        "prose": {"root": str(LICENSES), "files": len(pi), "chars": len(prose), "sha1": hashlib.sha1(prose.encode()).hexdigest()[:12]},
    }


def _file_at(index: Sequence[tuple[int, str]], pos: int) -> str:
    lo, hi = 0, len(index) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if index[mid][0] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return index[lo][1] if index else ""


# ----------------------------------------------------------------------------------------- cutting


def _line_start(text: str, pos: int) -> int:
    pos = max(0, min(len(text), pos))
    return text.rfind("\n", 0, pos) + 1


def cut_around(text: str, anchor: int, depth: float, n_tokens: int, count: Count, cpt: float = 3.6) -> tuple[int, int]:
    """[a, b) of `text` (line-aligned) of about `n_tokens` tokens with `anchor` at `depth` of it."""
    chars = n_tokens * cpt
    for _ in range(4):
        a = _line_start(text, int(anchor - depth * chars))
        b = _line_start(text, int(anchor + (1 - depth) * chars))
        if a >= b:
            break
        got = count(text[a:b])
        if abs(got - n_tokens) <= max(16, n_tokens // 100):
            break
        chars *= n_tokens / max(1, got)
    # never more than asked: drop whole lines at the far end of the longer side
    while b > a and count(text[a:b]) > n_tokens:
        b = _line_start(text, b - max(1, (b - a) // 200))
    return a, b



# ----------------------------------------------------------------------------------------- kinds

_COLOURS = ["amber", "cobalt", "crimson", "indigo", "olive", "saffron", "teal", "violet", "silver", "ochre"]
_ANIMALS = ["heron", "lynx", "otter", "falcon", "badger", "marmot", "ibis", "gecko", "walrus", "tapir"]
_WORDS = ["north", "harbor", "quartz", "meadow", "ember", "glacier", "lantern", "orchid", "summit", "willow"]


def _plant(text: str, at: int, line: str) -> tuple[str, tuple[int, int]]:
    """Insert `line` as its own line at the line start nearest `at`; (new text, span of the line)."""
    p = _line_start(text, at)
    new = text[:p] + line + "\n" + text[p:]
    return new, (p, p + len(line))


def make_needle(rng: random.Random, length: int, depth: float, count: Count) -> Task | None:
    prose, index = prose_corpus()
    code = f"{rng.randrange(10**6, 10**7)}"
    colour, animal = rng.choice(_COLOURS), rng.choice(_ANIMALS)
    sentence = f"The secret code of the {colour} {animal} is {code}."
    budget = length - count(sentence) - 2
    # the prose corpus is short (~70K tokens): the cut starts anywhere it fits
    est = int(budget * 4.2)
    start = rng.randrange(0, max(1, len(prose) - est - 1))
    a, b = cut_around(prose, start + int(depth * est), depth, budget, count, cpt=4.2)
    doc = prose[a:b]
    doc, span = _plant(doc, int(depth * len(doc)), sentence)
    if doc.count(code) != 1 or doc.count(f"{colour} {animal}") != 1:
        return None
    q = f"What is the secret code of the {colour} {animal}? Answer with the number only."
    return Task("", "needle", True, length, depth, doc, q, code, [span], source=f"licenses from {_file_at(index, a)}")


def make_multikey(rng: random.Random, length: int, depth: float, count: Count) -> Task | None:
    codetext, index = code_corpus()
    word = rng.choice(_WORDS)
    nums = rng.sample(range(10, 100), 6)
    values = [f"{rng.randrange(10**5, 10**6)}" for _ in nums]
    lines = [f"# The access key for vault '{word}-{n}' is {v}." for n, v in zip(nums, values)]
    budget = length - sum(count(x) for x in lines) - 8
    anchor = rng.randrange(len(codetext) // 20, len(codetext) - len(codetext) // 20)
    a, b = cut_around(codetext, anchor, depth, budget, count)
    doc = codetext[a:b]
    # the asked line at `depth`, the distractors at other depths (at least 0.05 away)
    others = []
    while len(others) < 5:
        d = rng.uniform(0.02, 0.98)
        if abs(d - depth) >= 0.05 and all(abs(d - o) >= 0.02 for o in others):
            others.append(d)
    placements = sorted([(depth, 0)] + [(d, i + 1) for i, d in enumerate(others)], reverse=True)
    spans: dict[int, tuple[int, int]] = {}
    for d, i in placements:  # from the end, so earlier offsets stay valid
        doc, span = _plant(doc, int(d * len(doc)), lines[i])
        spans = {j: (s + len(lines[i]) + 1 if s >= span[0] else s, e + len(lines[i]) + 1 if s >= span[0] else e) for j, (s, e) in spans.items()}
        spans[i] = span
    if any(doc.count(v) != 1 for v in values) or doc.count(f"'{word}-{nums[0]}'") != 1:
        return None
    q = f"What is the access key for vault '{word}-{nums[0]}'? Answer with the number only."
    return Task("", "multikey", True, length, depth, doc, q, values[0], [spans[0]], source=f"stdlib from {_file_at(index, a)}",
                meta={"distractor_spans": [spans[i] for i in range(1, 6)]})


_RAISE = re.compile(r"""^[ \t]+raise ([A-Z]\w*(?:Error|Exception|Warning))\((['"])([A-Za-z][^'"\\{}%\n]{24,90})\2\)""", re.M)
_DEF = re.compile(r"^([ \t]*)def (\w+)\(", re.M)
_CONST = re.compile(r"""^([A-Z][A-Z0-9_]{3,}) = (0x[0-9A-Fa-f]{2,}|\d{2,}|'[^'\n\\]{3,40}'|"[^"\n\\]{3,40}")[ \t]*$""", re.M)


def raises_in(code: str) -> list[tuple[int, int, int, int, str, str, str]]:
    """(def start, def end, msg start, msg end, function, error, message) for the raises of `code` that
    sit in a function (its `def` line at most 40 lines above, no def/class between)."""
    out = []
    for m in _RAISE.finditer(code):
        indent = len(m.group(0)) - len(m.group(0).lstrip())
        head = code[max(0, m.start() - 4000) : m.start()]
        defs = [d for d in _DEF.finditer(head) if len(d.group(1).expandtabs()) < indent]
        if not defs:
            continue
        d = defs[-1]
        between = head[d.end():]
        if between.count("\n") > 40 or re.search(r"^[ \t]*(def|class) ", between, re.M):
            continue
        base = m.start() - len(head)
        ds = base + d.start() + len(d.group(1))
        out.append((ds, base + d.end() - 1, m.start(3), m.end(3), d.group(2), m.group(1), m.group(3)))
    return out


def consts_in(code: str) -> list[tuple[int, int, str, str]]:
    """(start, end, name, value) for the module-level `NAME = <literal>` lines of `code`."""
    out = []
    for m in _CONST.finditer(code):
        value = m.group(2)
        if value.strip("'\"").isdigit() and len(value) < 2:
            continue
        out.append((m.start(), m.end(), m.group(1), value))
    return out


@lru_cache(maxsize=2)
def raise_candidates() -> tuple[tuple[int, int, int, int, str, str, str], ...]:
    return tuple(raises_in(code_corpus()[0]))


@lru_cache(maxsize=2)
def const_candidates() -> tuple[tuple[int, int, str, str], ...]:
    return tuple(consts_in(code_corpus()[0]))


def _raises_ok(doc: str, func: str, msg: str) -> bool:
    """The raise's answer stands once: a plain function name, not in the message; message and `def` once."""
    if func.startswith("__") or func in ("main", "_test", "test") or func.lower() in msg.lower():
        return False
    return doc.count(msg) == 1 and len(re.findall(rf"\bdef {re.escape(func)}\(", doc)) == 1


def _const_ok(doc: str, name: str) -> bool:
    return len(re.findall(rf"^{re.escape(name)} = ", doc, re.M)) == 1 and len(re.findall(rf"\b{re.escape(name)}\b", doc)) == 1


def _raises_question(err: str, msg: str) -> str:
    return f'In the code above, which function raises {err} with the message "{msg}"? Answer with the function name only.'


def _const_question(name: str) -> str:
    return f"In the code above, what value is the module-level constant {name} assigned? Answer with the value only."


def make_raises(rng: random.Random, length: int, depth: float, count: Count) -> Task | None:
    code, index = code_corpus()
    cands = raise_candidates()
    ds, de, ms, me, func, err, msg = cands[rng.randrange(len(cands))]
    a, b = cut_around(code, ds, depth, length, count)
    if not (a <= ds and me <= b):
        return None
    doc = code[a:b]
    if not _raises_ok(doc, func, msg):
        return None
    return Task("", "raises", False, length, depth, doc, _raises_question(err, msg), func, [(ds - a, de - a), (ms - a, me - a)],
                source=f"stdlib {_file_at(index, ds)}")


def make_const(rng: random.Random, length: int, depth: float, count: Count) -> Task | None:
    code, index = code_corpus()
    cands = const_candidates()
    s, e, name, value = cands[rng.randrange(len(cands))]
    a, b = cut_around(code, s, depth, length, count)
    if not (a <= s and e <= b):
        return None
    doc = code[a:b]
    if not _const_ok(doc, name):
        return None
    return Task("", "const", False, length, depth, doc, _const_question(name), value.strip("'\""), [(s - a, e - a)],
                source=f"stdlib {_file_at(index, s)}")


MAKERS = {"needle": make_needle, "multikey": make_multikey, "raises": make_raises, "const": make_const}


def task_plan(index: int, kinds: Sequence[str] = KINDS) -> tuple[str, float]:
    """Task `index`'s kind and depth: kinds rotate, depths step by 4 of the nine (0.1, 0.5, 0.9, 0.4, …) so
    that a few tasks already spread over the depths; with four kinds every 36 tasks hold each (kind,
    depth) pair once (4 and 9 are coprime)."""
    return kinds[index % len(kinds)], DEPTHS[(index * 4) % len(DEPTHS)]


def make_task(index: int, length: int, count: Count, *, seed: int = 0, kinds: Sequence[str] = KINDS) -> Task:
    """Task number `index` for documents of `length` tokens (deterministic; retries a new draw when a
    draw breaks the answer-once rule)."""
    kind, depth = task_plan(index, kinds)
    for attempt in range(200):
        rng = random.Random(f"{seed}:{length}:{index}:{attempt}")
        t = MAKERS[kind](rng, length, depth, count)
        if t is not None and t.evidence and abs(t.actual_depth - depth) <= 0.06:
            t.id = f"{kind}-L{length}-s{seed}-{index:04d}"
            t.meta["attempt"] = attempt
            return t
    raise RuntimeError(f"no {kind} task at length {length}, depth {depth} after 200 draws")


# ----------------------------------------------------------------------------------------- families
#
# A family is one document and several questions about it, each answered once in it: the way users
# ask (many questions, one document) and the way the service makes a second question cheap (the
# speculator's window cache and the target's prompt cache restore the document's KV; only the
# question and the lookahead are computed again). The recall half at n >= 200 on 8K and 16K tokens is
# hours instead of days on a 2-core CPU this way. The questions of one family are not independent
# draws: the report counts families next to tasks.

#: families rotate code, code, prose
FAMILY_SOURCES = ("code", "code", "prose")
#: planted lines per family (multikey vaults in code, needles in prose)
FAMILY_PLANTED = 10


def _spread_depths(rng: random.Random, k: int) -> list[float]:
    """k depths in (0.03, 0.97), one per equal slice of the range, jittered inside its slice."""
    w = 0.94 / k
    return [0.03 + w * i + rng.uniform(0.15 * w, 0.85 * w) for i in range(k)]


def _plant_lines(doc: str, lines: list[str], depths: list[float]) -> tuple[str, list[tuple[int, int]]]:
    """Insert each line at its depth; (new text, the lines' final spans, in the order given)."""
    spans: dict[int, tuple[int, int]] = {}
    for d, i in sorted(((d, i) for i, d in enumerate(depths)), reverse=True):  # from the end: earlier offsets stay
        doc, span = _plant(doc, int(d * len(doc)), lines[i])
        shift = len(lines[i]) + 1
        spans = {j: (s + shift, e + shift) if s >= span[0] else (s, e) for j, (s, e) in spans.items()}
        spans[i] = span
    return doc, [spans[i] for i in range(len(lines))]


def _depth_bin(x: float) -> float:
    return min(DEPTHS, key=lambda d: abs(d - x))


def _family_code(rng: random.Random, length: int, count: Count, per: int) -> list[Task]:
    code, index = code_corpus()
    word = rng.choice(_WORDS)
    nums = rng.sample(range(10, 100), FAMILY_PLANTED)
    values = [f"{rng.randrange(10**5, 10**6)}" for _ in nums]
    lines = [f"# The access key for vault '{word}-{n}' is {v}." for n, v in zip(nums, values)]
    budget = length - sum(count(x) for x in lines) - 8
    # cut around a real raise or constant (they are sparse: ~4 in 16K tokens of the stdlib on average)
    facts = [c[0] for c in raise_candidates()] + [c[0] for c in const_candidates()]
    a, b = cut_around(code, facts[rng.randrange(len(facts))], rng.uniform(0.1, 0.9), budget, count)
    doc, spans = _plant_lines(code[a:b], lines, _spread_depths(rng, FAMILY_PLANTED))
    if any(doc.count(v) != 1 for v in values) or any(doc.count(f"'{word}-{n}'") != 1 for n in nums):
        return []
    source = f"stdlib from {_file_at(index, a)}"
    tasks = [Task("", "multikey", True, length, 0.0, doc, f"What is the access key for vault '{word}-{n}'? Answer with the number only.",
                  v, [sp], source=source, meta={"distractor_spans": [x for x in spans if x != sp]})
             for n, v, sp in zip(nums, values, spans)]
    found: list[Task] = []
    for ds, de, ms, me, func, err, msg in raises_in(doc):
        if _raises_ok(doc, func, msg) and all(t.answer != func for t in found):
            found.append(Task("", "raises", False, length, 0.0, doc, _raises_question(err, msg), func, [(ds, de), (ms, me)], source=source))
    for s0, e0, name, value in consts_in(doc):
        if _const_ok(doc, name):
            found.append(Task("", "const", False, length, 0.0, doc, _const_question(name), value.strip("'\""), [(s0, e0)], source=source))
    # not-planted questions spread over the document, as many as the family has room for
    found.sort(key=lambda t: t.evidence[0][0])
    room = max(0, per - len(tasks))
    if len(found) > room:
        step = len(found) / room if room else 0
        found = [found[int(i * step)] for i in range(room)]
    return tasks + found


def _family_prose(rng: random.Random, length: int, count: Count, per: int) -> list[Task]:
    prose, index = prose_corpus()
    k = min(per, FAMILY_PLANTED)
    pairs = rng.sample([(c, a) for c in _COLOURS for a in _ANIMALS], k)
    codes = [f"{rng.randrange(10**6, 10**7)}" for _ in pairs]
    lines = [f"The secret code of the {c} {a} is {x}." for (c, a), x in zip(pairs, codes)]
    budget = length - sum(count(x) for x in lines) - 2 * k
    est = int(budget * 4.2)
    start = rng.randrange(0, max(1, len(prose) - est - 1))
    a, b = cut_around(prose, start + est // 2, 0.5, budget, count, cpt=4.2)
    doc, spans = _plant_lines(prose[a:b], lines, _spread_depths(rng, k))
    if any(doc.count(x) != 1 for x in codes) or any(doc.count(f"{c} {an}") != 1 for c, an in pairs):
        return []
    return [Task("", "needle", True, length, 0.0, doc, f"What is the secret code of the {c} {an}? Answer with the number only.", x, [sp],
                 source=f"licenses from {_file_at(index, a)}") for (c, an), x, sp in zip(pairs, codes, spans)]


def make_family(index: int, length: int, count: Count, *, seed: int = 0, per: int = 16) -> list[Task]:
    """Family number `index` at `length` tokens: one document, up to `per` questions (deterministic).
    Code families plant FAMILY_PLANTED vaults (each asked, the others its distractors) and ask the rest from
    real raises and constants spread over the document; prose families plant up to FAMILY_PLANTED needles. Each
    task's `depth` is its evidence's depth rounded to the nearest of 0.1…0.9; ids are
    `fam-L<length>-s<seed>-<index>-q<j>`."""
    source = FAMILY_SOURCES[index % len(FAMILY_SOURCES)]
    for attempt in range(50):
        rng = random.Random(f"family:{seed}:{length}:{index}:{attempt}")
        tasks = (_family_code if source == "code" else _family_prose)(rng, length, count, per)
        if tasks:
            tasks.sort(key=lambda t: t.evidence[0][0])
            for j, t in enumerate(tasks):
                t.depth = _depth_bin(t.actual_depth)
                t.id = f"fam-L{length}-s{seed}-{index:03d}-q{j:02d}"
                t.meta.update({"attempt": attempt, "family": f"fam-L{length}-s{seed}-{index:03d}", "actual_depth": round(t.actual_depth, 4)})
            return tasks
    raise RuntimeError(f"no {source} family at length {length} after 50 draws")


# ----------------------------------------------------------------------------------------- grading


def is_correct(task: Task, text: str) -> bool:
    """Does the answer text give the task's answer (numbers: the digits as a separate number; names
    and values: as a whole word, case-sensitive for names)."""
    out = text.strip()
    ans = task.answer
    if task.kind in ("needle", "multikey") or ans.isdigit():
        return re.search(rf"(?<![0-9]){re.escape(ans)}(?![0-9])", out.replace(",", "")) is not None
    if task.kind == "raises":
        return re.search(rf"(?<![\w]){re.escape(ans)}(?![\w])", out) is not None
    return re.search(rf"(?<![\w]){re.escape(ans)}(?![\w])", out, re.I) is not None or ans.lower() in out.lower()


def evidence_chunks(bounds: Sequence[int], spans: Sequence[tuple[int, int]], chunk: int) -> list[int]:
    """Chunk indices (of `chunk` tokens) holding any token that overlaps one of the character spans.
    bounds[i]: where document token i starts (len = n tokens + 1)."""
    import numpy as np

    b = np.asarray(bounds)
    starts, ends = b[:-1], b[1:]
    out: set[int] = set()
    for s, e in spans:
        hit = np.nonzero((starts < e) & (ends > s))[0]
        out.update(int(i) // chunk for i in hit)
    return sorted(out)


def random_recall(n_chunks: int, kept: int, needed: int) -> float:
    """P(all `needed` chunks are among `kept` of `n_chunks` chosen uniformly at random)."""
    if needed > kept:
        return 0.0
    return math.comb(n_chunks - needed, kept - needed) / math.comb(n_chunks, kept)
