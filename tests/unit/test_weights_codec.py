"""runtime.weights_codec: the packed wire form of float32 weights dequantized from
4-bit blocks. The reference is gguf-py's own Q4_1 quantize and dequantize; sizes are
computed by hand from the layout in the module doc."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.weights_codec import PackError, pack, unpack


def q4_1(shape, seed=0):
    """float32 weights as a Q4_1 GGUF holds them once dequantized (gguf-py's code)."""
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return dequantize(quantize(a, GGMLQuantizationType.Q4_1), GGMLQuantizationType.Q4_1).astype(np.float32)


def packed_size(blocks, raw_blocks=0, tail=0):
    # 32-byte header, a bit per block, 24 bytes a packed block, 128 a raw one, 4 a tail value
    return 32 + (blocks + 7) // 8 + 24 * (blocks - raw_blocks) + 128 * raw_blocks + 4 * tail


def test_q4_1_weights_pack_to_24_bytes_a_block_and_come_back_bit_for_bit():
    w = q4_1((192, 576))
    p = pack(w)
    assert p is not None and len(p) == packed_size(192 * 576 // 32)
    assert unpack(p, w.size) == w.tobytes()
    assert w.nbytes / len(p) > 5.3


def test_weights_without_that_form_are_not_packed():
    assert pack(np.random.default_rng(1).standard_normal((64, 576)).astype(np.float32)) is None
    assert pack(np.zeros(16, dtype=np.float32)) is None  # not one whole block
    with pytest.raises(TypeError):
        pack(np.zeros(64, dtype=np.float16))


def test_blocks_that_do_not_fit_travel_raw_beside_those_that_do():
    w = q4_1((8, 576)).reshape(-1)
    noise = np.random.default_rng(2).standard_normal(w.size).astype(np.float32)
    raw = [3, 40, 41, 100]  # blocks replaced by noise
    for b in raw:
        w[b * 32:(b + 1) * 32] = noise[b * 32:(b + 1) * 32]
    w = np.concatenate([w, noise[:7]])  # and a tail of 7 values
    p = pack(w)
    assert p is not None and len(p) == packed_size(8 * 576 // 32, len(raw), 7)
    assert unpack(p, w.size) == w.tobytes()


def test_special_values_are_kept_exactly():
    w = q4_1((2, 64))
    w[0, :32] = 0.0
    w[0, 32:64] = -0.0  # the sign of zero is a bit: kept
    w[1, 0] = np.nan
    w[1, 40] = np.inf
    p = pack(w)
    assert p is not None and unpack(p, w.size) == w.tobytes()


@pytest.mark.parametrize("cut", [0, 10, 31, 33])
def test_a_truncated_or_padded_form_is_refused(cut):
    w = q4_1((4, 64))
    p = pack(w)
    with pytest.raises(PackError):
        unpack(p[:len(p) - cut] if cut else p + b"\0", w.size)
    with pytest.raises(PackError, match="expected"):
        unpack(p, w.size + 1)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_mutated_packed_form_unpacks_to_the_right_length_or_is_refused(data):
    w = q4_1((2, 96), seed=3)
    p = bytearray(pack(w))
    for _ in range(data.draw(st.integers(1, 4))):
        p[data.draw(st.integers(0, len(p) - 1))] = data.draw(st.integers(0, 255))
    try:
        out = unpack(bytes(p), w.size)
    except PackError:
        return
    assert len(out) == w.nbytes
