"""specq.testing.synthetic: random-weight Qwen2 GGUFs, read back by gguf and run by real llama.cpp."""

from __future__ import annotations

# llama_cpp before numpy (conftest already did this; repeated so the module stands alone)
try:
    import llama_cpp
except Exception:  # pragma: no cover - only while the patched build is being installed
    llama_cpp = None

import ctypes
import math
import subprocess
import sys
import tarfile
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from specq.testing import synthetic
from specq.testing.synthetic import SHAPES, Qwen2Shape, bytes_to_unicode, read_hparams, write_qwen2_gguf

#: engine tests: counted by .ci/check_suites.py (a run where all of them skipped fails CI)
pytestmark = [pytest.mark.engine]

needs_llama = pytest.mark.skipif(llama_cpp is None, reason="llama_cpp (our patched build) is not installed")

SDIST = Path.home() / ".cache" / "specq" / "src" / "llama_cpp_python-0.3.36.tar.gz"
QWEN2_VOCAB_MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf"


# ---------------------------------------------------------------------------------------------------
# shapes and file layout (gguf only)


def test_shapes_are_the_real_qwen25_hyperparameters():
    expect = {
        "0.5b": (24, 896, 14, 2, 4864, True),
        "1.5b": (28, 1536, 12, 2, 8960, True),
        "7b": (28, 3584, 28, 4, 18944, False),
        "14b": (48, 5120, 40, 8, 13824, False),
    }
    for name, (n_layer, n_embd, n_head, n_head_kv, n_ff, tied) in expect.items():
        s = SHAPES[name]
        assert (s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.n_ff, s.tie_embeddings) == (
            n_layer, n_embd, n_head, n_head_kv, n_ff, tied), name
    for s in SHAPES.values():
        assert (s.n_ctx, s.rope_theta, s.rms_eps) == (32768, 1e6, 1e-6)
        s.validate()
    tiny = SHAPES["tiny"]
    assert tiny.head_dim == 32 and tiny.n_head == 4 and tiny.n_head_kv == 2 and 2 <= tiny.n_layer <= 4


@pytest.mark.parametrize("shape, n_params", [("0.5b", 0.494e9), ("1.5b", 1.54e9), ("7b", 7.62e9), ("14b", 14.77e9)])
def test_parameter_counts_match_published_models(shape, n_params):
    # with Qwen2.5's 152064-row embedding the plans have the published parameter counts (not written)
    n = synthetic.estimate_bytes(shape, n_vocab=152064, dtype="f16") / 2
    assert abs(n - n_params) / n_params < 0.01, (shape, n)


