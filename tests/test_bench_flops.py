"""specq/bench/flops.py: the FLOPs of a prefill against hand-computed cases, and the shape read from a
real (tiny, random-weight) GGUF file."""

from __future__ import annotations

import pytest

from specq.bench.flops import ModelShape, measured_peak, prefill_flops, read_shape


def test_prefill_flops_of_two_windows_by_hand():
    # 2 layers, 2 heads of 4 dims, 1,000 matmul weights; 4 tokens as 2 windows of 2 tokens each
    shape = ModelShape(n_layer=2, n_head=2, head_dim=4, matmul_params=1000)
    # matmuls: 2 x 1,000 x 4 tokens = 8,000
    # attention: in each window position 0 sees 1 key and position 1 sees 2: 6 keys in all;
    # 4 (QK^T + AV, 2 FLOPs a multiply-add) x 2 layers x 8 (2 heads x 4 dims) x 6 = 384
    assert prefill_flops(shape, [(0, 2), (0, 2)]) == 8000 + 384
    # one window of the same 4 tokens: keys 1 + 2 + 3 + 4 = 10 -> 4 x 2 x 8 x 10 = 640
    assert prefill_flops(shape, [(0, 4)]) == 8000 + 640
    # its last two positions alone (the first two restored from a cache): 2 tokens seeing 3 and 4 keys
    assert prefill_flops(shape, [(2, 4)]) == 2 * 1000 * 2 + 4 * 2 * 8 * 7
    assert prefill_flops(shape, []) == 0


def test_read_shape_of_the_tiny_speculator(tiny_models):
    shape = read_shape(tiny_models.speculator)
    # the "tiny" Qwen2 shape with 2 layers (specq/testing/synthetic.py): n_embd 128, 4 heads (2 KV) of 32, n_ff 256
    assert (shape.n_layer, shape.n_head, shape.head_dim) == (2, 4, 32)
    d, kv, ff = 128, 2 * 32, 256
    per_layer = d * d + d * kv + d * kv + d * d + 3 * d * ff  # q, k, v, o; gate, up, down (biases, norms left out)
    assert shape.matmul_params == 2 * per_layer
    assert read_shape(tiny_models.target).matmul_params == 4 * per_layer


def test_measured_peak_is_none_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        peak = measured_peak()
        assert peak["tflops"] > 0 and peak["dtype"] == "float16"
    else:
        assert measured_peak() is None
