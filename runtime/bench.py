"""Speed measurements of a backend on this machine: ``python -m runtime.bench --backend wgpu``.

Prints one JSON object: decode tokens/s (greedy, one full stage, the host's fused step),
ms per layer (one-token ``forward`` through all layers / layer count), prefill tokens/s
(16- and 64-token chunks), and the adapter. ``--random`` uses random weights of the real
shapes (speed does not depend on the values) when the GGUF is not available.
pytest-benchmark versions of these live in tests/benchmark/test_bench_model.py.

``--cpu-report`` (numpy) measures, in one run, the limit and the CPU backend's figures:
the **matrix-vector limit** (a BLAS ``sgemv`` streaming a 512 MiB float32 matrix, far larger
than any cache, GB/s), then per weight precision (f32, f16, q8) decode tok/s and its bytes per
token over that limit, a **verify pass** of k+1 positions over a one-token pass, and the
**head** over 1 and 5 rows against the time the limit needs to stream the head's bytes; and,
when ``llama_cpp`` (llama-cpp-python) is importable, llama.cpp's decode on the GGUF the
model was converted from, with the same thread count. Each figure is the median of ``--reps``
(>= 5) runs with its min and max. docs/benchmarks.md records the results.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from .backends.base import StageSpec
from .config import ModelConfig
from .weights import range_tensor_names

SMOLLM2_135M = ModelConfig(n_layers=30, hidden=576, n_heads=9, n_kv_heads=3, ffn=1536, vocab=49152, rope_theta=100000.0, rms_eps=1e-5)


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 weights of the right names and shapes: N(0, 0.02) matrices, norms of ones."""
    rng = np.random.default_rng(seed)
    H, F, KV = cfg.hidden, cfg.ffn, cfg.kv_dim
    shapes = {
        "input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
        "self_attn.q_proj.weight": (H, H), "self_attn.k_proj.weight": (KV, H), "self_attn.v_proj.weight": (KV, H),
        "self_attn.o_proj.weight": (H, H), "mlp.gate_proj.weight": (F, H), "mlp.up_proj.weight": (F, H),
        "mlp.down_proj.weight": (H, F),
    }
    out = {}
    for name in range_tensor_names(cfg, 0, cfg.n_layers, True, True):
        if name == "model.embed_tokens.weight":
            shape = (cfg.vocab, H)
        elif name == "model.norm.weight":
            shape = (H,)
        else:
            shape = shapes[name.split(".", 3)[3]]
        if len(shape) == 1:
            out[name] = np.ones(shape, np.float32)
        else:
            out[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
    return out


def build(backend: str, random: bool, max_ctx: int = 1024):
    """A full-model host stage of ``backend`` (real weights unless ``random``)."""
    if random:
        cfg, w = SMOLLM2_135M, random_weights(SMOLLM2_135M)
        spec = StageSpec(0, cfg.n_layers, True)
        if backend == "numpy":
            from .backends.numpy_backend import NumpyStage

            return NumpyStage(cfg, spec, w, max_ctx=max_ctx)
        from .backends.wgpu_backend import WgpuStage

        return WgpuStage(cfg, spec, w, max_ctx=max_ctx)
    from .backends import make_stage
    from .weights import ensure_safetensors

    d = ensure_safetensors()
    return make_stage(backend, d, StageSpec(0, ModelConfig.load(d).n_layers, True), max_ctx=max_ctx)


def measure(stage, decode_tokens: int = 64, prompt_len: int = 32, reps: int = 5) -> dict:
    """Time decode, one-token forward (ms per layer) and prefill chunks on ``stage`` (host, all layers)."""
    cfg = stage.cfg
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, cfg.vocab, prompt_len).tolist()
    res: dict = {}
    # decode: prompt, then greedy steps (fused host step)
    stage.rollback(0)
    h = stage.embed_forward(prompt, 0)
    pos = stage.position
    tok, h = stage.head_embed_forward(h, pos)  # warm-up
    pos += 1
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        tok, h = stage.head_embed_forward(h, pos)
        pos += 1
    dt = time.perf_counter() - t0
    res["decode_tok_s"] = decode_tokens / dt
    res["decode_ms_per_token"] = dt / decode_tokens * 1e3
    res["decode_context"] = [prompt_len, pos]
    # one-token forward through all layers (no head): ms per layer
    x = rng.standard_normal((1, cfg.hidden)).astype(np.float32)
    stage.rollback(prompt_len)
    best = []
    for _ in range(reps):
        stage.rollback(prompt_len)
        t0 = time.perf_counter()
        for i in range(8):
            stage.forward(x, prompt_len + i)
        best.append((time.perf_counter() - t0) / 8)
    res["forward_1tok_ms"] = min(best) * 1e3
    res["ms_per_layer"] = min(best) * 1e3 / max(1, stage.end - stage.start)
    # prefill chunks from position 0
    for n in (16, 64):
        ids = rng.integers(3, cfg.vocab, n).tolist()
        ts = []
        for _ in range(reps):
            stage.rollback(0)
            t0 = time.perf_counter()
            stage.embed_forward(ids, 0)
            ts.append(time.perf_counter() - t0)
        res[f"prefill{n}_tok_s"] = n / min(ts)
    return res


