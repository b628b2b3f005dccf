#!/usr/bin/env python3
"""GPU decode benchmark of the wgpu backend against a CUDA-graphed torch loop, in one run.

Run on the lent H200 (see docs/benchmarks.md, "NVIDIA H200", for the call) or anywhere with a
Vulkan adapter (``--quick`` on lavapipe checks the script itself; torch parts are skipped
without CUDA). SmolLM2-135M's shape with random N(0, 0.02) weights (speed does not depend on
the values; the same weights feed every engine). Writes one JSON file (``--out``) and prints a
table last:

1. wgpu decode tok/s per weight format (f32, f16, q8: runtime/precision.py): greedy steps after a 32-token
   prompt, context 32 -> 32 + steps, two ways: ``head_embed_forward`` per token (every token's id
   and residual read back before the next is encoded) and ``greedy_steps`` (the next token is
   encoded while the GPU runs; ids read back two steps late). Median of ``--reps`` runs.
2. torch, the same weights and context, float16 and float32 (f16, f32): one decode step (embedding, 30
   layers with a static KV cache, head, arg-max, position += 1) captured in a CUDA graph and
   replayed, also two ways: ``.item()`` after each replay, or ids kept on the GPU until the end.
3. Streaming bandwidth: torch copy (read + write) and sum (read), and a WGSL read kernel; the
   roofline of each format is (read bandwidth) / (bytes of weights per token).
4. GPU timestamps between the dispatches of one wgpu step: microseconds per kernel kind.
5. Correctness on that GPU: wgpu logits against the numpy reference at the same precision
   (the same stored weight values), and greedy ids of wgpu against torch float32.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.backends.base import StageSpec  # noqa: E402
from runtime.backends.numpy_backend import NumpyStage, rope_tables  # noqa: E402
from runtime.bench import SMOLLM2_135M, random_weights  # noqa: E402
from runtime.config import ModelConfig  # noqa: E402
from runtime.precision import Precision  # noqa: E402

CFG = SMOLLM2_135M
#: ``--shape`` choices: SmolLM2-135M, Llama-3.2-1B/3B's shapes and tiny (scripts/make_gguf.py SHAPES)
SHAPES = {
    "smollm2": SMOLLM2_135M,
    "tiny": ModelConfig(n_layers=3, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab=512, rope_theta=10000.0,
                        rms_eps=1e-5),  # make_gguf's tiny: a lavapipe check of the block formats' runs
    "llama-1b": ModelConfig(n_layers=16, hidden=2048, n_heads=32, n_kv_heads=8, ffn=8192, vocab=128256,
                            rope_theta=500000.0, rms_eps=1e-5),
    "llama-3b": ModelConfig(n_layers=28, hidden=3072, n_heads=24, n_kv_heads=8, ffn=8192, vocab=128256,
                            rope_theta=500000.0, rms_eps=1e-5),
    "llama-8b": ModelConfig(n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn=14336, vocab=128256,
                            rope_theta=500000.0, rms_eps=1e-5, tie_embeddings=False),
}
#: formats held as GGUF blocks (weights: gguf), from a random checkpoint scripts/make_gguf.py writes
GGUF_MIXES = ("q4_k", "q4_k_m", "q8_0", "q6_k", "q4_0", "q4_1")


def weight_bytes(cfg, fmt: str) -> int:
    """Bytes of matrices read per decode token (all layers + head; norms and the one embedding row are <0.1%);
    a GGUF mix: the file's stored bytes of the layers and the head (runtime.gguf_blocks.stored_sizes)."""
    if fmt in GGUF_MIXES:
        return GGUF_BYTES[fmt]
    H, F, KVD = cfg.hidden, cfg.ffn, cfg.kv_dim
    per_layer = (H * H + 2 * KVD * H) + H * H + 2 * F * H + F * H
    n = cfg.n_layers * per_layer + cfg.vocab * H
    return int(n * {"f32": 4, "f16": 2, "q8": 1.125}[fmt])


def med(xs):
    return float(statistics.median(xs))


