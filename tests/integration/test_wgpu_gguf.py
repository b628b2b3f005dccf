"""GGUF blocks held as stored on the wgpu backend (lavapipe in CI): every format's WGSL loader
against gguf-py's own ``gguf.quants.dequantize`` on random blocks, and whole stages of random
checkpoints (scripts/make_gguf.py, Q4_K_M's mix of formats included) against the numpy stage
holding the same blocks; the GPU buffers hold the file's bytes (plus at most 4 bytes a tensor)."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
wgpu_backend = pytest.importorskip("runtime.backends.wgpu_backend")

from runtime import gguf_blocks as gb  # noqa: E402
from runtime.backends import wgsl  # noqa: E402
from runtime.backends.base import StageSpec  # noqa: E402
from runtime.backends.numpy_backend import NumpyStage  # noqa: E402
from runtime.config import ModelConfig  # noqa: E402
from runtime.precision import Precision  # noqa: E402
from runtime.weights import load_range_native, prepare_native  # noqa: E402
from scripts import make_gguf  # noqa: E402
from tests.unit.test_gguf_blocks import rand_q, ref  # noqa: E402
from tests.wgpu_models import run_compute  # noqa: E402

pytestmark = pytest.mark.slow
GGUF = Precision(weights="gguf")


@pytest.fixture(scope="module")
def device():
    try:
        return wgpu_backend.get_device()[1]
    except wgpu_backend.WgpuUnavailable as e:
        pytest.skip(str(e))


def run_loader(device, fmt, blocks: np.ndarray, n4: int) -> np.ndarray:
    """``Y[i] = ld_W(i)`` for every vec4 ``i`` of a matrix in ``fmt`` (a name or a tuple of parts)."""
    src = wgsl.weight_decl("W", 1, fmt) + f"""
@group(0) @binding(2) var<storage, read_write> Y: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
  if (g.x < {n4}u) {{ Y[g.x] = ld_W(g.x); }}
}}
"""
    parts = blocks if isinstance(fmt, tuple) else [blocks]
    raws = {wgsl.part_binding(1, k): np.concatenate([b.reshape(-1), np.zeros(4 + (-b.size) % 4, np.uint8)])
            for k, b in enumerate(parts)}
    return run_compute(device, src, raws, 2, n4 * 16, -(-n4 // 64))


@pytest.mark.parametrize("fmt", tuple(gb.FORMATS))
def test_wgsl_loader_matches_gguf_py(device, fmt):
    q = rand_q(fmt, 6, 512, np.random.default_rng(11))
    want = ref(q).reshape(-1)
    got = run_loader(device, fmt, q.data, want.size // 4)
    # the same products of a float16 scale and small integers: equal up to float32 rounding
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)


def test_wgsl_loader_of_mixed_parts(device):
    rng = np.random.default_rng(12)
    a, b = rand_q("q4_k", 4, 256, rng), rand_q("q6_k", 2, 256, rng)
    want = np.concatenate([ref(a), ref(b)]).reshape(-1)
    got = run_loader(device, (("q4_k", 4 * 256 // 4), ("q6_k", 2 * 256 // 4)), [a.data, b.data], want.size // 4)
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)


def run_matvec(device, q, x: np.ndarray, g: np.ndarray, **form) -> np.ndarray:
    """``Y = rmsnorm(x, g) @ W.T`` by one :func:`wgsl.matvec_src` (``norm``, no fusion else) on the
    Q4_K matrix ``q`` held as stored; ``form``: R, WGS, rs, words, lane_words, wide."""
    N, K = q.shape
    R, WGS = form.pop("R"), form.pop("WGS")
    src = wgsl.matvec_src(K, N, R, WGS, "q4_k", norm=True, eps=1e-5, **form)
    raw = np.concatenate([q.data.reshape(-1), np.zeros(4 + (-q.data.size) % 4, np.uint8)])
    return run_compute(device, src, {0: x.astype(np.float32), 1: raw, 4: g.astype(np.float32)}, 2, N * 4, N // R)


# Q4_K one-token forms: (words in flight, words a lane, rows a subgroup, pieces); rows of 5 blocks
# (160 words) leave the last round part-filled on 8-lane subgroups, so clamped words are masked
MATVEC_FORMS = [(4, 1, 1, 0), (3, 2, 2, 0), (2, 4, 4, 0), (0, 1, 2, 1), (0, 1, 1, 8)]


def q4k_case(K: int):
    """16 random Q4_K rows of ``K`` weights, x, the norm weight, and ``rmsnorm(x, g) @ W.T`` from
    gguf-py's dequantized rows (products in float64)."""
    rng = np.random.default_rng(13)
    q = rand_q("q4_k", 16, K, rng)
    x, g = rng.standard_normal(K), rng.uniform(0.5, 1.5, K)
    xn = (x / np.sqrt(np.mean(x * x) + 1e-5)) * g
    return q, x, g, ref(q).astype(np.float64) @ xn


