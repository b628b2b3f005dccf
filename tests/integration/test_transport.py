"""The real transport (runtime/transport.py) and the signalling relay (runtime/relay.py)
on loopback: WebRTC data channels between peers in this process, a relay on a port
bound here (127.0.0.1, port 0), every connection closed and no task left behind."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import secrets
import time

import aiohttp
import numpy as np
import pytest

from planner.frames import FrameHeader, FrameKind, encode_header
from runtime.relay import MAX_MESSAGE_BYTES, check_sdp, RelayReject, relay_of, run_relay
from runtime.transport import (CHANNELS, PIECE_HEADER_BYTES, ChunkError, LoopbackHub, Reassembler,
                               TransportError, connect_room, encode_message)

LO = ["127.0.0.1"]


def run(coro, timeout_s: float = 40.0):
    """Run ``coro`` in a fresh loop with a deadline, then check no task was left."""

    async def wrapped():
        try:
            return await asyncio.wait_for(coro, timeout_s)
        finally:
            await asyncio.sleep(0)
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
            for _ in range(50):  # aiortc finishes its own tasks shortly after close()
                if not left:
                    break
                await asyncio.sleep(0.02)
                left = [t for t in left if not t.done()]
            assert not left, f"tasks left running: {left}"

    return asyncio.run(wrapped())


async def room(devices, **kw):
    """A relay and connected transports for ``devices`` (full mesh)."""
    runner, url = await run_relay("127.0.0.1", 0)
    ts = await asyncio.gather(*(connect_room(url, "test", d, [p for p in devices if p != d],
                                             host_addresses=LO, open_timeout_s=15, **kw) for d in devices))
    return runner, url, dict(zip(devices, ts))


async def close_room(runner, ts):
    for t in ts.values():
        await t.close()
    await runner.cleanup()


async def wait_for(pred, timeout_s=10.0):
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def frame(tokens=1, hidden=576, seed=0):
    h = FrameHeader(FrameKind.DECODE, question_id=7, lap_id=3, first_pos=11, tokens=tokens, hidden=hidden)
    payload = np.random.default_rng(seed).standard_normal((tokens, hidden)).astype(np.float32).tobytes()
    return encode_header(h) + payload


# ----------------------------------------------------------------------------- chunk codec (no network)

def test_chunk_codec_roundtrip_and_malformed():
    data = bytes(range(256)) * 41
    wires = encode_message(5, data, 1000)
    assert len(wires) > 1 and all(len(w) <= 1000 for w in wires)
    r = Reassembler()
    assert [r.feed(w) for w in wires[:-1]] == [None] * (len(wires) - 1)
    assert r.feed(wires[-1]) == data
    assert encode_message(1, b"abc", 1000) == [b"\x00abc"]
    assert r.feed(b"\x00") == b""
    with pytest.raises(ChunkError):
        r.feed(b"\x07junk")
    with pytest.raises(ChunkError):  # piece 1 without piece 0
        r.feed(wires[1])
    assert r.feed(encode_message(9, b"ok", 100)[0]) == b"ok"
    small = Reassembler(max_bytes=len(data) - 1)
    with pytest.raises(ChunkError, match="cap"):
        small.feed(wires[0])
    assert all(small.feed(w) is None for w in wires[1:])  # rest of the over-cap message: dropped silently
    assert small.feed(b"\x00next") == b"next"
    assert PIECE_HEADER_BYTES == 13


def test_loopback_hub_same_api():
    async def main():
        hub = LoopbackHub(max_message_bytes=4096)
        a, b = hub.transport("a"), hub.transport("b")
        got = []
        b.set_handler(lambda s, c, d: got.append((s, c, d)))
        big = bytes(np.random.default_rng(1).integers(0, 256, 50_000, dtype=np.uint8))
        for i, ch in enumerate(CHANNELS):
            await a.send("b", ch, b"m%d" % i)
        await a.send("b", "residual", big)
        await a._send_raw("b", "residual", b"\x01bad")
        await a.send("b", "residual", b"after")
        with pytest.raises(TransportError):
            await a.send("nobody", "residual", b"x")
        await wait_for(lambda: len(got) == 5)
        assert [g[2] for g in got] == [b"m0", b"m1", b"m2", big, b"after"]
        assert b.stats["residual"]["dropped"] == 1
        await a.close()
        await b.close()

    run(main())


# ----------------------------------------------------------------------------- WebRTC through the relay

def test_three_peers_all_channels_in_order():
    """Full mesh of three; every pair, every channel, 20 messages each, in order."""

    async def main():
        devices = ["a", "b", "c"]
        runner, _, ts = await room(devices)
        try:
            got = {d: [] for d in devices}
            for d, t in ts.items():
                assert t.device == d and t.max_message_bytes == 262144
                t.set_handler(lambda s, c, data, d=d: got[d].append((s, c, data)))
            n = 20
            for i in range(n):
                for s, t in ts.items():
                    for dst in devices:
                        if dst != s:
                            for ch in CHANNELS:
                                await t.send(dst, ch, f"{s}>{dst}:{ch}:{i}".encode())
            await wait_for(lambda: all(len(v) == n * 2 * 3 for v in got.values()))
            for d, msgs in got.items():
                for s in devices:
                    for ch in CHANNELS:
                        seq = [m for (src, c, m) in msgs if src == s and c == ch]
                        if s != d:
                            assert seq == [f"{s}>{d}:{ch}:{i}".encode() for i in range(n)]
            st = ts["a"].stats
            assert st["residual"]["sent_messages"] == 2 * n and st["reply"]["recv_messages"] == 2 * n
        finally:
            await close_room(runner, ts)

    run(main())


def test_one_mib_chunked_byte_exact_and_malformed_piece_dropped(caplog):
    async def main():
        runner, _, ts = await room(["a", "b"])
        try:
            a, b = ts["a"], ts["b"]
            got = []
            b.set_handler(lambda s, c, d: got.append((c, d)))
            big = bytes(np.random.default_rng(2).integers(0, 256, 1 << 20, dtype=np.uint8))
            await a.send("b", "residual", big)
            await a.send("b", "weights", big)
            await wait_for(lambda: len(got) == 2)
            assert sorted(got) == sorted([("residual", big), ("weights", big)])
            # a malformed piece: dropped with one line, the connection stays up
            with caplog.at_level(logging.WARNING, logger="splitroom.transport"):
                await a._send_raw("b", "residual", b"\x01\x00\x00")
                await a._send_raw("b", "residual", encode_message(99, big, 4096)[3])  # piece 3 with no piece 0
                await a.send("b", "residual", b"next")
                await wait_for(lambda: len(got) == 3)
            assert got[-1] == ("residual", b"next")
            assert b.stats["residual"]["dropped"] == 2
            assert sum("dropped a piece" in r.message for r in caplog.records) == 2
        finally:
            await close_room(runner, ts)

    run(main())


def test_over_cap_message_dropped_connection_stays_up():
    async def main():
        runner, _, ts = await room(["a", "b"], max_message_bytes_in=300_000)
        try:
            a, b = ts["a"], ts["b"]
            got = []
            b.set_handler(lambda s, c, d: got.append(d))
            await a.send("b", "residual", bytes(600_000))
            await a.send("b", "residual", b"small")
            await wait_for(lambda: got == [b"small"])
            assert b.stats["residual"]["dropped"] >= 1
        finally:
            await close_room(runner, ts)

    run(main())


def test_residual_not_queued_behind_weights():
    """A residual sent while 4 MiB of weights stream arrives before they end. Order and
    counts, not time: the residual is sent once b has got the weights' first piece (so
    they are in flight, however fast or loaded the machine), and b must get it while
    pieces of the weights are still to come, and deliver it first."""

    async def main():
        runner, _, ts = await room(["a", "b"])
        try:
            a, b = ts["a"], ts["b"]
            got = []
            b.set_handler(lambda s, c, d: got.append(c))
            pieces = {"weights": 0}
            weights_seen_at_residual = []
            first_piece = asyncio.Event()
            on_wire = b._on_wire

            def counting(src, channel, wire):
                if channel == "weights":
                    pieces["weights"] += 1
                    first_piece.set()
                elif channel == "residual":
                    weights_seen_at_residual.append(pieces["weights"])
                on_wire(src, channel, wire)

            b._on_wire = counting
            bulk = asyncio.ensure_future(a.send("b", "weights", bytes(4 << 20)))
            await asyncio.wait_for(first_piece.wait(), 30)
            await a.send("b", "residual", frame())
            await bulk
            await wait_for(lambda: len(got) == 2, 30)
            assert got == ["residual", "weights"]
            (seen,) = weights_seen_at_residual  # the residual is one piece
            assert 1 <= seen < pieces["weights"], (seen, pieces["weights"])
        finally:
            await close_room(runner, ts)

    run(main())


def test_relay_sees_only_sdp_never_payloads():
    """No prompt, token or residual crosses the relay: its audit log holds only
    hello/peers/signal messages whose data is an SDP offer/answer."""

    async def main():
        runner, _, ts = await room(["a", "b"])
        # high-entropy markers: a short secret ("4711") turns up in a random SDP's ports,
        # priorities or session ids about once a hundred runs, failing without a leak
        prompt = f"PROMPT {secrets.token_hex(32)}: what is the secret capital of Atlantis?"
        tokens = "TOKENS: " + " ".join(str(secrets.randbelow(10**12) + 10**12) for _ in range(8))
        fr = frame(seed=3)
        try:
            a, b = ts["a"], ts["b"]
            got = []
            b.set_handler(lambda s, c, d: got.append(d))
            await a.send("b", "reply", prompt.encode())
            await a.send("b", "reply", tokens.encode())
            await a.send("b", "residual", fr)
            await wait_for(lambda: len(got) == 3)
            assert got == [prompt.encode(), tokens.encode(), fr]
            audit = relay_of(runner).audit
        finally:
            await close_room(runner, ts)
        types = {e["message"]["type"] for e in audit}
        assert types == {"hello", "peers", "signal"}
        for e in audit:
            m = e["message"]
            if m["type"] == "signal":
                assert set(m["data"]) == {"type", "sdp"} and m["data"]["type"] in ("offer", "answer")
                check_sdp(m["data"])
        text = json.dumps(audit)
        for secret in (prompt, tokens, prompt[7:71], tokens[8:60]):
            assert secret not in text
        # the frame's bytes, 32 of them at a time, in every encoding a leak could take
        for i in range(32, len(fr) - 32, 32):
            chunk = fr[i:i + 32]
            for enc in (chunk.hex(), chunk.hex().upper(), base64.b64encode(chunk).decode(),
                        json.dumps(chunk.decode("latin-1"))[1:-1]):
                assert enc not in text
        assert b"SRFM" not in text.encode()

    run(main())


def test_relay_rejects_what_is_not_signalling():
    async def main():
        runner, url = await run_relay("127.0.0.1", 0)
        relay = relay_of(runner)
        sdp = {"type": "offer", "sdp": "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=ice-ufrag:abcd\r\n"}
        bad = [
            ({"type": "chat", "text": "hi"}, "not allowed"),
            ({"type": "signal", "to": "y", "data": {"type": "offer", "sdp": "hello there"}}, "not an SDP"),
            ({"type": "signal", "to": "y", "data": {**sdp, "sdp": sdp["sdp"] + "a=x-prompt:secret\r\n"}},
             "attribute"),
            ({"type": "signal", "to": "y", "data": {"type": "token", "sdp": sdp["sdp"]}}, "offer/answer"),
            ({"type": "signal", "to": "y", "data": {**sdp, "extra": 1}}, "exactly"),
        ]
        try:
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"{url}/room/r") as y:
                    await y.send_json({"type": "hello", "device": "y"})
                    assert (await y.receive_json())["type"] == "peers"
                    for i, (msg, why) in enumerate(bad):
                        async with s.ws_connect(f"{url}/room/r") as ws:
                            await ws.send_json({"type": "hello", "device": f"x{i}"})
                            await ws.send_json(msg)
                            while True:  # peers announcements, then the close
                                m = await asyncio.wait_for(ws.receive(), 5)
                                if m.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                                    break
                            assert ws.close_code == 1008
                            assert why in relay.rejections[-1]["reason"]
                    async with s.ws_connect(f"{url}/room/r", max_msg_size=0) as ws:  # oversized
                        await ws.send_str("x" * (MAX_MESSAGE_BYTES + 10))
                        m = await asyncio.wait_for(ws.receive(), 5)
                        assert m.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                        assert ws.close_code == 1009
                    # a good signal still goes through
                    async with s.ws_connect(f"{url}/room/r") as ws:
                        await ws.send_json({"type": "hello", "device": "z"})
                        await ws.send_json({"type": "signal", "to": "y", "data": sdp})
                        for _ in range(50):  # y also saw every join/leave above
                            m = await asyncio.wait_for(y.receive_json(), 5)
                            if m["type"] == "signal":
                                break
                        assert m == {"type": "signal", "from": "z", "data": sdp}
        finally:
            await runner.cleanup()
        assert len(relay.rejections) == len(bad) + 1
        with pytest.raises(RelayReject):
            check_sdp({"type": "offer", "sdp": "v=0\r\nx=not sdp\r\n"})

    run(main())


def test_channel_open_timeout_names_the_peer():
    """A peer that joins the relay but never answers: TransportError within the timeout."""

    async def main():
        runner, url = await run_relay("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"{url}/room/r") as z:  # "z" says hello, then stays silent
                    await z.send_json({"type": "hello", "device": "z"})
                    # the error names the peer and the 1.5 s asked for (not connect_room's
                    # default of 20 s): the timeout passed in is the one that ran out
                    with pytest.raises(TransportError, match=r"'z'.* within 1\.5 s"):
                        await connect_room(url, "r", "a", ["z"], host_addresses=LO, open_timeout_s=1.5)
                    # and a peer that never joins at all
                    with pytest.raises(TransportError, match="'ghost'.*join"):
                        await connect_room(url, "r", "b", ["ghost"], host_addresses=LO, open_timeout_s=0.5)
        finally:
            await runner.cleanup()

    run(main())


def test_sctp_tuning_sends_a_10kb_frame_in_one_burst():
    """With 20 ms one-way delay emulated in process, aiortc's 3-chunk window and 4-chunk
    bursts send a 10 KB message (9 DATA chunks of at most 1160 bytes) over several round
    trips; tune_sctp() sends all 9 before the first SACK can come back. Counted, not
    timed: the DATA chunks the sender puts in flight before each SACK it receives, which
    no load on the machine changes (the SACK needs the 40 ms round trip)."""
    from aiortc.rtcsctptransport import RTCSctpTransport

    from runtime.transport import emulate_delay, tune_sctp

    one_way = 0.020
    chunks = math.ceil(10_000 / 1160)  # 9
    in_flight: dict[int, int] = {}
    flights: dict[int, list[int]] = {}
    orig_increase, orig_sack = RTCSctpTransport._flight_size_increase, RTCSctpTransport._receive_sack_chunk

    def increase(self, chunk):
        in_flight[id(self)] = in_flight.get(id(self), 0) + 1
        return orig_increase(self, chunk)

    async def sack(self, chunk):
        if in_flight.get(id(self)):
            flights.setdefault(id(self), []).append(in_flight.pop(id(self)))
        return await orig_sack(self, chunk)

    async def first_flights(tuned: bool) -> list[int]:
        tune_sctp() if tuned else tune_sctp(None, None)
        runner, _, ts = await room(["a", "b"], sctp_tuning=False)
        try:
            a, b = ts["a"], ts["b"]
            for t in ts.values():
                emulate_delay(t, one_way)
            q: asyncio.Queue = asyncio.Queue()
            b.set_handler(lambda s, c, d: q.put_nowait(len(d)))
            firsts = []
            for _ in range(3):
                await asyncio.sleep(2 * one_way + 0.05)  # SACKs back: the send starts idle
                in_flight.clear()
                flights.clear()
                await a.send("b", "residual", bytes(10_000))
                assert await q.get() == 10_000
                await asyncio.sleep(2 * one_way + 0.05)
                for n in in_flight.values():  # a flight whose SACK has not been read yet
                    flights.setdefault(-1, []).append(n)
                sender = [f for f in flights.values() if sum(f) >= chunks]
                assert len(sender) == 1, flights
                firsts.append(sender[0][0])
            return firsts
        finally:
            await close_room(runner, ts)

    RTCSctpTransport._flight_size_increase, RTCSctpTransport._receive_sack_chunk = increase, sack
    try:
        shipped = run(first_flights(False))
        tuned = run(first_flights(True))
    finally:
        RTCSctpTransport._flight_size_increase, RTCSctpTransport._receive_sack_chunk = orig_increase, orig_sack
        tune_sctp()
    assert tuned == [chunks] * 3, tuned  # the whole frame in the first flight, every time
    assert max(shipped) <= 4, shipped  # aiortc as shipped: a 3-chunk window, 4-chunk bursts
    with pytest.raises(ValueError):
        tune_sctp(max_burst=0)