# ------------------------------------------------------------------------------------------ wgpu
#: {mix: stored bytes read per token} of the GGUFs made by :func:`gguf_weights`
GGUF_BYTES: dict[str, int] = {}


def gguf_weights(mix: str, shape: str, tmp: Path) -> dict:
    """A random checkpoint of ``shape`` in ``mix`` written by scripts/make_gguf.py into ``tmp``,
    read back as stored (runtime.weights.load_range_native): ``{hf_name: array | QTensor}``."""
    import gguf

    from runtime import gguf_blocks as gb
    from runtime.weights import load_range_native, prepare_native
    from scripts import make_gguf

    path = tmp / f"random-{shape}-{mix}.gguf"
    if not path.is_file():
        make_gguf.write(path, shape, mix, seed=0)
    d = prepare_native(path, progress=None)
    sizes, emb, head = gb.stored_sizes(gb.tensor_table(gguf.GGUFReader(str(path))), CFG.n_layers)
    GGUF_BYTES[mix] = sum(sizes) + (head or emb)
    return load_range_native(d, 0, CFG.n_layers, True, True)


#: {format: logits after the prompt} of each format's run with the default kernels: a variant of the
#: same format is compared with it (``logits_rel_err_vs_default``, ``ids_equal_default``)
DEFAULT_RUN: dict[str, dict] = {}