def _stats(ts: list[float]) -> dict:
    """``{"median", "min", "max", "n"}`` of a list of timings (seconds)."""
    return {"median": float(np.median(ts)), "min": float(min(ts)), "max": float(max(ts)), "n": len(ts)}


def _time(fn, reps: int, warmup: int = 1) -> dict:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return _stats(ts)


def mv_limit(mib: int = 512, reps: int = 7) -> dict:
    """The practical memory-bound limit: ``y = A @ x`` (BLAS sgemv) over a ``mib`` MiB float32
    matrix ``A [rows, 4096]``, which no cache holds. Returns GB/s (median, min, max over reps)."""
    cols = 4096
    a = np.random.default_rng(0).standard_normal((mib * 2**20 // (4 * cols), cols), dtype=np.float32)
    x = np.ones(cols, np.float32)
    t = _time(lambda: a @ x, reps)
    gb = a.nbytes / 1e9
    return {"matrix_mib": mib, "gbps": gb / t["median"], "gbps_min": gb / t["max"], "gbps_max": gb / t["min"],
            "seconds": t}


def weight_bytes(stage) -> int:
    """Bytes of weights one decoded token reads on ``stage`` (numpy): every layer's matrices and
    the head (norm vectors and the one embedding row are negligible and left out)."""
    total = sum(m.nbytes for L in stage.layers for m in (L.wqkv, L.wo, L.wgu, L.wd))
    return total + (stage.lm_head.nbytes if stage.lm_head is not None else 0)


def cpu_report(precisions=("f32", "f16", "q8"), reps: int = 7, decode_tokens: int = 32, prompt_len: int = 64,
               ks=(1, 4, 8), random: bool = False, llama: bool = True) -> dict:
    """The CPU backend's figures, as ratios to a same-run limit (see module doc)."""
    from .precision import Precision

    out: dict = {"limit": mv_limit(reps=reps)}
    lim = out["limit"]["gbps"] * 1e9
    for name in precisions:
        p = Precision(weights=name)
        if random:
            from .backends.numpy_backend import NumpyStage
            cfg = SMOLLM2_135M
            stage = NumpyStage(cfg, StageSpec(0, cfg.n_layers, True), random_weights(cfg), max_ctx=1024, precision=p)
        else:
            from .backends import make_stage
            from .weights import ensure_safetensors
            d = ensure_safetensors()
            stage = make_stage("numpy", d, StageSpec(0, ModelConfig.load(d).n_layers, True), max_ctx=1024, precision=p)
        cfg = stage.cfg
        rng = np.random.default_rng(1)
        prompt = rng.integers(3, cfg.vocab, prompt_len).tolist()
        stage.rollback(0)
        h0 = stage.embed_forward(prompt, 0)
        wb = weight_bytes(stage)
        kvb = 2 * cfg.n_layers * cfg.kv_dim * np.dtype(stage._kv_dtype).itemsize * (prompt_len + decode_tokens // 2)
        r: dict = {"weight_bytes_per_token": wb}

        def decode():
            stage.rollback(prompt_len)
            h, pos = h0, prompt_len
            for _ in range(decode_tokens):
                _, h = stage.head_embed_forward(h, pos)
                pos += 1
        t = _time(decode, reps)
        tok_s = decode_tokens / t["median"]
        r["decode"] = {"tok_s": tok_s, "tok_s_min": decode_tokens / t["max"], "tok_s_max": decode_tokens / t["min"],
                       "bytes_per_token": wb + kvb, "of_limit": tok_s * (wb + kvb) / lim,
                       "limit_tok_s": lim / (wb + kvb)}
        # one pass of n positions through all layers (no head), after the prompt
        x = rng.standard_normal((max(ks) + 1, cfg.hidden)).astype(np.float32)
        passes = {}
        for n in sorted({1, *(k + 1 for k in ks)}):
            def fwd(n=n):
                stage.rollback(prompt_len)
                stage.forward(x[:n], prompt_len)
            passes[n] = _time(fwd, reps)
        one = passes[1]["median"]
        r["pass_ms"] = {str(n): {k: v * 1e3 if k != "n" else v for k, v in t.items()} for n, t in passes.items()}
        r["verify_over_one"] = {f"k={n - 1}": passes[n]["median"] / one for n in passes if n > 1}
        r["one_pass_of_limit"] = (wb - stage.lm_head.nbytes) / lim / one
        # the output head over 1 and 5 rows
        hb = stage.lm_head.nbytes
        heads = {}
        for n in (1, 5, 9):
            xs = x[:n].copy()
            heads[n] = _time(lambda xs=xs: stage.head(xs), reps)
        r["head_ms"] = {str(n): {k: v * 1e3 if k != "n" else v for k, v in t.items()} for n, t in heads.items()}
        r["head_of_limit"] = {str(n): hb / lim / t["median"] for n, t in heads.items()}
        out[name] = r
        del stage
    if "f32" in out and "q8" in out:
        out["q8_over_f32_decode"] = out["q8"]["decode"]["tok_s"] / out["f32"]["decode"]["tok_s"]
    if llama:
        # llama.cpp at each precision numpy runs, from the same weights (the shipped Q4_1
        # GGUF requantized by llama.cpp itself), plus the file as shipped
        out["llama_cpp"] = llama_cpp_decode(reps=reps, tokens=decode_tokens, prompt_len=prompt_len)
        for name, ftype in (("f32", "f32"), ("q8", "q8_0")):
            if name not in out or out["llama_cpp"].get("skipped"):
                continue
            r = llama_cpp_decode(reps=reps, tokens=decode_tokens, prompt_len=prompt_len, ftype=ftype)
            out[f"llama_cpp_{ftype}"] = r
            if r.get("tok_s"):
                out[f"numpy_{name}_over_llama_cpp_{ftype}"] = out[name]["decode"]["tok_s"] / r["tok_s"]
    return out


def kernel_sweep(rows=(1, 5, 9), sweeps: int = 9, layers: int = 30, seed: int = 0) -> dict:
    """Products with SmolLM2's 30 layers of weight matrices (random values, real shapes: 212 MB
    in float32 per ``wgu``-sized matrix set, far past the 32 MB L3 here), each timed alone and
    kept at its **minimum over** ``sweeps`` passes, then summed: on a machine shared with other
    work the minimum of a sub-millisecond product is the run that had a core to itself, so the
    sums approach what a quiet machine does. For ``rows`` in ``rows``: BLAS (``x @ W.T``, the
    plain numpy product) and the streaming kernels in f32, f16, q8. The limit is BLAS
    sgemv (one row) over the same matrices the same way; every figure is also GB/s of weights.
    """
    from .backends.kernels import Linear

    rng = np.random.default_rng(seed)
    c = SMOLLM2_135M
    shapes = [(c.hidden + 2 * c.kv_dim, c.hidden), (c.hidden, c.hidden), (2 * c.ffn, c.hidden), (c.hidden, c.ffn)]
    mats = [rng.standard_normal(sh, dtype=np.float32) for _ in range(layers) for sh in shapes]
    lins = {k: [Linear.of(m, k) for m in mats] for k in ("f32", "f16", "q8")}
    f32_bytes = sum(m.nbytes for m in mats)
    out: dict = {"matrices": len(mats), "f32_bytes": f32_bytes, "sweeps": sweeps}

    v = {w: np.ones(w, np.float32) for w in (c.hidden, c.ffn)}
    xs = {n: {w: np.ones((n, w), np.float32) for w in (c.hidden, c.ffn)} for n in rows}
    kinds = ["sgemv"] + [f"{k}@{n}" for n in rows for k in ("blas", "f32", "f16", "q8")]
    best = {k: [float("inf")] * len(mats) for k in kinds}
    for _ in range(sweeps):  # each sweep streams all matrices once per variant, variants in turn
        for k in kinds:       # (not back to back per matrix: the second variant would find it in L3)
            for i, m in enumerate(mats):
                w = m.shape[1]
                if k == "sgemv":
                    f = lambda: m @ v[w]  # noqa: E731
                else:
                    kind, n = k.split("@")
                    x = xs[int(n)][w]
                    f = (lambda: x @ m.T) if kind == "blas" else (lambda L=lins[kind][i]: L.apply(x))  # noqa: E731
                t0 = time.perf_counter()
                f()
                best[k][i] = min(best[k][i], time.perf_counter() - t0)
    tot = {k: sum(b) for k, b in best.items()}
    out["limit_sgemv_gbps"] = f32_bytes / tot["sgemv"] / 1e9
    for n in rows:
        r = {f"{k}_ms": tot[f"{k}@{n}"] * 1e3 for k in ("blas", "f32", "f16", "q8")}
        r["blas_over_sgemv"] = tot[f"blas@{n}"] / tot["sgemv"]
        for k in ("f32", "f16", "q8"):
            r[f"{k}_over_one_row"] = tot[f"{k}@{n}"] / tot[f"{k}@{rows[0]}"]
            r[f"{k}_weight_gbps"] = sum(L.nbytes for L in lins[k]) / tot[f"{k}@{n}"] / 1e9
            r[f"{k}_gbps_of_limit"] = r[f"{k}_weight_gbps"] / out["limit_sgemv_gbps"]
        out[f"rows={n}"] = r
    return out


def llama_cpp_gguf(ftype: str) -> Path:
    """The bundled GGUF requantized by llama.cpp (``llama_model_quantize``, requantizing
    allowed) to ``ftype`` (``f32``: every tensor float32, the weights numpy's f32 holds;
    ``q8_0``: 8-bit blocks of 32), made once in the cache. Raises ImportError without
    llama-cpp-python, RuntimeError when llama.cpp fails."""
    import llama_cpp

    from .weights import cache_dir_for, find_gguf
    src = find_gguf()
    dst = cache_dir_for(src) / f"llama-cpp-{ftype}.gguf"
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = {"f32": llama_cpp.LLAMA_FTYPE_ALL_F32, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}[ftype]
        params.allow_requantize = True
        tmp = dst.with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not requantize {src.name} to {ftype}")
        tmp.replace(dst)
    return dst


def llama_cpp_decode(reps: int = 7, tokens: int = 32, prompt_len: int = 64, threads: int | None = None,
                     ftype: str | None = None) -> dict:
    """llama.cpp (llama-cpp-python) decode tok/s on the bundled GGUF (as shipped, Q4_1 with
    some Q8_0/F32 tensors; or requantized to ``ftype``, see :func:`llama_cpp_gguf`),
    greedy, ``threads`` (default: numpy's BLAS thread count).
    ``{"skipped": reason}`` when llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError as e:
        return {"skipped": f"llama-cpp-python is not installed ({e})"}
    from .weights import find_gguf

    if threads is None:
        try:
            from threadpoolctl import threadpool_info
            threads = max(i.get("num_threads", 1) for i in threadpool_info()) or 1
        except Exception:  # noqa: BLE001 - threadpoolctl is optional
            import os
            threads = os.cpu_count() or 1
    path = str(find_gguf() if ftype is None else llama_cpp_gguf(ftype))
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=threads, n_threads_batch=threads,
                          n_batch=prompt_len, logits_all=True, verbose=False)  # scores for every position
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, 49152, prompt_len).tolist()

    def run():
        llm.reset()
        llm.eval(prompt)
        for _ in range(tokens):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([tok])
    # time only the decode part: eval the prompt outside the timed region each rep
    ts = []
    run()
    for _ in range(reps):
        llm.reset()
        llm.eval(prompt)
        t0 = time.perf_counter()
        for _ in range(tokens):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([tok])
        ts.append(time.perf_counter() - t0)
    st = _stats(ts)
    return {"gguf": Path(path).name, "threads": threads, "version": getattr(llama_cpp, "__version__", "?"),
            "tok_s": tokens / st["median"], "tok_s_min": tokens / st["max"], "tok_s_max": tokens / st["min"],
            "file_bytes": Path(path).stat().st_size}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="numpy", choices=["numpy", "wgpu"])
    ap.add_argument("--random", action="store_true", help="random weights of the real shapes")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu-report", action="store_true", help="numpy: limit, precisions, verify, head, llama.cpp")
    ap.add_argument("--precisions", default="f32,f16,q8", help="with --cpu-report: weight precisions to measure")
    ap.add_argument("--no-llama", action="store_true", help="with --cpu-report: leave llama.cpp out")
    ap.add_argument("--kernels", action="store_true", help="per-product minimum sweep (see kernel_sweep)")
    a = ap.parse_args(argv)
    if a.kernels:
        out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg_before": _loadavg()}
        out.update(kernel_sweep(sweeps=max(5, a.reps)))
        out["loadavg_after"] = _loadavg()
        print(json.dumps(out, indent=1))
        return
    if a.cpu_report:
        out = {"machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "loadavg_before": _loadavg()}
        out.update(cpu_report(tuple(a.precisions.split(",")), max(5, a.reps), a.decode_tokens, random=a.random,
                              llama=not a.no_llama))
        out["loadavg_after"] = _loadavg()
        print(json.dumps(out, indent=1))
        return
    t0 = time.perf_counter()
    stage = build(a.backend, a.random)
    out = {"backend": a.backend, "random_weights": a.random, "init_s": time.perf_counter() - t0, "machine": platform.processor() or platform.machine()}
    if a.backend == "wgpu":
        from .backends.wgpu_backend import adapter_summary

        out["adapter"] = adapter_summary()
    out.update(measure(stage, a.decode_tokens, reps=a.reps))
    print(json.dumps(out, indent=1))


def _loadavg() -> list[float] | None:
    try:
        import os
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


if __name__ == "__main__":
    main()
