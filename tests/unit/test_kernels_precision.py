"""The streaming matrix kernels and the storage formats of runtime.precision, against
independent references: float64 products, numpy's own float16 conversion, and the Q8_0
rule worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backends.kernels import STREAM_MAX_ROWS, Linear, dequantize_q8, quantize_q8, quantize_rows_q8
from runtime.precision import FLOAT32, Precision, PrecisionError, check_backend


def _w(out=200, inp=96, seed=0):
    return np.random.default_rng(seed).standard_normal((out, inp), dtype=np.float32)


@pytest.mark.parametrize("n", [1, 2, 5, 9, STREAM_MAX_ROWS, STREAM_MAX_ROWS + 4])
def test_f32_rows_match_float64_product(n):
    w = _w()
    x = np.random.default_rng(1).standard_normal((n, 96), dtype=np.float32)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    got = Linear.of(w, "f32").apply(x)
    assert got.dtype == np.float32 and got.shape == (n, 200)
    # float32 sums of 96 terms of size ~1: rounding well under 1e-4
    assert np.abs(got - ref).max() < 1e-4


@pytest.mark.parametrize("kind", ["f32", "f16", "q8"])
def test_streamed_row_agrees_alone_and_in_a_lap(kind):
    """A verify lap's row r (computed four rows to a block, or in the remainder) agrees with a
    one-row pass of that row to float32 rounding of a 128-term sum, and rows in the remainder
    (the same loop as a single row) agree bit for bit."""
    w = _w(300, 128)
    x = np.random.default_rng(2).standard_normal((7, 128), dtype=np.float32)
    lin = Linear.of(w, kind)
    many = lin.apply(x)
    for r in range(7):
        alone = lin.apply(x[r:r + 1])[0]
        assert np.abs(alone - many[r]).max() <= 1e-5 * np.abs(many[r]).max()
        if r >= 4:
            assert np.array_equal(alone, many[r])


def test_f16_widening_equals_numpy_including_subnormals():
    w = _w(64, 64)
    w[0, :8] = [6e-8, -6e-8, 3e-5, -1e-6, 0.0, -0.0, 65504.0, -2.0 ** -24]  # subnormals, zeros, max
    lin = Linear.of(w, "f16")
    want = w.astype(np.float16).astype(np.float64)
    x = np.eye(64, dtype=np.float32)[:8]  # picks columns 0..7 of every row
    got = lin.apply(x)
    assert np.array_equal(got.astype(np.float64), want[:, :8].T)
    assert np.array_equal(lin.dense(), want.astype(np.float32))


def test_q8_quantizes_rows_by_max_over_127_by_hand():
    w = np.zeros((2, 64), np.float32)
    w[0] = np.linspace(-1.0, 0.5, 64)      # row 0: max |x| = 1.0 -> scale 1/127
    q, s = quantize_rows_q8(w)             # row 1: all zero -> scale 0, q 0
    assert s.shape == (2,) and np.isclose(s[0], 1.0 / 127) and s[1] == 0
    assert q[0, 0] == -127 and q[0, 63] == round(0.5 * 127)
    assert not q[1].any()
    back = dequantize_q8(q, s)
    assert np.abs(back - w).max() <= 0.5 / 127 + 1e-7  # at most half a step
    qb, sb = quantize_q8(w)  # the block layout: the same values, each row's scale per 32
    assert np.array_equal(qb, q) and sb.shape == (2, 2) and (sb == s[:, None]).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8(np.ones((2, 40), np.float32))


def test_q8_product_equals_dequantized_float64_product():
    w = _w(150, 128)
    x = np.random.default_rng(3).standard_normal((5, 128), dtype=np.float32)
    lin = Linear.of(w, "q8")
    ref = x.astype(np.float64) @ dequantize_q8(lin.q, lin.scale).astype(np.float64).T
    assert np.abs(lin.apply(x) - ref).max() < 1e-4
    assert lin.nbytes == 150 * 128 + 150 * 4  # int8 plus one float32 per row


@pytest.mark.parametrize("kind", ["f32", "f16", "q8"])
def test_rows_are_the_stored_matrix_rows(kind):
    w = _w(50, 64)
    lin = Linear.of(w, kind)
    ids = np.array([3, 0, 49])
    assert np.array_equal(lin.rows(ids), lin.dense()[ids])


def test_precision_choices_and_backend_refusal():
    assert FLOAT32.is_reference and Precision.from_json(None) == FLOAT32
    p = Precision("q8", "f16", "f16")
    assert Precision.from_json(p.to_json()) == p
    with pytest.raises(PrecisionError, match="weights must be one of"):
        Precision("q4")
    with pytest.raises(PrecisionError, match="unknown precision keys"):
        Precision.from_json({"weight": "f16"})
    check_backend("numpy", p)
    check_backend("wgpu", Precision("q8"))  # f16/q8 weights: runtime/backends/wgsl.py weight_decl
    check_backend("wgpu", Precision("f16", "f32", "f16"))
    with pytest.raises(PrecisionError, match="wgpu backend keeps the KV cache as f32 only"):
        check_backend("wgpu", Precision(kv="f16"))


def test_float16_frames_carry_half_the_bytes_and_round_like_numpy():
    from planner.frames import HEADER_BYTES, DType, FrameHeader, FrameKind
    from runtime.codec import decode_frame, encode_frame

    x = np.random.default_rng(4).standard_normal((5, 576), dtype=np.float32) * 30
    x[0, 0] = 1e6  # beyond float16: inf on the wire, for the receiver's numerical check
    h16 = FrameHeader(FrameKind.DECODE, 1, 2, 3, 5, 576, DType.FLOAT16)
    h32 = FrameHeader(FrameKind.DECODE, 1, 2, 3, 5, 576, DType.FLOAT32)
    b16, b32 = encode_frame(h16, x), encode_frame(h32, x)
    assert len(b16) - HEADER_BYTES == (len(b32) - HEADER_BYTES) // 2 == 5 * 576 * 2
    h, y = decode_frame(b16)
    assert h == h16 and y.dtype == np.float32
    assert np.isinf(y[0, 0])
    assert np.array_equal(y.ravel()[1:], x.ravel()[1:].astype(np.float16).astype(np.float32))
    assert np.array_equal(decode_frame(b32)[1], x)


def test_q8_bits_bound_what_smollm2_layers_hold():
    """9 bits per weight is at least what either backend's q8 stores for SmolLM2's matrices."""
    shapes = [(576 + 2 * 192, 576), (576, 576), (2 * 1536, 576), (576, 1536), (49152, 576)]
    for out_f, in_f in shapes:
        held = Linear.of(np.ones((out_f, in_f), np.float32), "q8").nbytes
        q, s = quantize_q8(np.ones((out_f, in_f), np.float32))  # the wgpu backend's layout
        assert held * 8 <= (q.nbytes + s.nbytes) * 8 <= 9 * out_f * in_f


def test_scenario_precision_keys_count_what_the_runtime_stores():
    """Bytes per layer, KV bytes and hop bytes from the scenario's weights, kv_cache and
    residual, worked out from SmolLM2-135M's shape by hand."""
    from planner.frames import DType
    from planner.scheduler import SchedulerConfig
    from runtime.precision import KV_BYTES, WEIGHT_BITS
    from splitroom.scenario import RESIDUAL_BYTES, WEIGHTS_BITS, load

    assert WEIGHTS_BITS == WEIGHT_BITS  # the planner's table is the runtime's
    params = 2 * 576 + 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536  # norms, q/o, k/v, gate/up/down
    for weights, bits in (("f32", 32), ("f16", 16), ("q8", 9)):
        s = load("scenarios/home.yaml", [f"weights={weights}"])
        assert s.model.layer_bytes == int(np.ceil(params * bits / 8))
        assert s.model.embedding_bytes == int(np.ceil(49152 * 576 * bits / 8))
        assert s.weights == weights
    kv_token = 2 * 3 * 64  # K and V, 3 KV heads of 64
    for kv in ("f32", "f16"):
        s = load("scenarios/home.yaml", [f"kv_cache={kv}"])
        assert s.model.kv_bytes(2048, s.options.kv_cache) == 2048 * kv_token * KV_BYTES[kv]
    for res, dt in (("f32", DType.FLOAT32), ("f16", DType.FLOAT16)):
        s = load("scenarios/home.yaml", [f"residual={res}"])
        assert s.model.residual_bytes_per_token == 576 * RESIDUAL_BYTES[res]
        assert SchedulerConfig.from_scenario(s).dtype == dt



def test_run_real_carries_the_scenarios_precision_to_every_device():
    from pathlib import Path

    from planner.deal import deal
    from runtime.control import NodeConfig
    from runtime.weights import ensure_safetensors
    from splitroom.real_configs import node_configs
    from splitroom.real_errors import RealRunError
    from splitroom.scenario import load

    md = str(ensure_safetensors())
    s = load("scenarios/home.yaml", ["weights=q8", "residual=f16"])
    d = deal(s.devices, s.model, s.options)
    for c in node_configs(s, d, md, Path("/tmp"), "numpy"):
        back = NodeConfig.model_validate_json(c.model_dump_json())  # as a device process reads it
        assert back.precision() == Precision("q8", "f16", "f16")   # home.yaml says kv_cache: f16
    with pytest.raises(RealRunError, match="kv_cache q8 is not stored"):
        node_configs(load("scenarios/home.yaml", ["kv_cache=q8"]), d, md, Path("/tmp"), "numpy")
    with pytest.raises(RealRunError, match="wgpu backend"):
        node_configs(s, d, md, Path("/tmp"), "wgpu")  # wgpu keeps KV in f32