def bench_wgpu(fmt: str, w: dict, a, prompt: list[int], ref_logits: np.ndarray | None, variant: bool = False) -> dict:
    from runtime.backends.wgpu_backend import WgpuStage

    t0 = time.perf_counter()
    stored = fmt in GGUF_MIXES
    st = WgpuStage(CFG, StageSpec(0, CFG.n_layers, True), dict(w), max_ctx=a.ctx,
                   precision=Precision(weights="gguf" if stored else fmt))
    out: dict = {"format": fmt, "init_s": time.perf_counter() - t0, "fast_kernels": st.fast,
                 "mv_shape": list(getattr(st, "mv", ())), "weight_bytes_per_token": weight_bytes(CFG, fmt),
                 "gpu_weight_buffer_bytes": st.bytes_weights}
    if st.fast:  # each weight format's one-token kernel form (rows a workgroup and a subgroup, loads, pieces, words)
        out["kernel_forms"] = {str(f): st.kernel_form(f) for f in sorted(st.formats or {fmt}, key=str)}
        out["attention_form"] = getattr(st, "attention_form", None)
    P = len(prompt)
    st.rollback(0)
    h = st.embed_forward(prompt, 0)
    logits = st.head(h[-1:])
    if variant and fmt in DEFAULT_RUN:
        d = DEFAULT_RUN[fmt]["logits"]
        out["logits_rel_err_vs_default"] = float(np.abs(logits - d).max() / np.abs(d).max())
    if ref_logits is not None:
        out["logits_rel_err_vs_numpy"] = float(np.abs(logits - ref_logits).max() / np.abs(ref_logits).max())
        out["argmax_equal_numpy"] = bool(logits.argmax() == ref_logits.argmax())
    # per-token synchronous steps
    sync = []
    ids_sync = None
    for r in range(a.reps):
        st.rollback(P)
        x = h
        ids = []
        tok, x = st.head_embed_forward(x, P)  # warm-up step (pipelines, first-use costs)
        ids.append(tok)
        t0 = time.perf_counter()
        for i in range(1, a.steps):
            tok, x = st.head_embed_forward(x, P + i)
            ids.append(tok)
        sync.append((a.steps - 1) / (time.perf_counter() - t0))
        ids_sync = ids
    out["decode_sync_tok_s"] = med(sync)
    out["decode_sync_all"] = sync
    out["ids"] = ids_sync
    # the residual after the last one-token step: the one-token kernels' own output (the logits
    # above come from the prompt's batch kernels), compared between a variant and its default
    x_last = np.asarray(x, np.float64)
    if not variant:
        DEFAULT_RUN[fmt] = {"logits": logits, "ids": ids_sync, "x": x_last}
    elif fmt in DEFAULT_RUN:
        out["ids_equal_default"] = ids_sync == DEFAULT_RUN[fmt]["ids"]
        d = DEFAULT_RUN[fmt]["x"]
        out["decode_residual_rel_err_vs_default"] = float(np.abs(x_last - d).max() / np.abs(d).max())
    # pipelined: per_submit steps per command buffer
    out["pipelined"] = {}
    for ps in a.per_submit:
        runs, stats = [], {}
        for r in range(a.reps):
            st.rollback(P)
            st.greedy_steps(h, P, 2)  # warm-up
            st.rollback(P)
            s1: dict = {}
            t0 = time.perf_counter()
            ids, _ = st.greedy_steps(h, P, a.steps, per_submit=ps, stats=s1)
            runs.append(a.steps / (time.perf_counter() - t0))
            stats = {k: v / a.steps * 1e6 for k, v in s1.items()}
            out.setdefault("ids_pipelined_equal_sync", True)
            out["ids_pipelined_equal_sync"] &= ids == ids_sync
        out["pipelined"][ps] = {"tok_s": med(runs), "all": runs, "cpu_us_per_token": stats}
    best = max(out["pipelined"], key=lambda k: out["pipelined"][k]["tok_s"])
    out["decode_pipelined_tok_s"] = out["pipelined"][1]["tok_s"] if 1 in out["pipelined"] else out["pipelined"][best]["tok_s"]
    out["decode_best_tok_s"] = out["pipelined"][best]["tok_s"]
    out["best_per_submit"] = best
    # CPU cost of encoding one step (no submit)
    if st.fast:
        plan = [st.fhead_x, st.fargmax] + st.plan1
        enc_t, fin_t = [], []
        for _ in range(30):
            t0 = time.perf_counter()
            enc = st.device.create_command_encoder()
            cp = enc.begin_compute_pass()
            st._encode_plan(cp, plan)
            cp.end()
            t1 = time.perf_counter()
            enc.finish()
            enc_t.append(t1 - t0)
            fin_t.append(time.perf_counter() - t1)
        out["dispatches_per_token"] = len(plan)
        out["cpu_encode_ms"] = med(enc_t) * 1e3
        out["cpu_finish_ms"] = med(fin_t) * 1e3
        # GPU timestamps: the whole step, then between dispatches
        if "timestamp-query-inside-passes" in st.device.features:
            st.rollback(P)
            out["gpu_step_us"] = st.step_gpu_us(P + a.steps // 2)
            out["gpu_us_per_step_4_in_one_submit"] = steps_gpu_us(st, P + a.steps // 2, 4)
            kt = st.kernel_times(P + a.steps // 2, reps=5)
            by: dict[str, float] = {}
            for lab, us in kt:
                by[lab] = by.get(lab, 0.0) + us
            out["gpu_us_by_kernel"] = by
            out["gpu_us_per_token"] = sum(by.values())
            out["gpu_us_first_layer"] = {lab: us for lab, us in kt[2:7]}
    bpt = out["weight_bytes_per_token"]
    out["achieved_GBps_best"] = bpt * out["decode_best_tok_s"] / 1e9
    del st
    return out


def pass_us(dev, encode, reps: int) -> list[float]:
    """GPU microseconds of ``reps`` command buffers: ``encode(encoder, query_set)`` records the work
    with timestamps 0 (start) and 1 (end) of ``query_set``; each is submitted and read back alone."""
    import wgpu

    U = wgpu.BufferUsage
    qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    res = dev.create_buffer(size=16, usage=U.QUERY_RESOLVE | U.COPY_SRC)
    rd = dev.create_buffer(size=16, usage=U.MAP_READ | U.COPY_DST)
    out = []
    for _ in range(reps):
        enc = dev.create_command_encoder()
        encode(enc, qs)
        enc.resolve_query_set(qs, 0, 2, res, 0)
        enc.copy_buffer_to_buffer(res, 0, rd, 0, 16)
        dev.queue.submit([enc.finish()])
        rd.map_sync(wgpu.MapMode.READ, 0, 16)
        t = np.frombuffer(bytes(rd.read_mapped(0, 16, copy=False)), np.uint64)
        rd.unmap()
        out.append(float(t[1] - t[0]) / 1e3)
    return out


def steps_gpu_us(st, pos: int, k: int, reps: int = 5) -> float:
    """GPU microseconds per step of ``k`` whole greedy steps encoded as ``greedy_steps`` does with
    ``per_submit=k`` (a pass each, the token id copied out between them; the position is not
    advanced), timestamps at the first pass's start and the last one's end, median of ``reps``."""
    import wgpu

    dev = st.device
    plan = [st.fhead_x, st.fargmax] + st.plan1
    hist = dev.create_buffer(size=256, usage=wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC)
    dev.queue.write_buffer(st.params, 0, np.array([1, pos, 0, 0], np.uint32))

    def encode(enc, qs):
        for i in range(k):
            tw = {"query_set": qs}
            if i == 0:
                tw["beginning_of_pass_write_index"] = 0
            if i == k - 1:
                tw["end_of_pass_write_index"] = 1
            cp = enc.begin_compute_pass(timestamp_writes=tw if len(tw) > 1 else None)
            st._encode_plan(cp, plan)
            cp.end()
            enc.copy_buffer_to_buffer(st.ids, 0, hist, 4 * i, 4)

    return med(pass_us(dev, encode, reps)) / k


def wgpu_read_bandwidth(nbytes: int = 1 << 29) -> dict:
    """GB/s of a WGSL kernel summing a ``nbytes`` buffer of random float32 (timestamps around the pass)."""
    import wgpu

    from runtime.backends.wgpu_backend import get_device

    _, dev = get_device()
    if "timestamp-query" not in dev.features:
        return {}
    n4 = nbytes // 16
    src = f"""
@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> O: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
  var s = vec4<f32>(0.0);
  let stride = nw.x * 256u;
  for (var i = gid.x; i < {n4}u; i += stride) {{ s += A[i]; }}
  O[gid.x] = s.x + s.y + s.z + s.w;
}}
"""
    U = wgpu.BufferUsage
    a = dev.create_buffer(size=nbytes, usage=U.STORAGE | U.COPY_DST)
    rng = np.random.default_rng(0)
    chunk = min(1 << 26, nbytes)
    for off in range(0, nbytes, chunk):
        dev.queue.write_buffer(a, off, rng.standard_normal(chunk // 4, dtype=np.float32))
    groups = 8192
    o = dev.create_buffer(size=groups * 256 * 4, usage=U.STORAGE)
    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=src), "entry_point": "main"})
    bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": a, "offset": 0, "size": nbytes}},
        {"binding": 1, "resource": {"buffer": o, "offset": 0, "size": o.size}}])

    def encode(enc, qs):
        cp = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(groups)
        cp.end()

    ts = [us * 1e-6 for us in pass_us(dev, encode, 12)]
    a.destroy()
    return {"bytes": nbytes, "median_s": med(ts[2:]), "read_GBps": nbytes / med(ts[2:]) / 1e9}