@pytest.mark.parametrize("words,lane_words,rs,wide", MATVEC_FORMS)
def test_q4k_matvec_forms_match_gguf_py(device, words, lane_words, rs, wide):
    q, x, g, want = q4k_case(1280)
    got = run_matvec(device, q, x, g, R=4 * rs, WGS=64, rs=rs, words=words, lane_words=lane_words, wide=wide)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


# the workgroup-shared form: (K, rows a workgroup, most threads, threads it has). A piece is 16 code
# bytes (32 weights): K = 3072 is 96 pieces, one a thread; K = 1280 is 40, on 64 threads (24 masked)
# or 32 threads with 2 each (the second round part-filled); K = 512 is 16 on 32 threads
SPLIT_FORMS = [(3072, 4, 256, 96), (1280, 2, 256, 64), (1280, 8, 32, 32), (512, 1, 256, 32)]


@pytest.mark.parametrize("mant", [False, True], ids=["exact-codes", "mantissa-codes"])
@pytest.mark.parametrize("K,rows,wg,threads", SPLIT_FORMS)
def test_q4k_split_matvec_matches_gguf_py(device, K, rows, wg, threads, mant):
    """The shared form against gguf-py's dequantized rows, with the codes made floats as
    ``2^23 + c - 2^23`` or through the mantissa (``1 + c/16``, SPLITROOM_WGPU_Q4K_MANT=1)."""
    assert wgsl.split_pieces("q4_k", K) == ("q4_k", K // 32) and wgsl.split_threads(K // 32, wg) == threads
    q, x, g, want = q4k_case(K)
    got = run_matvec(device, q, x, g, R=rows, WGS=64, split=rows, split_wg=wg, mant=mant)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


# SPLITROOM_WGPU_WIDE, _WORDS, _LANE_WORDS and _RS only change the one-token (subgroup) kernels:
# the batch kernels (fast "0") have no such forms, so the other forms are paired with fast "1" only.
# "" is the defaults (docs/runtime.md): the workgroup-shared form, 4 rows a workgroup, for Q4_K,
# Q6_K, Q8_0 and Q4_1 (Q4_0 and the mixed QKV parts of Q4_K_M keep the subgroup forms); the other
# cases name SPLIT=0 (the subgroup forms: Q4_K as code words, 4 groups of 2 a lane, Q4_K and Q6_K
# rows 2 a subgroup; WORDS=0 gives the 16-byte pieces (WIDE=8) or the vec4 loader (WIDE=0))
STAGE_CASES = [(mix, "", fast) for mix in ("q4_k_m", "q4_1", "q8_0", "q4_0", "q4_k") for fast in ("1", "0")]
STAGE_CASES += [("q4_k", "WORDS=0+RS=1", "1"), ("q4_k", "WORDS=0+WIDE=0+RS=1", "1"),
                # Q4_K as u32 code words: 2/4/8 in flight, 1/2/4 words a lane, 1/2/4 rows a subgroup
                ("q4_k", "WORDS=4+LANE_WORDS=1+RS=1", "1"), ("q4_k", "WORDS=2+LANE_WORDS=1", "1"),
                ("q4_k", "WORDS=8+LANE_WORDS=1+RS=4", "1"), ("q4_k", "WORDS=2+LANE_WORDS=4", "1"),
                # the 16-byte pieces with 2 and 4 rows a subgroup
                ("q4_k", "WORDS=0+WIDE=2+RS=2", "1"), ("q4_k", "WORDS=0+WIDE=1+RS=4", "1"),
                # several rows a subgroup with the vec4 loaders (Q4_K_M: Q6_K, the QKV of mixed
                # parts stays one row a subgroup)
                ("q4_k_m", "RS=1", "1"), ("q8_0", "RS=2", "1"), ("q4_1", "RS=4", "1"), ("q4_0", "RS=2", "1"),
                # the workgroup-shared form: Q4_K in 16-byte code pieces, the others (Q6_K, the mixed
                # QKV parts of Q4_K_M, Q8_0, Q4_0, Q4_1) through their vec4 loaders
                ("q4_k", "SPLIT=4", "1"), ("q4_k", "SPLIT=8+SPLIT_WG=32", "1"), ("q4_k_m", "SPLIT=2", "1"),
                ("q8_0", "SPLIT=4", "1"), ("q4_0", "SPLIT=1", "1"), ("q4_1", "SPLIT=8", "1"), ("q6_k", "SPLIT=4", "1"),
                # Q4_K's codes through the mantissa, attention inside the QKV product's dispatch (Q4_K_M:
                # its QKV of mixed parts has no shared form, so its attention stays a dispatch of its own)
                ("q4_k", "SPLIT=4+Q4K_MANT=1+FUSE_ATT=1", "1"), ("q4_k", "SPLIT=2+FUSE_ATT=1", "1"),
                ("q4_k_m", "SPLIT=4+Q4K_MANT=1+FUSE_ATT=1", "1")]
#: the one-token subgroup forms with SPLIT=0 and nothing else set (docs/runtime.md, measured on the H200 2026-12-02)
DEFAULT_FORM = {"q4_k": {"WORDS": "4", "LANE_WORDS": "2", "RS": "2"}, "q6_k": {"WORDS": "0", "RS": "2"}}
#: rows a workgroup of the workgroup-shared form when nothing is set (measured on the H200 2026-12-03)
DEFAULT_SPLIT = {"q4_k": 4, "q6_k": 4, "q8_0": 4, "q4_1": 4}


@pytest.mark.parametrize("mix,settings,fast", STAGE_CASES)
def test_stage_matches_numpy_blocks(device, tmp_path, monkeypatch, mix, settings, fast):
    monkeypatch.setenv("SPLITROOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPLITROOM_WGPU_FAST", fast)
    for k in ("WIDE", "WORDS", "LANE_WORDS", "RS", "SPLIT", "SPLIT_WG", "Q4K_MANT", "FUSE_ATT"):
        monkeypatch.delenv(f"SPLITROOM_WGPU_{k}", raising=False)
    env = dict(kv.split("=") for kv in filter(None, settings.split("+")))
    if settings and "SPLIT" not in env:  # a case of the subgroup forms
        env["SPLIT"] = "0"
    for k, v in env.items():  # e.g. WORDS=0+WIDE=0: Q4_K one-token products with the vec4 loader
        monkeypatch.setenv(f"SPLITROOM_WGPU_{k}", v)
    path = tmp_path / f"tiny-{mix}.gguf"
    make_gguf.write(path, "tiny", mix, seed=5)
    d = prepare_native(path, progress=None)
    cfg = ModelConfig.load(d)
    spec = StageSpec(0, cfg.n_layers, True)
    cpu = NumpyStage(cfg, spec, load_range_native(d, 0, cfg.n_layers, True, True), max_ctx=64, precision=GGUF)
    ws = load_range_native(d, 0, cfg.n_layers, True, True)
    file_bytes = sum(v.nbytes for v in ws.values())
    gpu = wgpu_backend.WgpuStage(cfg, spec, ws, max_ctx=64, precision=GGUF)
    if fast == "1" and not gpu.fast:
        pytest.skip("adapter without subgroup operations")
    if fast == "1":  # the form asked for is the one built (rows divide: tiny's 256 pair rows)
        for f in ({"q4_k_m": ("q4_k", "q6_k")}.get(mix, (mix,))):
            want = {**DEFAULT_FORM.get(f, {}), **env}
            form = gpu.kernel_form(f)
            split = int(env["SPLIT"]) if "SPLIT" in env else DEFAULT_SPLIT.get(f, 0)
            if split:  # the workgroup-shared form, with that many rows a workgroup
                assert (form["split"], form["R"], form["split_wg"]) == (split, split, int(env.get("SPLIT_WG", "256")))
                continue
            assert form.get("split", 0) == 0
            assert form["rs"] == int(want.get("RS", "1"))
            assert form["words"] == (int(want.get("WORDS", "0")) if f == "q4_k" else 0)
            assert form["lane_words"] == (int(want.get("LANE_WORDS", "1")) if form["words"] else 1)
    if fast == "1":  # attention fused into the QKV product where asked for and the QKV has the shared form
        labels = [lab for lab, *_ in gpu.plan1]
        assert labels.count("qkv_rope_att") + labels.count("attention") == cfg.n_layers
        if env.get("FUSE_ATT") != "1":
            assert labels.count("attention") == cfg.n_layers
        elif mix == "q4_k":
            assert labels.count("qkv_rope_att") == cfg.n_layers
        else:  # Q4_K_M: layers with Q6_K v rows (mixed QKV parts) keep their attention dispatch, the others fuse
            assert labels.count("attention") >= 1 and labels.count("qkv_rope_att") >= 1
    rope_bytes = 64 * cfg.head_dim * 4  # the cos | sin table, [max_ctx, head_dim] float32
    assert file_bytes <= gpu.bytes_weights - rope_bytes <= file_bytes + 8 * (7 * cfg.n_layers + 1)
    ids = [3, 17, 250, 9, 400, 1, 2, 3, 4, 5]
    a, b = gpu.head(gpu.embed_forward(ids, 0)), cpu.head(cpu.embed_forward(ids, 0))
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * np.abs(b).max())
    for _ in range(3):  # one-token steps (the subgroup kernels where the adapter has them)
        ta, ha = gpu.head_embed_forward(gpu.embed([7]), gpu.position)
        tb, hb = cpu.head_embed_forward(cpu.embed([7]), cpu.position)
        assert ta == tb
        np.testing.assert_allclose(ha, hb, rtol=0, atol=2e-5 * np.abs(hb).max())


