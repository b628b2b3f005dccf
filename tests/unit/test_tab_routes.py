"""The host's /tab routes, which a browser tab holding layers reads (share.html?layers=A-B):
a bad range is a 400 naming ``layers``, a room without tabs a 503, and each packed tensor's
parts are byte for byte the model's stored tensors, whose sha256 the manifest gives (the
check static/tab_worker.js makes with WebCrypto, made here with hashlib)."""

from __future__ import annotations

import asyncio
import hashlib

from aiohttp.test_utils import TestClient, TestServer

from runtime.serve.server import RoomServer
from runtime.serve.tab_stage import TabRoom
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
    (st, body), = _get(srv, ["/tab/bundle.json?layers=30"])
    assert st == 503 and b"no tabs" in body
    srv = RoomServer("m")  # a server's app runs on one event loop only
    srv.tab_room = TabRoom("ws://127.0.0.1:1", "r", "host", str(ensure_safetensors()))
    got = _get(srv, ["/tab/weights.bin?layers=0-3", "/tab/manifest.json?layers=31", "/tab/bundle.json?layers=x",
                     "/tab/bundle.json", "/tab/bundle.json?layers=5-2"])
    for st, body in got:
        assert st == 400 and body.startswith(b'{"error": "layers: '), body[:120]


def test_each_packed_part_is_the_stored_tensor_the_manifest_hashes():
    srv = RoomServer("m")
    srv.tab_room = TabRoom("ws://127.0.0.1:1", "r", "host", str(ensure_safetensors()))
    (s1, b), (s2, w), (s3, m), (s4, js) = _get(srv, ["/tab/bundle.json?layers=29-30", "/tab/weights.bin?layers=29-30",
                                                     "/tab/manifest.json?layers=29-30", "/tab_worker.js"])
    assert (s1, s2, s3, s4) == (200, 200, 200, 200) and b"class TabWorker" in js
    import json
    bundle, manifest = json.loads(b), json.loads(m)
    assert (bundle["start"], bundle["end"], manifest["start"], manifest["end"]) == (28, 30, 28, 30)
    assert len(w) == bundle["bytes"]
    checked = set()
    for t in bundle["tensors"]:
        off = t["offset"]
        for name in t["parts"]:
            e = manifest["tensors"][name]
            assert hashlib.sha256(w[off:off + e["nbytes"]]).hexdigest() == e["sha256"], name
            off += e["nbytes"]
            checked.add(name)
        n = 1
        for d in t["shape"]:
            n *= d
        assert off == t["offset"] + 4 * n
    assert checked == set(manifest["tensors"])  # every tensor of the range, each once
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    assert hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest() \
        == manifest["sha256"]