def wgpu_dispatch_floor(n: int = 142, groups=(1, 1024)) -> dict:
    """GPU microseconds a dispatch costs when it does next to nothing: ``n`` dispatches in one pass
    (as many as a Llama-3B step has), each adding 1 to one float per thread of a buffer the next one
    reads (so wgpu puts a barrier between them, as between a step's kernels), ``groups`` workgroups
    of 128 threads; timestamps around the pass, median of 10. ``{groups: us per dispatch}``."""
    import wgpu

    from runtime.backends.wgpu_backend import get_device

    _, dev = get_device()
    if "timestamp-query" not in dev.features:
        return {}
    src = """@group(0) @binding(0) var<storage, read_write> A: array<f32>;
@compute @workgroup_size(128)
fn main(@builtin(global_invocation_id) g: vec3<u32>) { A[g.x] = A[g.x] + 1.0; }
"""
    U = wgpu.BufferUsage
    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=src), "entry_point": "main"})
    out = {}
    for gr in groups:
        a = dev.create_buffer(size=gr * 128 * 4, usage=U.STORAGE)
        bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": a}}])

        def encode(enc, qs, bg=bg, gr=gr):
            cp = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
            cp.set_pipeline(pipe)
            for _ in range(n):
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(gr)
            cp.end()

        ts = pass_us(dev, encode, 12)
        out[str(gr)] = med(ts[2:]) / n
    return {"dispatches": n, "us_per_dispatch": out}


