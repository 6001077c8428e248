"""A disk copy of the worker's saved KV states, so that they outlive the process (SPECQ_CACHE_DIR).

Why: the caches of spec_cache.py and prefix_cache.py live in host memory, so a worker restart (a
deploy, a crash, `specq up` again, a benchmark resumed the next day) makes the next question about
every document pay its full prefill and scoring again. With a directory set, every entry the
`StateStore` keeps is also written there, and a new store loads the newest files that fit its budget
at start: the directory mirrors the memory cache (an evicted entry's file is deleted), it never holds
more than the budget. (llama-server's answer is `--slot-save-path` with explicit save/restore calls;
here it is automatic and keyed like the memory cache.)

What makes a file safe to load: its key is the memory cache's key (model file sha256, every numerics
setting, the tenant, the tokens' sha256), so another model, numerics or tenant can never hit it; and
its header names the llama.cpp build that wrote the state (`build`): llama_state_seq_* data is only
read back by the same library build, so files of another build are deleted at load. A file that does
not parse (a torn write, a foreign file) is deleted too.

Writes never block the caller (the serving loop saves on its own thread): one writer thread takes
writes and removals in order from a queue (a write that would put more than `max_pending_bytes`
in it is skipped: the queue keeps the states alive, and a slow disk must not grow memory); each
file is written to a temporary name and renamed, so a crash leaves either the old file or the new
one. The directory is created 0700: it holds KV computed
from the tenants' documents.

File format: b"SPECQKV1", header length (uint32, little endian), header JSON {"key": [...], "build":
..., "t": when it was stored (ns), "nbytes": state bytes, "n_tokens": n or -1}, then n int32 tokens,
then the state bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np

log = logging.getLogger("specq.engine")

MAGIC = b"SPECQKV1"
SUFFIX = ".kv"


def file_name(key: tuple) -> str:
    return hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:40] + SUFFIX


class DiskTier:
    """The directory half of a StateStore (module doc)."""

    def __init__(self, directory: str | os.PathLike, build: str, max_pending_bytes: int = 1 << 30) -> None:
        self.dir = Path(directory).expanduser()
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.build = build
        self.loaded = self.dropped = self.written = self.write_errors = self.skipped = 0
        #: bytes queued for writing; a save beyond max_pending_bytes is not written (the queue holds
        #: the states alive, so a slow disk must not grow memory past the budget)
        self.max_pending = max_pending_bytes
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._writer, name="specq-cache-disk", daemon=True)
        self._thread.start()

    # -- start-up ------------------------------------------------------------------------------------
    def load(self, budget: int) -> Iterator[tuple[tuple, bytes, np.ndarray | None]]:
        """(key, data, tokens) of the newest entries (by when they were stored) whose total fits
        `budget`, oldest of them first (so that inserting them in order leaves the newest most recently
        used). Files of another build and files that do not parse are deleted; files beyond the budget
        too. Headers are read first, so a directory larger than the budget is never read whole."""
        heads = []
        for path in self.dir.glob("*" + SUFFIX):
            try:
                head, off = self._head(path)
                n_tok = int(head["n_tokens"])
                heads.append((int(head["t"]), path, head, off, int(head["nbytes"]) + 4 * max(n_tok, 0)))
            except (OSError, ValueError, KeyError, TypeError) as e:
                self._drop(path, e)
        keep: list[tuple[tuple, bytes, np.ndarray | None]] = []
        used = 0
        for _, path, head, off, size in sorted(heads, key=lambda h: h[0], reverse=True):
            if used + size > budget:  # the entry's bytes, as the store counts them
                self._drop(path, None)
                continue
            try:
                data, tokens = self._body(path, head, off)
            except (OSError, ValueError) as e:
                self._drop(path, e)
                continue
            used += size
            keep.append((tuple(head["key"]), data, tokens))
        self.loaded = len(keep)
        return iter(reversed(keep))

    def _drop(self, path: Path, why: Exception | None) -> None:
        if why is not None:
            log.warning("cache dir: %s dropped (%s)", path.name, why)
        self._unlink(path)
        self.dropped += 1

    def _head(self, path: Path) -> tuple[dict, int]:
        """The header of a file and the offset after it."""
        with open(path, "rb") as f:
            pre = f.read(12)
            if pre[:8] != MAGIC or len(pre) < 12:
                raise ValueError("not a specq cache file")
            (n,) = struct.unpack("<I", pre[8:12])
            head = json.loads(f.read(n))
        if head.get("build") != self.build:
            raise ValueError(f"written by llama.cpp build {head.get('build')!r}, this is {self.build!r}")
        if path.name != file_name(tuple(head["key"])):
            raise ValueError("file name does not match its key")
        return head, 12 + n

    @staticmethod
    def _body(path: Path, head: dict, off: int) -> tuple[bytes, np.ndarray | None]:
        """The state bytes and tokens after a header read by `_head`."""
        raw = path.read_bytes()
        n_tok = int(head["n_tokens"])
        tokens = None
        if n_tok >= 0:
            if len(raw) < off + 4 * n_tok:
                raise ValueError("truncated")
            tokens = np.frombuffer(raw, dtype=np.int32, count=n_tok, offset=off).copy()
            off += 4 * n_tok
        if len(raw) - off != int(head["nbytes"]):
            raise ValueError("truncated")
        return raw[off:], tokens

    # -- while serving -----------------------------------------------------------------------------
    def write(self, key: tuple, data: bytes | np.ndarray, tokens: np.ndarray | None) -> None:
        with self._pending_lock:
            if self._pending + len(data) > self.max_pending:
                self.skipped += 1
                return
            self._pending += len(data)
        self._q.put(("write", key, (time.time_ns(), data), tokens))

    def remove(self, key: tuple) -> None:
        self._q.put(("remove", key, None, None))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued write and removal is done (tests, shutdown)."""
        done = threading.Event()
        self._q.put(("flush", done, None, None))
        done.wait(timeout)

    def _writer(self) -> None:
        while True:
            op, key, data, tokens = self._q.get()
            if op == "flush":
                key.set()
                continue
            path = self.dir / file_name(key)
            if op == "remove":
                self._unlink(path)
                continue
            tmp = path.with_suffix(".tmp")
            stored_ns, data = data
            try:
                head = json.dumps({"key": list(key), "build": self.build, "t": stored_ns, "nbytes": len(data),
                                   "n_tokens": -1 if tokens is None else int(len(tokens))}).encode()
                with open(tmp, "wb") as f:
                    f.write(MAGIC + struct.pack("<I", len(head)) + head)
                    if tokens is not None:
                        f.write(np.asarray(tokens, dtype=np.int32).tobytes())
                    f.write(data)
                os.replace(tmp, path)
                self.written += 1
            except OSError as e:  # a full or read-only disk: the memory cache goes on without it
                self.write_errors += 1
                log.warning("cache dir: could not write %s (%s)", path.name, e)
                self._unlink(tmp)
            finally:
                with self._pending_lock:
                    self._pending -= len(data)

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cache dir: could not delete %s (%s)", path.name, e)

    def summary(self) -> dict:
        return {"dir": str(self.dir), "loaded": self.loaded, "dropped": self.dropped, "written": self.written,
                "write_errors": self.write_errors, "skipped": self.skipped}


__all__ = ["DiskTier", "file_name"]
