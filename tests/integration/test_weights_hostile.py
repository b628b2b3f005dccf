"""Weights from a hostile peer (issue 11): the expected manifest hash is required and
must come from elsewhere (here: the host's own manifest of the model on disk); forged
and hostile manifests are refused with WeightsError before anything is allocated or
written; hostile requests are refused while the server keeps serving."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.transport import LoopbackHub
from runtime.weights import ensure_safetensors
from runtime.weights_share import (CHANNEL, MAX_TENSOR_BYTES, WeightsError, decode, encode, expected_sha256,
                                   fetch_range, make_manifest, manifest_sha256, serve_weights)
from runtime.weights_share.manifest import _canonical, _check_manifest
from runtime.weights_share.wire import _REP, _REQ

RANGE = (29, 30, False, False)  # one worker layer: ~14 MB


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


@pytest.fixture(scope="module")
def real(model_dir):
    return make_manifest(model_dir, *RANGE)


def sealed(m: dict) -> dict:
    """``m`` with its own sha256 set: self-consistent, as a forger would send it."""
    m = {k: v for k, v in m.items() if k != "sha256"}
    m["sha256"] = manifest_sha256(m)
    return m


def forged_zero(real: dict) -> dict:
    """The real range's manifest with every tensor's bytes all zero (hashes recomputed)."""
    t = {n: dict(e, sha256=hashlib.sha256(bytes(e["nbytes"])).hexdigest()) for n, e in real["tensors"].items()}
    return sealed(dict(real, tensors=t))


def hostile_peer(hub: LoopbackHub, manifest: dict, served: list, model_dir=None):
    """A peer that answers every weights request from a forged manifest: zero bytes
    for every tensor, the real config file."""
    t = hub.transport("evil")

    def on(src, channel, data):
        _, req, _ = decode(data)
        served.append(req.get("op"))
        op = req["op"]
        if op == "manifest":
            msg = encode(_REP, {"id": req["id"], "ok": True, "op": "manifest"}, _canonical(manifest))
        elif op == "tensor":
            msg = encode(_REP, {"id": req["id"], "ok": True, "op": "tensor", "name": req["name"],
                                "offset": req["offset"]}, bytes(req["length"]))
        elif op == "file" and model_dir is not None:
            msg = encode(_REP, {"id": req["id"], "ok": True, "op": "file", "name": req["name"]},
                         (model_dir / req["name"]).read_bytes())
        else:
            msg = encode(_REP, {"id": req["id"], "ok": False, "error": "no"})
        asyncio.ensure_future(t.send(src, CHANNEL, msg))
    t.set_handler(on)
    return t


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_forged_all_zero_range_is_refused_against_the_hosts_manifest(real, model_dir, tmp_path):
    forged = forged_zero(real)

    async def go():
        hub = LoopbackHub()
        served: list = []
        hostile_peer(hub, forged, served, model_dir)
        c = hub.transport("client")
        with pytest.raises(WeightsError, match="is not the expected"):
            await fetch_range(c, "evil", *RANGE, tmp_path / "copy", real["sha256"])
        # the forgery passes only when the caller trusts the forger's own hash
        path = await fetch_range(c, "evil", *RANGE, tmp_path / "fooled", forged["sha256"])
        return served, path
    served, path = run(go())
    assert served[0] == "manifest" and served.count("manifest") == 2
    assert not (tmp_path / "copy").exists()
    assert path.exists()  # what the expected hash is there to prevent


@pytest.mark.parametrize("expected", [None, "", "0" * 63, "Z" * 64, {"sha256": None}, 12])
def test_no_expected_hash_no_copy(tmp_path, expected):
    async def go():
        hub = LoopbackHub()
        served: list = []
        hostile_peer(hub, {}, served)
        with pytest.raises(WeightsError, match="expected manifest sha256"):
            await fetch_range(hub.transport("client"), "evil", *RANGE, tmp_path / "copy", expected)
        return served
    assert run(go()) == []  # nothing was even asked
    assert not (tmp_path / "copy").exists()


def _tensor(real):
    name = next(iter(real["tensors"]))
    return name, real["tensors"][name]


@pytest.mark.parametrize("change, why", [
    (lambda m, n, e: dict(m, tensors={}), "no tensors"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, shape=[-576, -576], nbytes=576 * 576 * 4)}), "non-negative"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, shape=[2**23, 2**23], nbytes=2**46 * 4)}), "over"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, shape=[2**46], nbytes=2**48)}), "over"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, shape=[1.5, 2], nbytes=12)}), "non-negative integers"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, shape=[True], nbytes=4)}), "non-negative integers"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, shape=[1] * 20, nbytes=4)}), "at most 8"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, nbytes=float("inf"))}), "do not fit"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, nbytes=e["nbytes"] + 1)}), "do not fit"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, dtype="BF16")}), "dtype"),
    (lambda m, n, e: dict(m, tensors={n: dict(e, sha256="x")}), "sha256"),
    (lambda m, n, e: dict(m, tensors={n: "zeros"}), "malformed tensor"),
    (lambda m, n, e: dict(m, start=float("inf")), "another range"),
    (lambda m, n, e: dict(m, files={"../../etc/passwd": {"sha256": "0" * 64}}), "unexpected file"),
    (lambda m, n, e: dict(m, tensors=[n]), "malformed"),
])
def test_hostile_manifests_are_refused_with_the_modules_error(real, change, why):
    n, e = _tensor(real)
    m = sealed(change(real, n, e))  # self-consistent, and trusted: only the checks stand in the way
    with pytest.raises(WeightsError, match=why):
        _check_manifest(m, *RANGE, m["sha256"])


def test_the_real_manifest_passes(real):
    assert _check_manifest(real, *RANGE, real) is real
    assert expected_sha256(real) == real["sha256"] == expected_sha256(real["sha256"])


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(["start", "end", "embedding", "tensors", "files", "version", "T.shape", "T.nbytes",
                             "T.dtype", "T.sha256", "T", "F"]),
       value=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                       st.lists(st.integers(-2**50, 2**50), max_size=10),
                       st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)))
def test_any_manifest_is_checked_or_refused(real, path, value):
    """One field of the real manifest replaced by anything (then sealed, as a forger
    would): WeightsError or the manifest back, never another exception."""
    m = json.loads(json.dumps(real))
    n = next(iter(m["tensors"]))
    if path.startswith("T."):
        m["tensors"][n][path[2:]] = value
    elif path == "T":
        m["tensors"][n] = value
    elif path == "F":
        m["files"]["config.json"] = value
    else:
        m[path] = value
    try:
        m = sealed(m)
    except (TypeError, ValueError):  # not even JSON: a forger could not send it
        return
    try:
        assert _check_manifest(m, *RANGE, m["sha256"]) is m
    except WeightsError:
        pass


# --------------------------------------------------------------------------- the server side


def test_hostile_requests_are_refused_and_the_server_keeps_serving(model_dir, real):
    bad = [
        b"",
        b"Q",
        b"Q\xff\xff\xff\xff{}",
        bytes([_REQ]) + (10).to_bytes(4, "little") + b"not json!!",
        encode(_REQ, {"id": 1, "op": "tensor", "name": next(iter(real["tensors"])), "offset": float("inf"),
                      "length": 8}),
        encode(_REQ, {"id": 2, "op": "tensor", "name": next(iter(real["tensors"])), "offset": 0,
                      "length": float("nan")}),
        encode(_REQ, {"id": 3, "op": "manifest", "start": 0, "end": 10**30}),
        encode(_REQ, {"id": 4, "op": "manifest", "start": -5, "end": 2}),
        encode(_REQ, {"id": 5, "op": "manifest", "start": "0", "end": True}),
        encode(_REQ, {"id": [1], "op": "tensor", "name": ["x"], "offset": 0, "length": 8}),
        encode(_REQ, {"id": 6, "op": "file", "name": "../../../etc/passwd"}),
        encode(_REQ, {"id": 7, "op": "tensor", "name": next(iter(real["tensors"])), "offset": -1, "length": 8}),
        encode(_REQ, {"id": 8, "op": "tensor", "name": next(iter(real["tensors"])), "offset": 0,
                      "length": MAX_TENSOR_BYTES}),
        bytes([_REQ]) + (20003).to_bytes(4, "little") + b"[" * 10000 + b"]" * 10000 + b"{}",
    ]

    async def go():
        hub = LoopbackHub()
        s, c = hub.transport("server"), hub.transport("client")
        srv = serve_weights(s, model_dir, holds=(0, 30, True, True))
        replies = []
        c.set_handler(lambda src, ch, data: replies.append(data))
        for b in bad:
            await c.send("server", CHANNEL, b)
        for _ in range(200):
            await asyncio.sleep(0.02)
            if len(replies) >= len(bad) - 2:  # the first two are not even requests
                break
        c.set_handler(None)
        # still serving: a real copy of the range, checked against the host's manifest
        from runtime.weights_share import fetch_range as fr
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            await fr(c, "server", *RANGE, d, real)
        srv.close()
        return replies, srv
    replies, srv = run(go())
    oks = [decode(r)[1].get("ok") for r in replies]
    assert oks == [False] * len(oks) and len(oks) >= len(bad) - 2
    assert srv.stats["refused"] >= len(bad) - 2