def test_wide_settings_parse_and_refuse():
    assert wgpu_backend.wide_settings("q4_k:8") == {"q4_k": 8}
    assert wgpu_backend.wide_settings("f16:4, q4_k:16") == {"f16": 4, "q4_k": 16}
    assert wgpu_backend.wide_settings("0") == {"f16": 0, "q4_k": 0}
    of = wgpu_backend.WideOf({"q4_k": 8})
    assert of["q4_k"] == 8 and of["f16"] == 0 and of[(("q4_k", 64), ("q6_k", 64))] == 0
    with pytest.raises(ValueError, match="SPLITROOM_WGPU_WIDE"):
        wgpu_backend.wide_settings("q4_k:many")
    for parse, var in ((wgpu_backend.wide_settings, "SPLITROOM_WGPU_WIDE"),
                       (wgpu_backend.words_settings, "SPLITROOM_WGPU_WORDS"),
                       (wgpu_backend.rows_settings, "SPLITROOM_WGPU_RS")):
        with pytest.raises(ValueError, match=f"{var}.*negative"):
            parse("q4_k:-1")
    assert wgpu_backend.words_settings("4") == {"q4_k": 4}
    assert wgpu_backend.split_settings("f16:4, q4_k:2") == {"f16": 4, "q4_k": 2}
    assert wgpu_backend.split_settings("0")["q6_k"] == 0
    with pytest.raises(ValueError, match="SPLITROOM_WGPU_SPLIT"):
        wgpu_backend.split_settings("f16=4")
    assert wgpu_backend.rows_settings("f16:2, q4_k:4") == {"f16": 2, "q4_k": 4}
    assert wgpu_backend.rows_settings("2")["q6_k"] == 2 and wgpu_backend.RowsOf({})[("q4_k", 8)] == 1
    with pytest.raises(ValueError, match="SPLITROOM_WGPU_RS"):
        wgpu_backend.rows_settings("q4_k:0")
    with pytest.raises(ValueError, match="SPLITROOM_WGPU_WORDS"):
        wgpu_backend.words_settings("q4_k=4")
