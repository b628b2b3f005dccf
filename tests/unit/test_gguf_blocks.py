"""GGUF blocks held as stored (runtime/gguf_blocks.py, the numpy kernels in runtime/backends/kernels.py):
every format against gguf-py's own ``gguf.quants.dequantize`` on random blocks, products against
float64 references, whole stages against float32 stages built from gguf-py's dequantized values,
and bad or truncated data refused with one line."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from runtime import gguf_blocks as gb  # noqa: E402
from runtime.backends.kernels import Linear  # noqa: E402

FORMATS = tuple(gb.FORMATS)


def rand_q(fmt: str, out: int, n_in: int, rng) -> gb.QTensor:
    """Random bytes in every field, float16 scales random finite values in +-0.05."""
    _, bs, nb = gb.FORMATS[fmt]
    data = rng.integers(0, 256, size=(out * n_in // bs, nb), dtype=np.uint8)
    for off in gb._SCALE_OFFSETS[fmt]:
        data[:, off:off + 2] = rng.uniform(-0.05, 0.05, size=(data.shape[0], 1)).astype("<f2").view(np.uint8)
    return gb.QTensor(fmt, (out, n_in), data.reshape(out, -1))


def ref(q: gb.QTensor) -> np.ndarray:
    return gguf.quants.dequantize(q.data, gguf.GGMLQuantizationType(gb.FORMATS[q.fmt][0]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_matches_gguf_py(fmt):
    rng = np.random.default_rng(FORMATS.index(fmt))
    q = rand_q(fmt, 48, 512, rng)
    want = ref(q)
    assert want.shape == (48, 512)
    np.testing.assert_array_equal(gb.dequantize(q), want)  # numpy reference: bit for bit
    L = Linear.stored(q)
    assert L.nbytes == q.data.nbytes == 48 * 512 // gb.FORMATS[fmt][1] * gb.FORMATS[fmt][2]
    np.testing.assert_array_equal(L.dense(), want)  # the compiled widening: bit for bit
    ids = np.array([5, 0, 47, 5])
    np.testing.assert_array_equal(L.rows(ids), want[ids])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 5, 13, 40])
def test_products_match_float64(fmt, n):
    """Decode rows (streamed) and prefill rows (widened in chunks, BLAS) against float64 of gguf-py's values."""
    rng = np.random.default_rng(100 + n)
    q = rand_q(fmt, 1100, 768, rng)
    x = rng.standard_normal((n, 768)).astype(np.float32)
    want = x.astype(np.float64) @ ref(q).astype(np.float64).T
    from runtime.backends import kernels
    mp = pytest.MonkeyPatch()
    mp.setattr(kernels, "_WIDEN_CHUNK_VALUES", 300 * 768)  # several widening chunks, the last one short
    try:
        got = Linear.stored(q).apply(x)
    finally:
        mp.undo()
    assert got.dtype == np.float32 and got.shape == (n, 1100)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_concat_mixed_formats():
    """Q4_K_M mixes formats inside one fused QKV: parts kept apart, outputs in row order."""
    rng = np.random.default_rng(7)
    parts = [rand_q("q4_k", 64, 256, rng), rand_q("q4_k", 32, 256, rng), rand_q("q6_k", 32, 256, rng)]
    L = Linear.concat([Linear.stored(p) for p in parts])
    assert L.kind == "parts" and L.shape == (128, 256)
    assert L.nbytes == sum(p.data.nbytes for p in parts)
    same = Linear.concat([Linear.stored(p) for p in parts[:2]])
    assert same.kind == "q4_k" and same.nbytes == parts[0].data.nbytes + parts[1].data.nbytes
    w = np.concatenate([ref(p) for p in parts]).astype(np.float64)
    for n in (1, 20):
        x = rng.standard_normal((n, 256)).astype(np.float32)
        np.testing.assert_allclose(L.apply(x), x @ w.T, rtol=0, atol=2e-5 * np.abs(x @ w.T).max())


@pytest.mark.parametrize("fmt", FORMATS)
def test_non_finite_scale_is_one_line(fmt):
    rng = np.random.default_rng(3)
    q = rand_q(fmt, 4, 512, rng)
    gb.check_blocks(q, "blk.0.attn_q.weight")
    nb = gb.FORMATS[fmt][2]
    off = gb._SCALE_OFFSETS[fmt][-1]
    flat = q.data.reshape(-1, nb)
    flat[5, off:off + 2] = np.array([np.inf], "<f2").view(np.uint8)
    with pytest.raises(gb.BlockError, match=r"^blk\.0\.attn_q\.weight: .* block 5 has a non-finite scale$"):
        gb.check_blocks(q, "blk.0.attn_q.weight")


def test_wrong_sizes_are_one_line(tmp_path):
    q = gb.QTensor("q4_1", (4, 64), np.zeros((4, 39), np.uint8))
    with pytest.raises(gb.BlockError, match=r"\[4, 40\] bytes are needed"):
        gb.check_blocks(q)
    with pytest.raises(gb.BlockError, match="multiples of 256"):
        gb.row_bytes("q4_k", 96)
    f = tmp_path / "t.bin"
    f.write_bytes(b"\0" * 100)
    info = gb.TensorInfo("blk.0.ffn_up.weight", 3, (4, 64), 40, 160)
    import os
    fd = os.open(f, os.O_RDONLY)
    try:
        with pytest.raises(gb.BlockError, match="ends inside this tensor"):
            gb.read_tensor(fd, info, 100)
        with pytest.raises(gb.BlockError, match="where its type and shape need 160"):
            gb.read_tensor(fd, gb.TensorInfo("x", 3, (4, 64), 0, 150), 100)
        with pytest.raises(gb.BlockError, match="GGML type 13 is not held natively"):
            gb.read_tensor(fd, gb.TensorInfo("x", 13, (4, 256), 0, 10), 100)
    finally:
        os.close(fd)