# ------------------------------------------------------------------------------------------ torch
def bench_torch(dtype_name: str, w: dict, a, prompt: list[int]) -> dict:
    import torch
    import torch.nn.functional as Fn

    dev = "cuda"
    dt = {"f16": torch.float16, "f32": torch.float32}[dtype_name]
    c = CFG
    H, NH, KV, D, F = c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn
    G, half, ctx = NH // KV, D // 2, a.ctx

    def T(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(dev, dt)

    layers = []
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        layers.append({
            "ln1": T(w[p + "input_layernorm.weight"]), "ln2": T(w[p + "post_attention_layernorm.weight"]),
            "wqkv": T(np.concatenate([w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"], w[p + "self_attn.v_proj.weight"]])),
            "wo": T(w[p + "self_attn.o_proj.weight"]),
            "wgu": T(np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])),
            "wd": T(w[p + "mlp.down_proj.weight"])})
    emb, norm = T(w["model.embed_tokens.weight"]), T(w["model.norm.weight"])
    kc = torch.zeros(c.n_layers, 1, KV, ctx, D, dtype=dt, device=dev)
    vc = torch.zeros_like(kc)
    cos, sin = (T(t) for t in rope_tables(c, ctx))
    ar = torch.arange(ctx, device=dev)
    eps = c.rms_eps
    use_sdpa = [True]

    def rms(x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dt) * g

    def rope(x, co, si):
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * co - x2 * si, x2 * co + x1 * si], -1)

    def step(tok, pos):
        x = emb[tok]  # [1, H]
        co, si = cos[pos], sin[pos]  # [1, half]
        mask = (ar <= pos).view(1, 1, 1, ctx)
        for li, L in enumerate(layers):
            qkv = rms(x, L["ln1"]) @ L["wqkv"].t()
            q = rope(qkv[:, : NH * D].view(NH, D), co, si)
            k = rope(qkv[:, NH * D : (NH + KV) * D].view(KV, D), co, si)
            v = qkv[:, (NH + KV) * D :].view(KV, D)
            kc[li, 0].index_copy_(1, pos, k.unsqueeze(1))
            vc[li, 0].index_copy_(1, pos, v.unsqueeze(1))
            if use_sdpa[0]:
                o = Fn.scaled_dot_product_attention(q.view(1, NH, 1, D), kc[li], vc[li], attn_mask=mask, enable_gqa=True)
            else:
                s = (q.view(KV, G, D) @ kc[li, 0].transpose(1, 2)).float() * (D ** -0.5)  # [KV, G, ctx]
                s = s.masked_fill(~mask.view(1, 1, ctx), float("-inf")).softmax(-1).to(dt)
                o = s @ vc[li, 0]
            x = x + o.reshape(1, H) @ L["wo"].t()
            gu = rms(x, L["ln2"]) @ L["wgu"].t()
            x = x + (Fn.silu(gu[:, :F]) * gu[:, F:]) @ L["wd"].t()
        return (rms(x, norm) @ emb.t()).float().argmax(-1)

    out = {"dtype": dtype_name, "torch": torch.__version__}
    with torch.no_grad():
        try:
            step(torch.tensor([prompt[0]], device=dev), torch.tensor([0], device=dev))
        except Exception as e:  # older torch: no enable_gqa
            out["sdpa_error"] = str(e)[:200]
            use_sdpa[0] = False
        out["attention"] = "sdpa" if use_sdpa[0] else "matmul"
        # prefill token by token (eager); the last prompt step predicts the first new token
        for i, t in enumerate(prompt):
            nxt = step(torch.tensor([t], device=dev), torch.tensor([i], device=dev))
        P = len(prompt)
        tok_buf = nxt.clone()
        pos_buf = torch.tensor([P], device=dev)
        hist = torch.zeros(ctx, dtype=torch.int64, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step(tok_buf, pos_buf)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o = step(tok_buf, pos_buf)
            hist.index_copy_(0, pos_buf, o)
            tok_buf.copy_(o)
            pos_buf.add_(1)
        first = nxt.clone()
        nosync, sync = [], []
        ids = None
        for r in range(a.reps):
            tok_buf.copy_(first)
            pos_buf.fill_(P)
            g.replay()  # warm-up / first step
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.steps - 1):
                g.replay()
            torch.cuda.synchronize()
            nosync.append((a.steps - 1) / (time.perf_counter() - t0))
            ids = [int(first.item())] + hist[P : P + a.steps - 1].tolist()
        for r in range(a.reps):
            tok_buf.copy_(first)
            pos_buf.fill_(P)
            g.replay()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.steps - 1):
                g.replay()
                int(tok_buf.item())
            sync.append((a.steps - 1) / (time.perf_counter() - t0))
    out.update(decode_nosync_tok_s=med(nosync), decode_sync_tok_s=med(sync), nosync_all=nosync, sync_all=sync, ids=ids)
    out["kernels_per_token_note"] = "one CUDA graph replay per token"
    del layers, kc, vc, g
    torch.cuda.empty_cache()
    return out