def test_bad_overrides_are_refused(tmp_path):
    with pytest.raises(ValueError, match="multiple of n_head"):
        write_qwen2_gguf(tmp_path / "x.gguf", "tiny", n_embd=100, n_head=3)
    with pytest.raises(ValueError, match="n_head_kv"):
        write_qwen2_gguf(tmp_path / "x.gguf", "tiny", n_head_kv=3)
    with pytest.raises(ValueError, match="unknown shape override"):
        write_qwen2_gguf(tmp_path / "x.gguf", "tiny", n_layers=2)
    with pytest.raises(ValueError, match="unknown shape"):
        write_qwen2_gguf(tmp_path / "x.gguf", "3b")
    with pytest.raises(ValueError, match="vocab"):
        write_qwen2_gguf(tmp_path / "x.gguf", "tiny", vocab=str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="dtype"):
        write_qwen2_gguf(tmp_path / "x.gguf", "tiny", dtype="q4_0")
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_tiny_models_read_back_with_gguf_reader(tiny_models):
    from gguf import GGUFReader

    for path, n_layer in ((tiny_models.target, 4), (tiny_models.speculator, 2)):
        h = read_hparams(path)
        assert h["architecture"] == "qwen2"
        assert (h["n_layer"], h["n_embd"], h["n_head"], h["n_head_kv"], h["n_ff"], h["n_ctx"]) == (
            n_layer, 128, 4, 2, 256, 32768)
        assert h["rope_theta"] == 1e6 and math.isclose(h["rms_eps"], 1e-6, rel_tol=1e-6)
        assert h["tokenizer_model"] == "gpt2" and h["tokenizer_pre"] == "qwen2" and h["add_bos_token"] is False
        assert "<|im_start|>" in h["chat_template"]

        reader = GGUFReader(path)  # gguf's own reader agrees with our header parser
        assert reader.fields["qwen2.block_count"].contents() == n_layer
        assert {t.name for t in reader.tensors} == set(h["tensors"])
        assert len(reader.tensors) == 2 + 12 * n_layer  # tied embeddings: no output.weight
        tensors = {t.name: t for t in reader.tensors}
        assert tuple(tensors["blk.0.attn_k.weight"].shape) == (128, 64)
        assert tuple(tensors["blk.0.attn_k.bias"].shape) == (64,)
        assert tuple(tensors["blk.0.ffn_down.weight"].shape) == (256, 128)
        assert tensors["token_embd.weight"].tensor_type.name == "F16"
        assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
        np.testing.assert_array_equal(tensors["blk.0.ffn_norm.weight"].data, 1.0)
        # tied embeddings (std 0.02): the final norm's gain brings the logits to std ~3
        np.testing.assert_allclose(tensors["output_norm.weight"].data, 3.0 / (0.02 * math.sqrt(128)), rtol=1e-6)
        q = np.asarray(tensors["blk.1.attn_q.weight"].data, dtype=np.float32)
        assert np.isfinite(q).all() and abs(q.std() * math.sqrt(128) - 1.0) < 0.05
        emb = np.asarray(tensors["token_embd.weight"].data, dtype=np.float32)
        assert np.isfinite(emb).all() and len(np.unique(emb)) > 100

    # same seed: the speculator's tensors are the target's first layers
    t = {x.name: x for x in GGUFReader(tiny_models.target).tensors}
    s = {x.name: x for x in GGUFReader(tiny_models.speculator).tensors}
    for name in ("token_embd.weight", "blk.1.attn_q.weight", "blk.1.ffn_gate.weight"):
        np.testing.assert_array_equal(t[name].data, s[name].data)


