"""Stages holding a GGUF's blocks as stored (``weights: gguf``): the bundled SmolLM2 (Q4_1 layers,
Q8_0 embedding) gives the logits of the widened float32 stage; random Q4_K_M-mix checkpoints
written by scripts/make_gguf.py give the logits of float32 stages built from gguf-py's own
dequantized values; the bytes held are the file's bytes for the range; truncated and corrupted
files are refused with one line."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from runtime import gguf_blocks as gb  # noqa: E402
from runtime.backends import StageSpec, make_stage  # noqa: E402
from runtime.backends.numpy_backend import NumpyStage  # noqa: E402
from runtime.config import ModelConfig  # noqa: E402
from runtime.precision import Precision  # noqa: E402
from runtime.weights import WeightsError, load_range_native, prepare_native  # noqa: E402
from scripts import make_gguf  # noqa: E402

GGUF = Precision(weights="gguf")
IDS = [1, 504, 3458, 314, 260, 3575, 30]


def _widened(ws: dict) -> dict:
    """float32 copies of a native range, dequantized by gguf-py (the reference)."""
    out = {}
    for k, v in ws.items():
        if isinstance(v, gb.QTensor):
            t = gguf.GGMLQuantizationType.F16 if v.fmt == "f16" else gguf.GGMLQuantizationType(gb.FORMATS[v.fmt][0])
            out[k] = np.ascontiguousarray(gguf.quants.dequantize(v.data, t), dtype=np.float32)
        else:
            out[k] = v
    return out


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    from runtime.weights import ensure_safetensors, find_gguf

    return ensure_safetensors(progress=None), find_gguf()


@pytest.fixture(scope="module")
def smol_sizes(smol) -> dict[str, int]:
    """The bundled GGUF's bytes per tensor, from gguf-py's tensor table (read once: a
    ``GGUFReader`` of SmolLM2's 49,152 tokens and 48,900 merges takes about 9 s here)."""
    return {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(smol[1])).tensors}


def test_smollm2_q4_1_logits_equal_widened_float32(smol):
    d, src = smol
    assert prepare_native(src, progress=None) == d  # one folder per file
    spec = StageSpec(0, 30, True)
    f32 = make_stage("numpy", d, spec)
    nat = make_stage("numpy", d, spec, precision=GGUF)
    kinds = {nat.layers[0].wqkv.kind, nat.layers[0].wd.kind, nat.embedding.kind}
    assert kinds == {"q4_1", "q8_0"}
    ha, hb = f32.embed_forward(IDS, 0), nat.embed_forward(IDS, 0)
    a, b = f32.head(ha), nat.head(hb)
    # the same float32 weight values in both: equal within float32 rounding of the sums
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())
    assert (a.argmax(1) == b.argmax(1)).all()
    for _ in range(2):  # decode steps: one-row products
        ta, ha = f32.head_embed_forward(ha, f32.position)
        tb, hb = nat.head_embed_forward(hb, nat.position)
        assert ta == tb
        np.testing.assert_allclose(hb, ha, rtol=0, atol=1e-5 * np.abs(ha).max())


def test_held_bytes_are_the_files_bytes(smol, smol_sizes):
    d, _ = smol
    sizes = smol_sizes
    for spec in (StageSpec(0, 10, True), StageSpec(10, 30, False)):
        st = make_stage("numpy", d, spec, precision=GGUF)
        held = sum(m.nbytes for L in st.layers for m in (L.wqkv, L.wo, L.wgu, L.wd))
        held += sum(L.ln1.nbytes + L.ln2.nbytes for L in st.layers)
        want = sum(n for k, n in sizes.items() if k.startswith("blk.") and spec.start <= int(k.split(".")[1]) < spec.end)
        if spec.host:
            held += st.embedding.nbytes + st.norm.nbytes
            want += sizes["token_embd.weight"] + sizes["output_norm.weight"]
        assert held == want