def torch_bandwidth() -> dict:
    import torch

    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()  # 1 GiB
    b = torch.empty_like(a)
    nb = a.numel() * 4

    def timed(fn, n=20):
        ts = []
        for _ in range(n):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e-3)
        return med(ts[3:])

    tc = timed(lambda: b.copy_(a))
    tr = timed(lambda: a.sum())
    del a, b
    torch.cuda.empty_cache()
    return {"copy_GBps_read_plus_write": 2 * nb / tc / 1e9, "sum_read_GBps": nb / tr / 1e9, "bytes": nb}


def env_info() -> dict:
    info = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "host_cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # no NVIDIA GPU here
        info["nvidia_smi"] = f"unavailable: {e}"
    try:
        import wgpu

        from runtime.backends.wgpu_backend import get_device

        ad, dev = get_device()
        info["wgpu"] = wgpu.__version__
        info["adapter"] = ad.summary
        info["adapter_info"] = {k: str(v) for k, v in ad.info.items()}
        info["device_features"] = sorted(dev.features)
        info["adapter_features"] = sorted(ad.features)
    except Exception as e:
        info["wgpu_error"] = str(e)
    return info


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_bench.json"))
    ap.add_argument("--steps", type=int, default=128, help="decode steps per run")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=256, help="KV cache positions (torch attends over all, masked)")
    ap.add_argument("--formats", default="f32,f16,q8")
    ap.add_argument("--variants", default="",
                    help="extra runs with environment settings, separated by ';': [FORMAT@]K=V[+K=V...] (FORMAT f16 unless "
                         "given), e.g. 'SPLITROOM_WGPU_ATT=512;q4_k@SPLITROOM_WGPU_WIDE=0+SPLITROOM_WGPU_MV=64,2'")
    ap.add_argument("--per-submit", default="1,4,16", help="greedy_steps per_submit values to time")
    ap.add_argument("--quick", action="store_true", help="tiny run (lavapipe check of this script)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="smollm2",
                    help="model shape (random weights); GGUF formats in --formats (q4_k, q4_k_m, q8_0, ...) are "
                         "random checkpoints of that shape written by scripts/make_gguf.py")
    ap.add_argument("--gguf-dir", default="/tmp/splitroom-gguf", help="where the random GGUFs are written")
    ap.add_argument("--numpy-ref", default="all",
                    help="which formats get the numpy reference logits: all, gguf (only the block formats; large shapes), "
                         "none, or a list such as q4_k,q4_k_m")
    ap.add_argument("--torch-dtypes", default="f16,f32", help="torch CUDA-graph loops to time ('' for none; the "
                    "bandwidth is still measured)")
    ap.add_argument("--stop-after-s", type=float, default=0.0,
                    help="start no further variant after this many seconds of the run (0: no limit); those left are listed")
    a = ap.parse_args(argv)
    T0 = time.perf_counter()
    global CFG
    CFG = SHAPES[a.shape]
    a.per_submit = [int(v) for v in a.per_submit.split(",")]
    if a.quick:
        a.steps, a.reps = 4, 1
    res: dict = {"env": env_info(), "config": {"steps": a.steps, "reps": a.reps, "ctx": a.ctx, "prompt": 32,
                                                "shape": a.shape, "model": {k: getattr(CFG, k) for k in
                                                                            ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab")}}}
    print(json.dumps(res["env"], indent=1)[:1500], flush=True)
    fmts = a.formats.split(",")
    w = random_weights(CFG, 0) if any(f not in GGUF_MIXES for f in fmts) or not a.no_torch else {}
    prompt = np.random.default_rng(1).integers(3, CFG.vocab, 32).tolist()
    tmp = Path(a.gguf_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPLITROOM_CACHE", str(tmp / "cache"))
    ws = {f: (lambda f=f: gguf_weights(f, a.shape, tmp)) if f in GGUF_MIXES else (lambda: w) for f in fmts}

    def save():
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))

    # numpy references (CPU) for the logits after the prompt, per format (same stored values)
    refs = {}
    for fmt in fmts:
        named = a.numpy_ref not in ("all", "gguf", "none")
        if (a.numpy_ref == "none" or (a.numpy_ref == "gguf" and fmt not in GGUF_MIXES)
                or (named and fmt not in a.numpy_ref.split(","))):
            refs[fmt] = None
            continue
        t0 = time.perf_counter()
        ref = NumpyStage(CFG, StageSpec(0, CFG.n_layers, True), dict(ws[fmt]()), max_ctx=64,
                         precision=Precision(weights="gguf" if fmt in GGUF_MIXES else fmt))
        refs[fmt] = ref.head(ref.embed_forward(prompt, 0)[-1:])
        res.setdefault("numpy_ref_s", {})[fmt] = time.perf_counter() - t0
        del ref
    have_cuda = False
    if not a.no_torch:
        try:
            import torch

            have_cuda = torch.cuda.is_available()
        except ImportError:
            pass
    if have_cuda:
        try:
            res["bandwidth_torch"] = torch_bandwidth()
        except Exception as e:
            res["bandwidth_torch_error"] = repr(e)
        save()
    try:
        res["bandwidth_wgpu"] = wgpu_read_bandwidth(1 << (24 if a.quick else 30))
    except Exception as e:
        res["bandwidth_wgpu_error"] = repr(e)
    try:
        res["dispatch_floor_wgpu"] = wgpu_dispatch_floor(CFG.n_layers * 5 + 2)
    except Exception as e:
        res["dispatch_floor_wgpu_error"] = repr(e)
    print("bandwidth", res.get("bandwidth_torch"), res.get("bandwidth_wgpu"), "dispatch floor", res.get("dispatch_floor_wgpu"), flush=True)
    save()
    res["wgpu"] = []
    for fmt in fmts:
        try:
            r = bench_wgpu(fmt, ws[fmt](), a, prompt, refs[fmt])
        except Exception as e:
            r = {"format": fmt, "error": repr(e)}
        print("wgpu", fmt, {k: v for k, v in r.items() if not isinstance(v, (list, dict))}, flush=True)
        res["wgpu"].append(r)
        save()
    for var in filter(None, a.variants.split(";")):
        if a.stop_after_s and time.perf_counter() - T0 > a.stop_after_s:
            res.setdefault("variants_not_run", []).append(var)
            print("wgpu variant", var, "not run: --stop-after-s", flush=True)
            continue
        vfmt, _, sets = var.rpartition("@")
        vfmt = vfmt or "f16"
        olds = {}
        for kv in sets.split("+"):
            k, v = kv.split("=", 1)
            olds.setdefault(k, os.environ.get(k))
            os.environ[k] = v
        try:
            if vfmt not in ws:
                ws[vfmt] = (lambda f=vfmt: gguf_weights(f, a.shape, tmp)) if vfmt in GGUF_MIXES else (lambda: w)
            r = bench_wgpu(vfmt, ws[vfmt](), a, prompt, refs.get(vfmt), variant=True)
        except Exception as e:
            r = {"format": vfmt, "error": repr(e)}
        r["variant"] = var
        print("wgpu variant", var, {k: v for k, v in r.items() if not isinstance(v, (list, dict))}, flush=True)
        res["wgpu"].append(r)
        save()
        for k, old_v in olds.items():
            if old_v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = old_v
    res["torch"] = []
    if have_cuda:
        for dt in filter(None, a.torch_dtypes.split(",")):
            try:
                r = bench_torch(dt, w, a, prompt)
            except Exception as e:
                r = {"dtype": dt, "error": repr(e)}
            print("torch", dt, {k: v for k, v in r.items() if not isinstance(v, (list, dict))}, flush=True)
            res["torch"].append(r)
            save()
    # summary
    bw = res.get("bandwidth_torch", {}).get("sum_read_GBps") or res.get("bandwidth_wgpu", {}).get("read_GBps")
    t16 = next((t for t in res["torch"] if t.get("dtype") == "f16" and "error" not in t), None)
    t32 = next((t for t in res["torch"] if t.get("dtype") == "f32" and "error" not in t), None)
    rows = []
    for r in res["wgpu"]:
        if "error" in r:
            rows.append(f"{r['format']:8s} ERROR {r['error'][:120]}")
            continue
        roof = bw * 1e9 / r["weight_bytes_per_token"] if bw else float("nan")
        r["roofline_tok_s"] = roof
        r["ratio_to_roofline"] = r["decode_best_tok_s"] / roof if bw else None
        if t16:
            r["ratio_pipelined_to_torch_f16_nosync"] = r["decode_pipelined_tok_s"] / t16["decode_nosync_tok_s"]
            r["ratio_best_to_torch_f16_nosync"] = r["decode_best_tok_s"] / t16["decode_nosync_tok_s"]
            r["ratio_sync_to_torch_f16_sync"] = r["decode_sync_tok_s"] / t16["decode_sync_tok_s"]
        if t32:
            r["ids_equal_torch_f32"] = sum(x == y for x, y in zip(r["ids"], t32["ids"])) / len(r["ids"])
        pipe = " ".join(f"{k}:{v['tok_s']:.0f}" for k, v in r["pipelined"].items())
        rows.append(f"{r['format']:8s} {r.get('variant', ''):24s} sync {r['decode_sync_tok_s']:6.1f}  pipelined(per_submit:tok/s) {pipe}"
                    f"  gpu step {r.get('gpu_step_us', float('nan')):6.1f} us  roof {roof:6.0f}  err {r.get('logits_rel_err_vs_numpy', float('nan')):.1e}")
        rows.append("   cpu us/token per_submit " + "; ".join(f"{k}: " + ",".join(f"{n[:-2]}={u:.0f}" for n, u in v["cpu_us_per_token"].items()) for k, v in r["pipelined"].items()))
    for t in res["torch"]:
        if "error" not in t:
            rows.append(f"torch {t['dtype']:8s} graph  sync {t['decode_sync_tok_s']:8.1f}  nosync {t['decode_nosync_tok_s']:8.1f} tok/s ({t['attention']})")
        else:
            rows.append(f"torch {t['dtype']} ERROR {t['error'][:200]}")
    save()
    print("\n".join(rows))
    for r in res["wgpu"]:
        if "gpu_us_by_kernel" in r:
            print(r["format"], r.get("variant", ""), {k: round(v, 1) for k, v in r["gpu_us_by_kernel"].items()})


if __name__ == "__main__":
    main()