def test_byte_vocabularies(tiny_models):
    b2u = bytes_to_unicode()
    assert len(set(b2u.values())) == 256 and b2u[ord("A")] == "A" and b2u[ord(" ")] == "Ġ"
    kvs = {kv.key: kv.value for kv in synthetic.vocab_kvs("bytes")}
    tokens = kvs["tokenizer.ggml.tokens"]
    assert tokens[:256] == [b2u[b] for b in range(256)]
    assert tokens[-3:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert kvs["tokenizer.ggml.token_type"][-3:] == [3, 3, 3]
    assert kvs["tokenizer.ggml.eos_token_id"] == tokens.index("<|im_end|>") == kvs["tokenizer.ggml.eot_token_id"]
    assert kvs["tokenizer.ggml.merges"] and all(m.replace(" ", "") in tokens for m in kvs["tokenizer.ggml.merges"])
    alt = {kv.key: kv.value for kv in synthetic.vocab_kvs("bytes-alt")}
    assert len(alt["tokenizer.ggml.tokens"]) != len(tokens)
    assert alt["tokenizer.ggml.eos_token_id"] != kvs["tokenizer.ggml.eos_token_id"]
    assert read_hparams(tiny_models.mismatched)["n_vocab"] == len(alt["tokenizer.ggml.tokens"])
    assert read_hparams(tiny_models.target)["n_vocab"] == len(tokens)


def test_seed_determinism_and_dtype(tmp_path):
    a = write_qwen2_gguf(tmp_path / "a.gguf", "tiny", seed=7, n_layer=2).read_bytes()
    b = write_qwen2_gguf(tmp_path / "b.gguf", "tiny", seed=7, n_layer=2).read_bytes()
    c = write_qwen2_gguf(tmp_path / "c.gguf", "tiny", seed=8, n_layer=2).read_bytes()
    assert a == b and a != c
    f32 = write_qwen2_gguf(tmp_path / "f32.gguf", "tiny", seed=7, n_layer=2, dtype="f32")
    h = read_hparams(f32)
    assert h["tensors"]["blk.0.ffn_up.weight"][1] == "F32"
    assert f32.stat().st_size > len(a) * 1.5


def test_streaming_is_chunk_independent_and_bounded(tmp_path, monkeypatch):
    whole = write_qwen2_gguf(tmp_path / "whole.gguf", "0.5b", seed=3, n_layer=1).read_bytes()
    monkeypatch.setattr(synthetic, "_CHUNK_ELEMS", 1 << 16)
    tracemalloc.start()
    try:
        streamed = write_qwen2_gguf(tmp_path / "streamed.gguf", "0.5b", seed=3, n_layer=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert streamed.read_bytes() == whole
    # the largest tensor (ffn, 4864x896 f16) is 8.7 MB; chunks of 64k elements keep the peak far below it
    assert peak < 4 * 2**20, peak


def test_half_b_shape_with_one_layer_reads_back(tmp_path):
    path = write_qwen2_gguf(tmp_path / "half.gguf", "0.5b", seed=1, n_layer=1)
    h = read_hparams(path)
    assert (h["n_layer"], h["n_embd"], h["n_head"], h["n_head_kv"], h["n_ff"]) == (1, 896, 14, 2, 4864)
    assert (h["n_ctx"], h["rope_theta"]) == (32768, 1e6) and math.isclose(h["rms_eps"], 1e-6, rel_tol=1e-6)
    t = h["tensors"]
    assert t["blk.0.attn_q.weight"][0] == (896, 896)
    assert t["blk.0.attn_k.weight"][0] == (896, 128)  # 2 kv heads x head_dim 64
    assert t["blk.0.attn_v.bias"][0] == (128,)
    assert t["blk.0.ffn_gate.weight"][0] == (896, 4864)
    assert t["blk.0.ffn_down.weight"][0] == (4864, 896)
    assert "output.weight" not in t
    assert h["synthetic"] == {"shape": "0.5b", "vocab": "bytes", "seed": 1}
    big = write_qwen2_gguf(tmp_path / "untied.gguf", "7b", seed=1, n_layer=1, n_embd=256, n_head=2,
                           n_head_kv=1, n_ff=512)
    hb = read_hparams(big)
    assert hb["tie_embeddings"] is False and hb["tensors"]["output.weight"][0] == (256, hb["n_vocab"])


def test_cli_writes_a_model(tmp_path):
    out = tmp_path / "cli.gguf"
    proc = subprocess.run(
        [sys.executable, "-m", "specq.testing.synthetic", "--shape", "tiny", "--out", str(out), "--seed", "5",
         "--n-layer", "2", "--vocab", "bytes-alt"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout
    h = read_hparams(out)
    assert h["n_layer"] == 2 and h["synthetic"] == {"shape": "tiny", "vocab": "bytes-alt", "seed": 5}
    bad = subprocess.run([sys.executable, "-m", "specq.testing.synthetic", "--out", str(tmp_path / "bad.gguf"),
                          "--n-head", "3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "n_head" in bad.stderr


# ---------------------------------------------------------------------------------------------------
# real llama.cpp


@contextmanager
def loaded(path: Path, n_ctx: int = 256):
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    assert model, f"llama.cpp could not load {path}"
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_ctx
    cparams.n_ubatch = n_ctx
    cparams.n_threads = 2
    cparams.n_threads_batch = 2
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    assert ctx, "llama.cpp could not create a context"
    try:
        yield model, ctx
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def tokenize(model, text: str, parse_special: bool = False) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(model)
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), True, parse_special)
    assert n >= 0
    return list(buf[:n])


def piece(model, token: int) -> bytes:
    vocab = llama_cpp.llama_model_get_vocab(model)
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    assert n >= 0
    return buf.raw[:n]


def last_logits(model, ctx, tokens: list[int]) -> np.ndarray:
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    arr = (llama_cpp.llama_token * len(tokens))(*tokens)
    rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
    assert rc == 0
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()


def greedy(model, ctx, tokens: list[int], n: int) -> list[int]:
    out: list[int] = []
    logits = last_logits(model, ctx, tokens)
    pos = len(tokens)
    n_vocab = logits.shape[0]
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        arr = (llama_cpp.llama_token * 1)(tok)
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, 1)) == 0
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        pos += 1
    return out


@needs_llama
def test_llama_loads_tiny_models_with_their_shapes(tiny_models):
    for path, n_layer in ((tiny_models.target, 4), (tiny_models.speculator, 2), (tiny_models.mismatched, 2)):
        with loaded(path) as (model, _ctx):
            assert llama_cpp.llama_model_n_layer(model) == n_layer
            assert llama_cpp.llama_model_n_embd(model) == 128
            assert llama_cpp.llama_model_n_head(model) == 4
            assert llama_cpp.llama_model_n_head_kv(model) == 2
            assert llama_cpp.llama_model_n_ctx_train(model) == 32768
            vocab = llama_cpp.llama_model_get_vocab(model)
            assert llama_cpp.llama_vocab_n_tokens(vocab) == read_hparams(path)["n_vocab"]
            assert llama_cpp.llama_vocab_get_add_bos(vocab) is False
            assert piece(model, llama_cpp.llama_vocab_eos(vocab)) == b"<|im_end|>"
            assert piece(model, llama_cpp.llama_vocab_eot(vocab)) == b"<|im_end|>"
            arch = ctypes.create_string_buffer(64)
            assert llama_cpp.llama_model_meta_val_str(model, b"general.architecture", arch, 64) > 0
            assert arch.value == b"qwen2"


@needs_llama
def test_llama_tokenizes_bytes_and_special_tokens(tiny_models):
    with loaded(tiny_models.target) as (model, _ctx):
        ids = tokenize(model, "hello")
        assert b"".join(piece(model, t) for t in ids) == b"hello"
        assert len(ids) < 5  # the "he" and "ll" merges applied
        assert all(t < 256 or piece(model, t) in (b"he", b"ll") for t in ids)
        text = "héllo wörld ✓ 123\n\tz"
        ids = tokenize(model, text)
        assert b"".join(piece(model, t) for t in ids) == text.encode()
        assert ids[-1] == ord("z")  # byte tokens: id == byte value
        assert [t for t in ids if t < 256 and t >= 0x80]  # UTF-8 continuation bytes as tokens
        special = tokenize(model, "<|im_start|>user\nhi<|im_end|>", parse_special=True)
        vocab = llama_cpp.llama_model_get_vocab(model)
        assert special[0] == 256 + len(synthetic._BYTES_MERGES) + 1
        assert special[-1] == llama_cpp.llama_vocab_eos(vocab)
        assert llama_cpp.llama_vocab_is_control(vocab, special[0])


@needs_llama
def test_llama_renders_the_chat_template(tiny_models):
    with loaded(tiny_models.target) as (model, _ctx):
        tmpl = llama_cpp.llama_model_chat_template(model, None)
        assert tmpl and b"<|im_start|>" in tmpl
        msgs = (llama_cpp.llama_chat_message * 2)(
            llama_cpp.llama_chat_message(b"system", b"Be brief."),
            llama_cpp.llama_chat_message(b"user", b"hello"),
        )
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_chat_apply_template(tmpl, msgs, 2, True, buf, len(buf))
        assert 0 < n < len(buf)
        assert buf.raw[:n].decode() == (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")


@needs_llama
def test_llama_decodes_with_finite_input_dependent_logits(tiny_models):
    prompts = ["hello", "world", "The quick brown fox", "12345 67890", "<|im_start|>user\nhi<|im_end|>\n"]
    with loaded(tiny_models.target) as (model, ctx):
        firsts, outputs = [], []
        for p in prompts:
            toks = tokenize(model, p, parse_special=True)
            logits = last_logits(model, ctx, toks)
            assert np.isfinite(logits).all()
            assert logits.std() > 0.5  # far from constant
            firsts.append(int(np.argmax(logits)))
            outputs.append(tuple(greedy(model, ctx, toks, 6)))
        assert len(set(firsts)) >= 2, firsts  # greedy outputs vary with the input
        assert len(set(outputs)) >= 3, outputs
        again = tokenize(model, prompts[2], parse_special=True)
        np.testing.assert_array_equal(last_logits(model, ctx, again),
                                      last_logits(model, ctx, again))  # deterministic
        target_logits = last_logits(model, ctx, again)
    with loaded(tiny_models.speculator) as (model, ctx):
        spec_logits = last_logits(model, ctx, again)
        assert np.isfinite(spec_logits).all() and not np.allclose(spec_logits, target_logits)


@needs_llama
def test_speculator_agrees_with_target_sometimes(tiny_models):
    # teacher-forced greedy agreement, what speculative decoding's acceptance rate measures: the
    # speculator shares the target's first layers, so it agrees often but not always
    prompts = ["hello", "world", "The quick brown fox", "12345 67890", "def f(x): return x"]
    paths = []
    with loaded(tiny_models.target) as (model, ctx):
        for p in prompts:
            toks = tokenize(model, p)
            paths.append((toks, greedy(model, ctx, toks, 8)))
    hits = total = 0
    with loaded(tiny_models.speculator) as (model, ctx):
        for toks, out in paths:
            for i, want in enumerate(out):
                hits += int(np.argmax(last_logits(model, ctx, toks + out[:i]))) == want
                total += 1
    assert 0.1 < hits / total < 0.95, (hits, total)


def _extract_from_sdist(member: str, dest: Path) -> Path:
    if not SDIST.is_file():
        pytest.skip(f"{SDIST} is not there (the llama-cpp-python sdist that holds llama.cpp's vocab files)")
    out = dest / Path(member).name
    if not out.exists():
        with tarfile.open(SDIST, "r:gz") as tar:
            f = tar.extractfile(member)
            assert f is not None, member
            out.write_bytes(f.read())
    return out


@pytest.fixture(scope="module")
def qwen2_vocab_dir(tmp_path_factory):
    dest = tmp_path_factory.mktemp("qwen2_vocab")
    for suffix in ("", ".inp", ".out"):
        _extract_from_sdist(QWEN2_VOCAB_MEMBER + suffix, dest)
    return dest


def test_vocab_copied_from_a_gguf(qwen2_vocab_dir, tmp_path):
    src = qwen2_vocab_dir / "ggml-vocab-qwen2.gguf"
    path = write_qwen2_gguf(tmp_path / "q2.gguf", "tiny", vocab=src, n_layer=1)
    h = read_hparams(path)
    assert h["n_vocab"] == 151936 and h["tokenizer_pre"] == "qwen2" and h["eos_token_id"] == 151643
    assert h["tensors"]["token_embd.weight"][0] == (128, 151936)
    copied = {kv.key: kv.value for kv in synthetic._read_gguf_header(path, "tokenizer.")[0]}
    original = {kv.key: kv.value for kv in synthetic._read_gguf_header(src, "tokenizer.")[0]}
    for key, value in original.items():
        assert copied[key] == value, key
    if llama_cpp is None:
        return
    # real Qwen2 tokenization, checked against llama.cpp's own expected outputs for this vocab
    # the format test-tokenizer-0 reads: inputs separated by a marker line, one output line per input
    texts = (qwen2_vocab_dir / "ggml-vocab-qwen2.gguf.inp").read_bytes().decode().split("\n__ggml_vocab_test__\n")
    expected = (qwen2_vocab_dir / "ggml-vocab-qwen2.gguf.out").read_bytes().decode().split("\n")
    with loaded(path) as (model, ctx):
        checked = 0
        for text, ids in zip(texts, expected):
            if not text.strip() or len(text) > 200:
                continue
            assert tokenize(model, text) == [int(x) for x in ids.split()], text
            checked += 1
        assert checked >= 10
        logits = last_logits(model, ctx, tokenize(model, "Hello world"))
        assert logits.shape == (151936,) and np.isfinite(logits).all()