@pytest.mark.parametrize("mix", ["q4_k_m", "q4_0", "q8_0", "f16"])
def test_random_checkpoint_matches_gguf_py_dequantized(tmp_path, monkeypatch, mix):
    monkeypatch.setenv("SPLITROOM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / f"tiny-{mix}.gguf"
    make_gguf.write(path, "tiny", mix, seed=3)
    d = prepare_native(path, progress=None)
    cfg = ModelConfig.load(d)
    assert (cfg.n_layers, cfg.hidden, cfg.vocab) == make_gguf.SHAPES["tiny"][0:2] + (make_gguf.SHAPES["tiny"][5],)
    spec = StageSpec(0, cfg.n_layers, True)
    ws = load_range_native(d, 0, cfg.n_layers, True, True)
    if mix == "q4_k_m":
        assert {ws["model.layers.0.self_attn.v_proj.weight"].fmt, ws["model.layers.1.self_attn.v_proj.weight"].fmt} == {"q6_k", "q4_k"}
    ref = NumpyStage(cfg, spec, _widened(ws))
    nat = NumpyStage(cfg, spec, load_range_native(d, 0, cfg.n_layers, True, True), precision=GGUF)
    ids = [3, 17, 250, 9, 400]
    a = ref.head(ref.embed_forward(ids, 0))
    b = nat.head(nat.embed_forward(ids, 0))
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())
    x = ref.embed([7])  # a decode step (streamed products) after the prefill
    np.testing.assert_allclose(nat.forward(nat.embed([7]), nat.position), ref.forward(x, ref.position),
                               rtol=0, atol=1e-5 * float(np.abs(x).max() + 1))


def test_truncated_and_corrupted_files_are_one_line(tmp_path, monkeypatch):
    """A random 3-layer checkpoint of Q4_1 blocks (SmolLM2's layer format), cut in half
    and with one block's scale made infinite."""
    monkeypatch.setenv("SPLITROOM_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "tiny-q4_1.gguf"
    make_gguf.write(src, "tiny", "q4_1", seed=5)
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f, open(cut, "wb") as g:
        g.write(f.read(src.stat().st_size // 2))
    with pytest.raises(WeightsError) as e:
        d = prepare_native(cut, progress=None)
        load_range_native(d, 0, 3, True, True)
    assert "\n" not in str(e.value) and "cut.gguf" in str(e.value)

    bad = tmp_path / "bad.gguf"
    shutil.copyfile(src, bad)
    info = gb.tensor_table(gguf.GGUFReader(str(bad)))["blk.2.ffn_up.weight"]
    with open(bad, "r+b") as f:  # block 3's scale d := +inf
        f.seek(info.offset + 3 * 20)
        f.write(np.array([np.inf], "<f2").tobytes())
    d = prepare_native(bad, progress=None)
    load_range_native(d, 0, 2, False, False)  # the layers before it are fine
    with pytest.raises(WeightsError, match=r"^bad\.gguf: blk\.2\.ffn_up\.weight: q4_1 block 3 has a non-finite scale$"):
        load_range_native(d, 0, 3, False, False)


def test_safetensors_checkpoint_has_no_blocks(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    from runtime.weights import gguf_source

    with pytest.raises(WeightsError, match="was not made from a GGUF file"):
        gguf_source(tmp_path)


def test_scenario_weights_gguf_counts_the_files_bytes(smol_sizes, tmp_path):
    """The planner's layer sizes for weights: gguf are the file's bytes per layer (Q4_1 blocks,
    F32 norms) and its Q8_0 embedding, read here from gguf-py's tensor table."""
    from splitroom.scenario import ScenarioError, load

    per = [0] * 30
    for name, n in smol_sizes.items():
        if name.startswith("blk."):
            per[int(name.split(".")[1])] += n
    emb = smol_sizes["token_embd.weight"]
    assert emb == 49152 * 576 // 32 * 34  # Q8_0: 34 bytes per 32 weights
    s = load("scenarios/home.yaml", ["weights=gguf"])
    assert s.weights == "gguf"
    assert s.model.layer_sizes == tuple(per) and s.model.layer_bytes == -(-sum(per) // 30)
    assert s.model.embedding_bytes == emb and s.model.head_bytes == 0
    f32 = load("scenarios/home.yaml", [])
    assert f32.model.layer_bytes > 6 * s.model.layer_bytes  # float32 vs 5 bits a weight
    with pytest.raises(ScenarioError, match="weights.*needs a GGUF file"):
        load("scenarios/home.yaml", ["weights=gguf", "model=qwen2.5-7b"])
