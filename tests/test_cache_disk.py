"""SPECQ_CACHE_DIR (engine/cache/disk.py): the caches' saved KV outlive the engine. Tiny random-weight
models on the CPU: a new engine on the same directory hits the speculator window cache and the
target's prompt cache for a document only the old engine saw, with the same kept chunks as the old
engine's own cache hit; another tenant, another llama.cpp build, a torn file or a smaller budget get
nothing they should not."""

from __future__ import annotations

import pytest

from specq.engine.cache.disk import DiskTier, file_name
from specq.engine.options import EngineOptions, RunParams
from specq.engine.cache.speculator import StateStore

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

DOC = "".join(f"line {i}: the value of item_{i} is {(i * 7919) % 1000}; " for i in range(60))
WINDOW = 256


def _engine(tiny_models, cache_dir, cache_bytes=64 << 20):
    from specq.engine.pipeline import Engine

    return Engine(EngineOptions(target=str(tiny_models.target), speculator=str(tiny_models.speculator), n_gpu_layers=0,
                                n_ctx=4096, n_threads=2, cache_bytes=cache_bytes, cache_dir=str(cache_dir),
                                call_tokens=4096, batch_invariant="on"))


def _spec(q: str) -> RunParams:
    return RunParams(question=q, mode="specprefill", min_tokens=0, window=WINDOW, max_tokens=2, keep=0.3, chunk=16)


def test_a_new_engine_hits_what_the_old_one_saved(tiny_models, tmp_path):
    d = tmp_path / "kv"
    old = _engine(tiny_models, d)
    try:
        first = old.run(DOC, _spec("What is item_3?"), scope="team-a")
        assert first.spec.cache["speculator"]["misses"] == first.spec.windows > 0
        again = old.run(DOC, _spec("Which item is largest?"), scope="team-a")  # a memory hit
        assert again.spec.cache["speculator"]["hits"] == again.spec.windows
        old.run(DOC, RunParams(question="Sum items 1 to 4.", mode="baseline", max_tokens=2), scope="team-a")
        old.cache_store.disk.flush(30)
        saved = old.cache_store.summary()
        assert saved["disk"]["written"] == saved["entries"] == len(list(d.glob("*.kv"))) > 0
        assert oct(d.stat().st_mode & 0o777) == "0o700"
    finally:
        old.close()
    new = _engine(tiny_models, d)
    try:
        assert new.cache_store.summary()["entries"] == saved["entries"]
        assert new.cache_store.used == saved["used_bytes"]
        hit = new.run(DOC, _spec("Which item is largest?"), scope="team-a")
        c = hit.spec.cache["speculator"]
        assert c["hits"] == hit.spec.windows and c["misses"] == 0 and c["bytes_restored"] > 0
        assert hit.kept_indices == again.kept_indices  # the same bytes as the old engine's memory hit
        base = new.run(DOC, RunParams(question="Is any value repeated?", mode="baseline", max_tokens=2), scope="team-a")
        assert base.spec.cache["target"]["hit"] and base.spec.cache["bytes_restored"] > 0
        other = new.run(DOC, _spec("Which item is largest?"), scope="team-b")  # another tenant: nothing
        assert other.spec.cache["speculator"]["hits"] == 0
    finally:
        new.close()


def test_the_directory_mirrors_the_budget_and_drops_what_it_cannot_trust(tmp_path):
    d = tmp_path / "kv"
    disk = DiskTier(d, "build-1")
    store = StateStore(3100, disk=disk)
    for i in range(4):  # ~1,000 bytes each: the first is evicted from memory and from the directory
        assert store.put(("ns", "scope", i), bytes([i]) * 1000, tokens=None if i % 2 else [1, 2, 3])
    disk.flush(30)
    assert sorted(p.name for p in d.glob("*.kv")) == sorted(file_name(("ns", "scope", i)) for i in (1, 2, 3))
    # a new store with a smaller budget loads the newest that fit and deletes the rest
    small = StateStore(2100, disk=DiskTier(d, "build-1"))
    assert [e.key for e in small.entries(("ns",))] == [("ns", "scope", 2), ("ns", "scope", 3)]
    e = small.get(("ns", "scope", 2))
    assert e.data == bytes([2]) * 1000 and e.tokens.tolist() == [1, 2, 3]
    assert small.get(("ns", "scope", 3)).tokens is None
    assert len(list(d.glob("*.kv"))) == 2
    # a torn file and a foreign one are dropped; another llama.cpp build's files are not read back
    path = d / file_name(("ns", "scope", 3))
    path.write_bytes(path.read_bytes()[:20])
    (d / "stray.kv").write_bytes(b"hello")
    again = StateStore(1 << 20, disk=DiskTier(d, "build-1"))
    assert [e.key for e in again.entries(("ns",))] == [("ns", "scope", 2)] and again.disk.dropped == 2
    assert StateStore(1 << 20, disk=DiskTier(d, "build-2")).summary()["entries"] == 0
    assert list(d.glob("*.kv")) == []
    # clear() empties the directory too; budget 0 never touches it
    store2 = StateStore(1 << 20, disk=DiskTier(d, "b"))
    store2.put(("k",), b"x" * 10)
    store2.clear()
    store2.disk.flush(30)
    assert list(d.glob("*.kv")) == []
    assert StateStore(0, disk=DiskTier(d, "b")).disk is None
    # a save that would queue more than max_pending_bytes for the writer is skipped, not queued
    slow = DiskTier(d, "b", max_pending_bytes=10)
    slow.write(("big",), b"x" * 20, None)
    slow.flush(30)
    assert slow.skipped == 1 and list(d.glob("*.kv")) == []


def test_file_names_follow_keys():
    assert file_name(("a", 1, True)) != file_name(("a", 1, False))
    assert file_name(("a", 1)).endswith(".kv") and len(file_name(("a", 1))) == 43
