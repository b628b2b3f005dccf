"""Copying a layer range's weights from a peer (runtime/weights_share/), over the
in-process LoopbackHub and over a real two-peer WebRTC room on 127.0.0.1 (relay on
port 0): the copy loads and computes exactly what the range read from disk computes;
a byte flipped in transit is caught and nothing is written; a range the peer does not
hold is refused."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from runtime.backends import StageSpec, make_stage
from runtime.relay import run_relay
from runtime.transport import LoopbackHub, connect_room
from runtime.weights import ensure_safetensors, load_range
from runtime.weights_share import (CHANNEL, WeightsError, decode, fetch_range, make_manifest, serve_weights)

pytestmark = pytest.mark.slow

KINDS = ["loopback", "webrtc"]
# a host range with embedding and head on loopback (~140 MB); one worker layer over WebRTC
# (~14 MB: the paced weights channel moves ~5 MB/s on this 2-core VM's loopback)
RANGE = {"loopback": (0, 2, True, True), "webrtc": (29, 30, False, False)}


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


@contextlib.asynccontextmanager
async def pair(kind):
    """Two connected transports, ``server`` and ``client``."""
    if kind == "loopback":
        hub = LoopbackHub()
        s, c = hub.transport("server"), hub.transport("client")
        yield s, c
        await s.close()
        await c.close()
        return
    runner, url = await run_relay("127.0.0.1", 0)
    try:
        s, c = await asyncio.gather(*(connect_room(url, "w", d, [p], host_addresses=["127.0.0.1"], open_timeout_s=15)
                                      for d, p in (("server", "client"), ("client", "server"))))
        try:
            yield s, c
        finally:
            await s.close()
            await c.close()
    finally:
        await runner.cleanup()


def run(coro, timeout_s=45.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def same_output(model_dir, copy_dir, start, end, host):
    spec = StageSpec(start, end, host=host)
    a = make_stage("numpy", model_dir, spec)
    b = make_stage("numpy", copy_dir, spec)
    if host:
        ids = [1, 504, 3459, 314, 260]
        x, y = a.embed_forward(ids, 0), b.embed_forward(ids, 0)
        return np.array_equal(x, y) and np.array_equal(a.head(x), b.head(y))
    x = np.random.default_rng(0).standard_normal((5, a.cfg.hidden)).astype(np.float32)
    return np.array_equal(a.forward(x, 0), b.forward(x, 0))


@pytest.mark.parametrize("kind", KINDS)
def test_a_range_copied_from_a_peer_computes_like_the_one_on_disk(kind, model_dir, tmp_path):
    start, end, emb, head = RANGE[kind]
    expected = make_manifest(model_dir, start, end, emb, head)

    async def go():
        async with pair(kind) as (s, c):
            srv = serve_weights(s, model_dir, holds=(0, 30, True, True))
            path = await fetch_range(c, "server", start, end, emb, head, tmp_path / "copy",
                                     expected_manifest=expected["sha256"])
            # a wrong expected manifest is refused before any tensor is asked for
            with pytest.raises(WeightsError, match="expected"):
                await fetch_range(c, "server", start, end, emb, head, tmp_path / "other", expected_manifest="0" * 64)
            srv.close()
            return path, dict(srv.stats)

    path, stats = run(go())
    assert path == tmp_path / "copy" / "model.safetensors" and path.is_file()
    assert not (tmp_path / "other").exists()
    # by hand: the layers' matrices come from Q4_1 blocks of 32 in the GGUF, so each
    # travels packed (32-byte header, a bit per block, 4 + 4 + 16 bytes a block); the
    # norms and the Q8_0 embedding travel as stored; the files as they are
    def wire_bytes(name, e):
        if ".layers." in name and len(e["shape"]) == 2:
            blocks = e["nbytes"] // 4 // 32
            return 32 + (blocks + 7) // 8 + 24 * blocks
        return e["nbytes"]
    want = sum(wire_bytes(n, e) for n, e in expected["tensors"].items()) + \
        sum(e["nbytes"] for e in expected["files"].values())
    assert stats["refused"] == 0 and stats["bytes"] == want
    assert make_manifest(tmp_path / "copy", start, end, emb, head)["sha256"] == expected["sha256"]
    w, w0 = load_range(tmp_path / "copy", start, end, emb, head), load_range(model_dir, start, end, emb, head)
    assert sorted(w) == sorted(w0) and all(np.array_equal(w[k], w0[k]) for k in w0)
    assert same_output(model_dir, tmp_path / "copy", start, end, host=emb)


@pytest.mark.parametrize("kind", KINDS)
def test_a_byte_corrupted_in_transit_is_caught_and_nothing_is_written(kind, model_dir, tmp_path):
    start, end, emb, head = RANGE[kind]
    victim = f"model.layers.{end - 1}.mlp.down_proj.weight"

    async def go():
        async with pair(kind) as (s, c):
            srv = serve_weights(s, model_dir)
            send = s.send
            flipped = []

            async def corrupting_send(dst, channel, data):
                if channel == CHANNEL and not flipped:
                    _, h, payload = decode(data)
                    if h.get("name") == victim and h.get("offset", -1) >= 0:  # packed: one slice
                        data = bytearray(data)
                        data[len(data) - len(payload) // 2] ^= 0x01  # one bit of one byte
                        data = bytes(data)
                        flipped.append(h["offset"])
                await send(dst, channel, data)

            s.send = corrupting_send
            with pytest.raises(WeightsError, match=f"{victim}.*sha256 mismatch"):
                await fetch_range(c, "server", start, end, emb, head, tmp_path / "copy",
                                  make_manifest(model_dir, start, end, emb, head))
            srv.close()
            return flipped

    assert run(go())
    assert not (tmp_path / "copy").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_a_range_the_peer_does_not_hold_is_refused(kind, model_dir, tmp_path):
    async def go():
        async with pair(kind) as (s, c):
            srv = serve_weights(s, model_dir, holds=(0, 15, True, True))
            with pytest.raises(WeightsError, match=r"refused: does not hold layers \[20, 25\)"):
                await fetch_range(c, "server", 20, 25, False, False, tmp_path / "copy",
                                  make_manifest(model_dir, 20, 25, False, False))
            # asking tensor by tensor outside what it holds is refused too
            from runtime.weights_share.peers import _Client
            cl = _Client(c, "server", 10.0)
            c.subscribe(CHANNEL, cl.on_reply, cl.accepts)
            with pytest.raises(WeightsError, match="does not hold tensor"):
                await cl.ask({"op": "tensor", "name": "model.layers.20.mlp.up_proj.weight", "offset": 0, "length": 8})
            with pytest.raises(WeightsError, match="does not serve file"):
                await cl.ask({"op": "file", "name": "../etc/passwd"})
            srv.close()
            return list(srv.refusals)

    refusals = run(go())
    assert len(refusals) == 3 and all(p == "client" for p, _ in refusals)
    assert not (tmp_path / "copy").exists()
