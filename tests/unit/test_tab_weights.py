"""The model host's side of a browser tab's weights channel (TabRoom.serve, a
runtime.weights_share server with a grant): over the in-process LoopbackHub, a tab that
asked for the bundle of layers 29-30 gets that range's manifest (the one whose sha256 the
bundle gives) and its tensors, packed where they have that form; a tensor or a manifest
outside its range, a malformed request and an unknown op are refused with a reason; a
peer that asked for no bundle is not answered by this server (its requests pass on to
the handler below, the Node's own server in a room). The tab's side (static/tab_worker.js
fetchRange, a sha256 mismatch on its screen) runs in tests/integration/test_browser_worker.py."""

from __future__ import annotations

import asyncio
import hashlib
import json

from runtime.serve.tab_stage import TabRoom
from runtime.transport import LoopbackHub
from runtime.weights import ensure_safetensors
from runtime.weights_share import CHANNEL, decode, encode
from runtime.weights_codec import unpack


def test_a_tab_gets_its_range_and_nothing_else():
    model_dir = ensure_safetensors()
    tab = TabRoom("ws://127.0.0.1:1", "r", "host", str(model_dir))
    bundle = tab.served(28, 30)
    tab.tabs["tab"] = (28, 30)  # what /tab/bundle.json?layers=29-30&device=tab records

    async def go():
        hub = LoopbackHub()
        host, t, w1 = hub.transport("host"), hub.transport("tab"), hub.transport("w1")
        below: list = []  # what the host's server passes on
        host.set_handler(lambda src, ch, data: below.append((src, ch, bytes(data))))
        srv = tab.serve(host)
        replies: dict = {}
        got = asyncio.Event()

        def on(src, ch, data):
            _, h, payload = decode(data)
            replies[h.get("id")] = (h, bytes(payload))
            got.set()
        t.set_handler(on)
        w1.set_handler(on)

        async def ask(who, req: dict | bytes, tries: int = 200):
            rid = req["id"] if isinstance(req, dict) else None
            replies.pop(rid, None)
            await who.send("host", CHANNEL, encode(ord("Q"), req) if isinstance(req, dict) else req)
            for _ in range(tries):
                if rid in replies:
                    return replies[rid]
                got.clear()
                try:
                    await asyncio.wait_for(got.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
            return None

        out = {"manifest": await ask(t, {"id": 1, "op": "manifest", "start": 28, "end": 30,
                                         "embedding": False, "head": False}),
               "other_range": await ask(t, {"id": 2, "op": "manifest", "start": 27, "end": 30,
                                            "embedding": False, "head": False}),
               "with_head": await ask(t, {"id": 3, "op": "manifest", "start": 28, "end": 30,
                                          "embedding": False, "head": True}),
               "outside": await ask(t, {"id": 4, "op": "tensor", "name": "model.layers.3.mlp.down_proj.weight",
                                        "offset": 0, "length": 1024}),
               "embedding": await ask(t, {"id": 5, "op": "tensor", "name": "model.embed_tokens.weight",
                                          "offset": 0, "length": 1024}),
               "unknown_op": await ask(t, {"id": 6, "op": "everything"}),
               "bad_slice": await ask(t, {"id": 7, "op": "tensor", "name": "model.layers.29.mlp.up_proj.weight",
                                          "offset": -5, "length": 10}),
               "packed": await ask(t, {"id": 8, "op": "tensor", "name": "model.layers.29.mlp.up_proj.weight",
                                       "offset": 0, "length": 4 << 20, "form": "packed"}),
               "norm": await ask(t, {"id": 9, "op": "tensor", "name": "model.layers.28.input_layernorm.weight",
                                     "offset": 0, "length": 4 << 20, "form": "packed"})}
        out["malformed"] = await ask(t, b"Q\x05\x00\x00\x00{\"id\"")
        out["w1"] = await ask(w1, {"id": 10, "op": "manifest", "start": 0, "end": 1, "embedding": False,
                                   "head": False}, tries=10)  # LoopbackHub delivers on the next turns
        srv.close()
        await asyncio.gather(host.close(), t.close(), w1.close())
        return out, below, srv.stats

    out, below, stats = asyncio.run(asyncio.wait_for(go(), 60))
    h, payload = out["manifest"]
    m = json.loads(payload)
    assert h["ok"] and m["sha256"] == bundle["manifest_sha256"]
    body = {k: v for k, v in m.items() if k != "sha256"}
    assert hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest() == m["sha256"]
    assert sorted({n.split(".")[2] for n in m["tensors"]}) == ["28", "29"] and len(m["tensors"]) == 18
    for key in ("other_range", "with_head"):
        h, _ = out[key]
        assert not h["ok"] and "granted to tab: layers [28, 30)" in h["error"], h
    for key, name in (("outside", "model.layers.3.mlp.down_proj.weight"), ("embedding", "model.embed_tokens.weight")):
        h, _ = out[key]
        assert not h["ok"] and h["error"] == f"does not hold tensor {name} (granted to tab: layers [28, 30))", h
    assert not out["unknown_op"][0]["ok"] and "unknown op" in out["unknown_op"][0]["error"]
    assert not out["bad_slice"][0]["ok"] and "bad slice" in out["bad_slice"][0]["error"]
    assert not out["malformed"][0]["ok"] and "malformed request" in out["malformed"][0]["error"]
    # a packed tensor unpacks to the stored bytes the manifest hashes; a norm has no packed form
    h, payload = out["packed"]
    e = m["tensors"]["model.layers.29.mlp.up_proj.weight"]
    assert h["form"] == "packed" and h["total"] == len(payload) < e["nbytes"] / 4
    assert hashlib.sha256(unpack(payload, e["nbytes"] // 4)).hexdigest() == e["sha256"]
    h, payload = out["norm"]
    e = m["tensors"]["model.layers.28.input_layernorm.weight"]
    assert h["form"] == "raw" and hashlib.sha256(payload).hexdigest() == e["sha256"]
    # w1 asked for no bundle: not answered here, its request went to the handler below
    assert out["w1"] is None and [(s, c) for s, c, _ in below] == [("w1", CHANNEL)]
    assert stats["refused"] == 7
