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


#: float16 scales at the edges of the format: zeros, the smallest subnormal, the largest subnormal,
#: the smallest normal, negatives, and ordinary values
EDGE_SCALES = np.array([0.0, -0.0, 2.0 ** -24, -(2.0 ** -24), 1023 * 2.0 ** -24, 2.0 ** -14, -(2.0 ** -14),
                        3.0e-5, -0.0173, 0.25, -1.5, 7.0], dtype=np.float64)


def edge_q(fmt: str, out: int, n_in: int, rng) -> gb.QTensor:
    """Random codes; every float16 scale drawn from EDGE_SCALES (one value per row, so a row
    whose scale decodes wrongly is off by its whole size)."""
    q = rand_q(fmt, out, n_in, rng)
    _, bs, nb = gb.FORMATS[fmt]
    blocks = q.data.reshape(out, n_in // bs, nb)
    pick = EDGE_SCALES[np.arange(out) % EDGE_SCALES.size].astype("<f2")
    for off in gb._SCALE_OFFSETS[fmt]:
        blocks[:, :, off:off + 2] = np.broadcast_to(pick.view(np.uint8).reshape(out, 1, 2), (out, n_in // bs, 2))
    return q


def within_rounding(got, x, w):
    """``got`` against ``x @ w.T`` in float64, each element within 1e-5 of ``|x| @ |w|.T``
    (float32 rounding of a sum of ~10^3 products is ~1e-6 of that; a wrong weight is far outside)."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64 @ w64.T
    bound = 1e-5 * (np.abs(x64) @ np.abs(w64).T) + 1e-30
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound).all(), f"worst error {float((err / bound).max()):.3g} x the bound"


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_products_with_edge_scales(fmt):
    """One token and a verify lap against gguf-py's values, with subnormal, zero and negative
    float16 scales, at a Llama-like width (3072) and an odd row count (16-row tasks, last one short)."""
    rng = np.random.default_rng(200 + FORMATS.index(fmt))
    q = edge_q(fmt, 75, 3072, rng)
    w = ref(q)
    L = Linear.stored(q)
    for n in (1, 5):
        x = rng.standard_normal((n, 3072)).astype(np.float32)
        within_rounding(L.apply(x), x, w)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_does_not_depend_on_the_rows_beside_it(fmt):
    """Every activation row of a 1-12 row product equals, bit for bit, the same row multiplied
    alone: a verify lap's rows are one-token passes' rows (the kernels share unpacked weights
    between four rows, with each row's sums in the same order)."""
    rng = np.random.default_rng(300 + FORMATS.index(fmt))
    q = rand_q(fmt, 70, 512, rng)
    L = Linear.stored(q)
    x = rng.standard_normal((12, 512)).astype(np.float32)
    alone = np.concatenate([L.apply(x[i:i + 1]) for i in range(12)])
    for n in (2, 4, 5, 9, 12):
        np.testing.assert_array_equal(L.apply(x[:n]), alone[:n])


def test_block_product_refuses_what_does_not_fit():
    from runtime.backends.block_kernels import block_product
    rng = np.random.default_rng(5)
    q = rand_q("q4_1", 8, 64, rng)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    out = np.empty((1, 8), np.float32)
    block_product(x, q.data, out, "q4_1")
    np.testing.assert_allclose(out, x @ ref(q).T, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="do not fit q4_1"):
        block_product(x, q.data[:, :-1].copy(), out, "q4_1")
    with pytest.raises(ValueError, match="do not fit q4_1"):
        block_product(x, q.data, np.empty((1, 7), np.float32), "q4_1")
    with pytest.raises(ValueError, match="float32 x and out"):
        block_product(x.astype(np.float64), q.data, out, "q4_1")
    with pytest.raises(ValueError, match="C-contiguous"):
        block_product(np.asfortranarray(np.repeat(x, 2, axis=0)), q.data, np.empty((2, 8), np.float32), "q4_1")
    with pytest.raises(ValueError, match="unknown block format 'q5_0'"):
        block_product(x, q.data, out, "q5_0")
    with pytest.raises(gb.BlockError, match="multiples of 256"):
        block_product(x, q.data, out, "q4_k")


_INT_HALF_SCRIPT = """
import sys, numpy as np
from runtime.backends import block_kernels as bk
assert not bk.HALF_IN_HARDWARE
d = np.load(sys.argv[1])
out = {}
for fmt in bk.FORMATS:
    o = np.empty((d["x"].shape[0], d[fmt].shape[0]), np.float32)
    out[fmt] = bk.block_product(d["x"], d[fmt], o, fmt)
np.savez(sys.argv[2], **out)
"""


def test_integer_half_decoding_gives_the_same_products(tmp_path):
    """Where the CPU converts float16 scales by instruction (F16C), the products equal, bit for
    bit, those of the integer decoding used elsewhere (both are exact), edge scales included."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from runtime.backends import block_kernels as bk
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 768)).astype(np.float32)
    data = {fmt: edge_q(fmt, 40, 768, rng).data for fmt in bk.FORMATS}
    np.savez(tmp_path / "in.npz", x=x, **data)
    env = dict(os.environ, SPLITROOM_F16C="0", NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", _INT_HALF_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                   check=True, env=env, timeout=600)
    other = np.load(tmp_path / "out.npz")
    for fmt, d in data.items():
        o = np.empty((5, 40), np.float32)
        np.testing.assert_array_equal(bk.block_product(x, d, o, fmt), other[fmt])
