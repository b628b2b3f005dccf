"""SmolLM2 decode on the numpy backend beside llama.cpp, interleaved: q8 (the int8 per-row
kernel), the GGUF's blocks held natively (the bundled Q4_1 file, and a Q8_0 file), and
llama.cpp (llama-cpp-python) on the same two files.

    python scripts/decode_beside.py [--rounds 7] [--tokens 32] [--prompt 64] [--threads 1] [--out FILE.json]

Each round decodes ``--tokens`` greedy tokens after a ``--prompt``-token random prompt with
every engine in turn (the prompt is evaluated outside the timed part), so every engine sees the
same minute of a shared machine; the figure kept per engine is its tok/s, and its time over
numpy q8's in the same round. The Q8_0 file is the bundled GGUF requantized by llama.cpp's own
``llama_model_quantize`` (runtime.bench.llama_cpp_gguf), so both engines read the same Q8_0
blocks. Threads: numba, BLAS and llama.cpp all get ``--threads`` (set before numba loads).
Without llama-cpp-python the llama.cpp engines are left out (said in the output).
Run it alone, under the project's timing lock.

Every engine starts from the prompt's *last* row (numpy: ``head_embed_forward`` takes
``hidden[-1:]``; llama.cpp: ``scores[n_tokens - 1]``). ``first_top2`` in the JSON is that row's
two best ids and logits per engine: on the random prompt (seed 1) the float32 reference's
margin is 0.12 logit (288 over 29; transformers on the same weights agrees), smaller than
the error of the engines that round differently (q8 requantizes per row; llama.cpp quantizes
the activations to 8 bits), so those start from 29 and their ids differ from the native
engines' (which equal the widened float32 stage's). Not a wrong row: a near-tie."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engines", default="numpy-q8,numpy-q4_1,numpy-q8_0,llama-q4_1,llama-q8_0")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if min(a.rounds, a.tokens, a.prompt, a.threads) < 1:
        ap.error("--rounds, --tokens, --prompt and --threads must be at least 1")
    known = {"numpy-q8", "numpy-q4_1", "numpy-q8_0", "llama-q4_1", "llama-q8_0"}
    a.engines = [e for e in a.engines.split(",") if e]
    bad = [e for e in a.engines if e not in known]
    if bad or not a.engines:
        ap.error(f"--engines: {'unknown ' + bad[0] if bad else 'none given'}; engines are {', '.join(sorted(known))}")
    return a


def _top2(logits) -> list[list]:
    """The two best ``[id, logit]`` of one row of logits (the first token's choice and its margin)."""
    import numpy as np

    i = np.argsort(logits)[::-1][:2]
    return [[int(j), round(float(logits[j]), 4)] for j in i]


def _load() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(v) for v in f.read().split()[:3]]


def main(argv=None) -> None:
    a = _args(argv)
    for v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[v] = str(a.threads)
    import numpy as np

    from runtime.backends import StageSpec, make_stage
    from runtime.bench import llama_cpp_gguf
    from runtime.precision import Precision
    from runtime.weights import ensure_safetensors, find_gguf, prepare_native

    rng = np.random.default_rng(1)
    prompt = rng.integers(3, 49152, a.prompt).tolist()
    try:
        import llama_cpp
    except ImportError as e:
        llama_cpp = None
        skipped = f"llama-cpp-python is not installed ({e})"
    files = {"q4_1": find_gguf()}
    if llama_cpp is not None and ("numpy-q8_0" in a.engines or "llama-q8_0" in a.engines):
        files["q8_0"] = llama_cpp_gguf("q8_0")
    engines, top2 = {}, {}
    for name in a.engines:
        kind, fmt = name.split("-")
        if kind == "llama":
            if llama_cpp is None:
                continue
            llm = llama_cpp.Llama(model_path=str(files[fmt]), n_ctx=a.prompt + a.tokens + 8, n_threads=a.threads,
                                  n_threads_batch=a.threads, n_batch=a.prompt, logits_all=True,
                                  verbose=False)  # a score row for every position, as runtime.bench reads them

            def run(llm=llm, name=name):
                llm.reset()
                llm.eval(prompt)
                top2[name] = _top2(np.asarray(llm.scores[llm.n_tokens - 1]))
                t0 = time.perf_counter()
                ids = []
                for _ in range(a.tokens):
                    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                    ids.append(tok)
                    llm.eval([tok])
                return time.perf_counter() - t0, ids
        else:
            if fmt == "q8":
                d, prec = ensure_safetensors(progress=None), Precision(weights="q8")
            elif fmt in files:
                d, prec = prepare_native(files[fmt], progress=None), Precision(weights="gguf")
            else:
                continue
            stage = make_stage("numpy", d, StageSpec(0, 30, True), max_ctx=a.prompt + a.tokens + 8, precision=prec)
            stage.rollback(0)
            h0 = stage.embed_forward(prompt, 0)
            top2[name] = _top2(stage.head(h0[-1:])[0])

            def run(stage=stage, h0=h0):
                stage.rollback(a.prompt)
                h, pos, ids = h0, a.prompt, []
                t0 = time.perf_counter()
                for _ in range(a.tokens):
                    tok, h = stage.head_embed_forward(h, pos)
                    ids.append(int(tok))
                    pos += 1
                return time.perf_counter() - t0, ids
        engines[name] = run
    first_ids = {n: f()[1] for n, f in engines.items()}  # compile, warm caches
    before, t_start = _load(), time.time()
    times = {n: [] for n in engines}
    for _ in range(a.rounds):
        for n, f in engines.items():
            times[n].append(f()[0])
    res = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)), "load_before": before,
           "load_after": _load(), "rounds": a.rounds, "tokens": a.tokens, "prompt": a.prompt, "threads": a.threads,
           "files": {f: {"name": p.name, "bytes": p.stat().st_size} for f, p in files.items()},
           "llama_cpp": getattr(llama_cpp, "__version__", None) if llama_cpp else skipped, "engines": {}}
    base = np.array(times.get("numpy-q8", [np.nan] * a.rounds))
    for n, ts in times.items():
        t = np.array(ts)
        tok_s = a.tokens / t
        r = {"tok_s_median": float(np.median(tok_s)), "tok_s_p10": float(np.percentile(tok_s, 10)),
             "tok_s_p90": float(np.percentile(tok_s, 90)), "tok_s_best": float(tok_s.max()),
             "tok_s_min": float(tok_s.min()), "time_over_numpy_q8_median": float(np.median(t / base)),
             "time_over_numpy_q8_min": float(np.min(t / base)), "time_over_numpy_q8_max": float(np.max(t / base)),
             "round_s": [float(v) for v in t], "first_ids": first_ids[n][:8],
             "first_top2": top2[n]}
        res["engines"][n] = r
        print(f"{n:<11} {r['tok_s_median']:6.1f} tok/s [{r['tok_s_min']:.1f}-{r['tok_s_best']:.1f}] (p10 {r['tok_s_p10']:.1f},"
              f" p90 {r['tok_s_p90']:.1f})  time over numpy-q8: median {r['time_over_numpy_q8_median']:.2f}"
              f" [{r['time_over_numpy_q8_min']:.2f}-{r['time_over_numpy_q8_max']:.2f}]")
    if llama_cpp is None:
        print("llama.cpp left out:", skipped)
    print("load before", before, "after", res["load_after"])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
