"""Peer copies of a room that holds a GGUF's blocks as stored (``weights: gguf``): the
manifest lists the GGUF's own tensors (types, shapes and byte counts as gguf-py's reader
gives them), the copy carries and writes those bytes unchanged, and the range read from
the copy is the range read from the file; a re-dealt room copies blocks and still answers
as the same stages read from disk; a blocks manifest that lies about its sizes is refused."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from runtime import gguf_blocks as gb  # noqa: E402
from runtime.backends import StageSpec, make_stage  # noqa: E402
from runtime.precision import Precision  # noqa: E402
from runtime.transport import LoopbackHub  # noqa: E402
from runtime.weights import GGUF_SOURCE, load_range_native, prepare_native  # noqa: E402
from runtime.weights_share import WeightsError, fetch_range, make_manifest, serve_weights  # noqa: E402
from runtime.weights_share.manifest import _check_manifest, manifest_sha256  # noqa: E402
from scripts import make_gguf  # noqa: E402

pytestmark = pytest.mark.slow
GGUF = Precision(weights="gguf")


@pytest.fixture(scope="module")
def q4km(tmp_path_factory):
    """A random tiny checkpoint in Q4_K_M's mix (Q4_K, Q6_K for attn_v/ffn_down in every other
    layer, F32 norms), prepared to be held as stored, and its GGUF path."""
    tmp = tmp_path_factory.mktemp("q4km")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPLITROOM_CACHE", str(tmp / "cache"))
    path = tmp / "tiny-q4_k_m.gguf"
    make_gguf.write(path, "tiny", "q4_k_m", seed=11)
    d = prepare_native(path, progress=None)
    yield d, path
    mp.undo()


def _equal(a, b) -> bool:
    if isinstance(a, gb.QTensor):
        return isinstance(b, gb.QTensor) and (a.fmt, a.shape) == (b.fmt, b.shape) and np.array_equal(a.data, b.data)
    return not isinstance(b, gb.QTensor) and a.dtype == b.dtype and np.array_equal(a, b)


def test_a_blocks_copy_carries_the_files_bytes_and_reads_back_the_same_range(q4km, tmp_path):
    d, path = q4km
    start, end = 1, 3  # 0-based [1, 3): layer 1's attn_v/ffn_down are Q6_K, layer 2's Q4_K
    expected = make_manifest(d, start, end, False, False, blocks=True)
    # independently: gguf-py's own tensor table of the file
    reader = gguf.GGUFReader(str(path))
    mine = {t.name: t for t in reader.tensors if t.name.startswith(("blk.1.", "blk.2."))}
    got = {e["gguf"]: e for e in expected["tensors"].values()}
    assert sorted(got) == sorted(mine)
    for name, t in mine.items():
        e = got[name]
        assert e["dtype"] == t.tensor_type.name and e["nbytes"] == int(t.n_bytes)
        assert e["shape"] == [int(x) for x in reversed([int(v) for v in t.shape])]
    assert {e["dtype"] for e in got.values()} == {"Q4_K", "Q6_K", "F32"}

    async def go():
        hub = LoopbackHub()
        s, c = hub.transport("server"), hub.transport("client")
        srv = serve_weights(s, d, blocks=True)
        out = await fetch_range(c, "server", start, end, False, False, tmp_path / "copy", expected["sha256"])
        # a wrong expected hash is refused before any tensor is asked for
        with pytest.raises(WeightsError, match="not the expected"):
            await fetch_range(c, "server", start, end, False, False, tmp_path / "other", "0" * 64)
        srv.close()
        await s.close()
        await c.close()
        return out, dict(srv.stats)

    out, stats = asyncio.run(asyncio.wait_for(go(), 60))
    assert out == tmp_path / "copy" / "blocks.gguf-data" and (tmp_path / "copy" / GGUF_SOURCE).is_file()
    assert not (tmp_path / "copy" / "model.safetensors").exists() and not (tmp_path / "other").exists()
    blocks = sum(e["nbytes"] for e in got.values() if e["dtype"] != "F32")
    floats = sum(e["nbytes"] for e in got.values() if e["dtype"] == "F32")
    files = sum(e["nbytes"] for e in expected["files"].values())
    # the blocks travel as stored (only float32 tensors have a packed form), nothing else is sent
    assert stats["refused"] == 0 and blocks + files <= stats["bytes"] <= blocks + floats + files
    # the copy is itself a blocks model directory of that range, with the same manifest
    assert make_manifest(tmp_path / "copy", start, end, False, False, blocks=True)["sha256"] == expected["sha256"]
    w, w0 = load_range_native(tmp_path / "copy", start, end, False, False), load_range_native(d, start, end, False, False)
    assert sorted(w) == sorted(w0) and all(_equal(w[k], w0[k]) for k in w0)
    assert {w[k].fmt for k in w if isinstance(w[k], gb.QTensor)} == {"q4_k", "q6_k"}
    spec = StageSpec(start, end, False)
    a = make_stage("numpy", d, spec, precision=GGUF)
    b = make_stage("numpy", d, spec, precision=GGUF, weights=w)
    x = np.random.default_rng(0).standard_normal((5, a.cfg.hidden)).astype(np.float32)
    assert np.array_equal(a.forward(x, 0), b.forward(x, 0))


def test_a_blocks_manifest_that_lies_about_its_bytes_is_refused(q4km):
    d, _ = q4km
    m = make_manifest(d, 0, 1, False, False, blocks=True)
    _check_manifest(m, 0, 1, False, False, m["sha256"])  # as made: fine

    def forged(change):
        f = copy.deepcopy(m)
        change(next(e for e in f["tensors"].values() if e["dtype"] == "Q4_K"))
        f["sha256"] = manifest_sha256(f)
        return f

    def more_bytes(e):  # Q4_K: 144 bytes per 256 weights; one block more than the shape holds
        e["nbytes"] += 144
    cases = [(more_bytes, "do not fit shape"),
             (lambda e: e.update(shape=[e["shape"][0], 100]), "whole blocks"),
             (lambda e: e.update(dtype="Q5_K"), "unsupported dtype"),
             (lambda e: e.pop("gguf"), "some tensors of the manifest are GGUF blocks"),
             (lambda e: e.update(gguf="../x"), "GGUF name")]
    for change, why in cases:
        f = forged(change)
        with pytest.raises(WeightsError, match=why):
            _check_manifest(f, 0, 1, False, False, f["sha256"])


def test_a_gguf_directory_without_float32_weights_says_so_in_one_line(q4km):
    d, _ = q4km
    with pytest.raises(WeightsError) as e:
        make_manifest(d, 0, 1, False, False)
    assert "\n" not in str(e.value) and "model.safetensors" in str(e.value)


def test_a_re_dealt_gguf_room_copies_blocks_and_answers_as_before(caplog):
    """The bundled SmolLM2 held as stored (Q4_1 layers, Q8_0 embedding): host 1-9, w1 10-21,
    w2 22-30; w2 falls silent after 6 answer tokens, the host re-deals 22-30 to w1, which
    copies them from the host as blocks (the host serves its GGUF's bytes) and reads 10-21
    from its disk; both answers equal greedy decoding by one stage of all 30 layers held
    the same way."""
    from runtime.generate import generate_greedy
    from runtime.room import merge_traces
    from runtime.tokenizer import ChatTokenizer
    from runtime.weights import find_gguf
    from tests.integration.test_room_nodes import MAX_NEW, PROMPTS, Hub, Node, NodeConfig, _until_emitted

    src = find_gguf()
    d = prepare_native(src, progress=None)
    tok = ChatTokenizer.from_dir(d)
    whole = make_stage("numpy", d, StageSpec(0, 30, True), precision=GGUF)
    reference = []
    for p in PROMPTS:
        whole.rollback(0)
        reference.append([t for t in generate_greedy([whole], tok.encode_chat(p), MAX_NEW).ids if t != 2])
    del whole
    chain = [["host", 0, 9], ["w1", 9, 21], ["w2", 21, 30]]
    hub = Hub()
    sc = dict(hidden=576, prefill_chunk=16, eos_token=2, phones=[])
    nodes = []
    for n, a, b in chain:
        c = NodeConfig(device=n, host="host", stages=chain, scheduler=sc, model_dir=str(d), weights="gguf",
                       prompts=PROMPTS if n == "host" else [], max_new_tokens=MAX_NEW,
                       peers=[m for m, _, _ in chain if m != n], heartbeat_s=0.1, heartbeat_timeout_s=2.0,
                       weights_from_peer=True, room_key="room-key-0123456789abcdef")
        nodes.append(Node(c, make_stage("numpy", d, StageSpec(a, b, host=(n == "host")), precision=GGUF),
                          hub.transport(n), tok if n == "host" else None))
    host = nodes[0]

    async def go():
        for node in nodes:
            node.start()
        await _until_emitted(host, 6)
        hub.dead.add("w2")
        await asyncio.wait_for(host.done.wait(), 120)
        for node in nodes:
            await node.stop()
    asyncio.run(go())
    assert [host.answers[i] for i in range(len(PROMPTS))] == reference
    assert "w1: layers 22-30 copied and verified" in caplog.text
    # what went over the weights channel: layers 22-30 as the GGUF stores them (gguf-py's
    # table), the Q4_1 blocks unpacked; plus config.json and the float32 norms (maybe packed)
    reader = gguf.GGUFReader(str(src))
    layers = [t for t in reader.tensors if t.name.startswith("blk.") and 21 <= int(t.name.split(".")[1]) < 30]
    blocks = sum(int(t.n_bytes) for t in layers if t.tensor_type.name != "F32")
    floats = sum(int(t.n_bytes) for t in layers if t.tensor_type.name == "F32")
    assert {t.tensor_type.name for t in layers} == {"Q4_1", "F32"}
    sent = sum(size for s, r, ch, size in hub.sent if ch == "weights" and s == "host" and r == "w1")
    assert blocks < sent < (blocks + floats) * 1.01 + 10_000
    from planner.metrics import compute
    (rec,) = compute(merge_traces([n.trace_records() for n in nodes]))["recovery"]
    (cp,) = [c for c in rec["copies"] if c["device"] == "w1"]
    assert (cp["source"], cp["start"], cp["end"], cp["nbytes"]) == ("host", 21, 30, blocks + floats)
    assert isinstance(nodes[1].stage.layers[-1].wqkv.kind, str) and nodes[1].stage.layers[-1].wqkv.kind == "q4_1"
