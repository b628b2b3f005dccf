"""The frame format: layout by hand, round trips, and every malformed case rejected."""

import struct

import pytest

from planner.frames import (HEADER_BYTES, DType, FrameError, FrameHeader, FrameKind, decode_header, encode_header,
                            frame_bytes)


def test_header_layout_is_the_documented_32_bytes():
    h = FrameHeader(FrameKind.DECODE, question_id=7, lap_id=9, first_pos=100, tokens=5, hidden=576,
                    dtype=DType.FLOAT16, returns=True)
    raw = encode_header(h)
    assert len(raw) == HEADER_BYTES == 32
    # by hand: magic, version 1, kind 2, dtype 1, flags 1, then six little-endian uint32
    assert raw == b"SRFM" + bytes([1, 2, 1, 1]) + struct.pack("<6I", 7, 9, 100, 5, 576, 5 * 576 * 2)


def test_frame_sizes_by_hand():
    assert frame_bytes(1, 576, DType.FLOAT32) == 32 + 2304        # SmolLM2 decode frame
    assert frame_bytes(1, 5120, DType.FLOAT16) == 32 + 10240      # the 27B: about 10 KB
    assert frame_bytes(16, 2048, DType.FLOAT16) == 32 + 65536     # a 16-token MoE prefill chunk


def test_round_trip_with_payload():
    h = FrameHeader(FrameKind.PREFILL, 1, 2, 0, 3, 4, DType.FLOAT32, False)
    data = encode_header(h) + bytes(h.payload_bytes)
    assert decode_header(data) == h


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d[:10], "shorter"),
    (lambda d: b"XXXX" + d[4:], "magic"),
    (lambda d: d[:4] + bytes([9]) + d[5:], "version"),
    (lambda d: d[:5] + bytes([77]) + d[6:], "kind"),
    (lambda d: d[:6] + bytes([5]) + d[7:], "dtype"),
    (lambda d: d[:28] + struct.pack("<I", 999) + d[32:], "payload"),
    (lambda d: d + b"\0", "header says"),
    (lambda d: d[:-1], "header says"),
])
def test_malformed_frames_are_rejected_with_a_reason(mutate, match):
    h = FrameHeader(FrameKind.DECODE, 1, 2, 3, 2, 4, DType.FLOAT32, True)
    data = encode_header(h) + bytes(h.payload_bytes)
    with pytest.raises(FrameError, match=match):
        decode_header(mutate(data))


def test_field_out_of_range_is_a_frame_error():
    with pytest.raises(FrameError):
        encode_header(FrameHeader(FrameKind.DECODE, -1, 0, 0, 1, 1))
