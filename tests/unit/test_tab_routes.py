"""The host's /tab routes, which a browser tab holding layers reads (share.html?layers=A-B):
a bad range is a 400 naming ``layers``, a bad device id one naming ``device``, a room
without tabs a 503; the bundle's packed tensors list each stored tensor of the range once,
its RoPE table is the numpy backend's, its manifest sha256 is the one hashlib gives the
range's stored tensors, and asking for it grants that device the range's weights
(TabRoom.grant) and nothing else. The weights themselves travel over the tab's weights
channel (tests/unit/test_tab_weights.py; no HTTP route serves them)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json

import numpy as np
import safetensors
from aiohttp.test_utils import TestClient, TestServer

from runtime.backends.numpy_backend import rope_tables
from runtime.config import ModelConfig
from runtime.serve.server import RoomServer
from runtime.serve.tab_stage import MAX_CTX, TabRoom
from runtime.weights import ensure_safetensors


def _get(server: RoomServer, paths: list[str]) -> list[tuple[int, bytes]]:
    async def main():
        async with TestClient(TestServer(server.app)) as c:
            out = []
            for p in paths:
                r = await c.get(p)
                out.append((r.status, await r.read()))
            return out
    return asyncio.run(main())


def test_a_room_without_tabs_answers_503_and_a_bad_range_400_naming_layers():
    srv = RoomServer("m")
    (st, body), = _get(srv, ["/tab/bundle.json?layers=30&device=tab"])
    assert st == 503 and b"no tabs" in body
    srv = RoomServer("m")  # a server's app runs on one event loop only
    srv.tab_room = TabRoom("ws://127.0.0.1:1", "r", "host", str(ensure_safetensors()))
    got = _get(srv, ["/tab/bundle.json?layers=31&device=tab", "/tab/bundle.json?layers=x&device=tab",
                     "/tab/bundle.json?device=tab", "/tab/bundle.json?layers=5-2&device=tab",
                     "/tab/bundle.json?layers=30", "/tab/bundle.json?layers=30&device=a%20b",
                     "/tab/bundle.json?layers=30&device=" + "x" * 65,
                     "/tab/weights.bin?layers=30", "/tab/manifest.json?layers=30"])
    for st, body in got[:4]:
        assert st == 400 and body.startswith(b'{"error": "layers: '), body[:120]
    for st, body in got[4:7]:
        assert st == 400 and body.startswith(b'{"error": "device: '), body[:120]
    assert [s for s, _ in got[7:]] == [404, 404]  # the weights no longer come over HTTP
    assert srv.tab_room.tabs == {}  # no bad request granted anything


def _stored(model_dir) -> dict[str, bytes]:
    """Every tensor's stored bytes, read from the safetensors file by its own layout
    (8-byte header length, JSON header, data) rather than through the code under test."""
    raw = (model_dir / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def test_the_bundle_lays_out_each_stored_tensor_once_and_pins_the_manifest():
    model_dir = ensure_safetensors()
    srv = RoomServer("m")
    srv.tab_room = TabRoom("ws://127.0.0.1:1", "r", "host", str(model_dir))
    (s1, b), (s2, js) = _get(srv, ["/tab/bundle.json?layers=29-30&device=tab-1", "/tab_worker.js"])
    assert (s1, s2) == (200, 200) and b"class TabWorker" in js
    bundle = json.loads(b)
    assert (bundle["start"], bundle["end"]) == (28, 30)
    stored = _stored(model_dir)
    names = [f"model.layers.{i}.{p}" for i in (28, 29) for p in (
        "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight")]
    listed = [name for t in bundle["tensors"] for name in t["parts"]]
    assert sorted(listed) == sorted(names)  # every tensor of the range, each once
    end = 0
    for t in bundle["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        assert t["offset"] == end and 4 * n == sum(len(stored[p]) for p in t["parts"]), t["name"]
        end += 4 * n
    # the manifest sha256 the tab checks against: runtime/weights_share's layout, hashed here
    tensors = {}
    with safetensors.safe_open(str(model_dir / "model.safetensors"), "np") as f:
        for name in names:
            meta = f.get_slice(name)
            tensors[name] = {"sha256": hashlib.sha256(stored[name]).hexdigest(), "dtype": meta.get_dtype(),
                             "shape": list(meta.get_shape()), "nbytes": len(stored[name])}
    files = {"config.json": {"sha256": hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest(),
                             "nbytes": len((model_dir / "config.json").read_bytes())}}
    body = {"version": 1, "start": 28, "end": 30, "embedding": False, "head": False, "tensors": tensors,
            "files": files}
    assert bundle["manifest_sha256"] == hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    # the RoPE table: cos then sin halves per position, [MAX_CTX, head_dim] float32
    cos, sin = rope_tables(ModelConfig.load(model_dir), MAX_CTX)
    rope = np.frombuffer(base64.b64decode(bundle["rope"]["b64"]), "<f4").reshape(bundle["rope"]["shape"])
    assert bundle["rope"]["offset"] == end and bundle["bytes"] == end + rope.nbytes
    assert np.array_equal(rope, np.concatenate([cos, sin], axis=1).astype(np.float32))
    # asking for the bundle granted tab-1 that range, and no one else anything
    assert srv.tab_room.grant("tab-1") == (28, 30, False, False) and srv.tab_room.grant("w1") is None
