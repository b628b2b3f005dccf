#!/usr/bin/env python3
"""Error of the wgpu backend's weight formats (f16, q8) against the float32 reference, on the real model.

For each prompt of a fixed set (chat-formatted), runs SmolLM2-135M-Instruct on the numpy
float32 reference and on the wgpu backend with each weight format, then reports:

* logits error after the prompt: ``max |l - l32| / max |l32|`` over every prompt position, and the
  share of positions whose arg-max (next token) equals float32's;
* greedy agreement: the generated ids (``--tokens`` of them) compared with float32's: identical
  sequences, and the mean number of leading tokens that agree.

Runs wherever wgpu finds a Vulkan adapter (lavapipe: a few minutes per format on 2 cores with
the default 4 prompts x 16 tokens). The numpy backend stores the same values for each format
(tests/integration/test_wgpu_formats.py), so ``--backend numpy`` gives the same figures up to
float32 summation order. Prints a JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.backends.base import StageSpec  # noqa: E402
from runtime.backends.numpy_backend import NumpyStage  # noqa: E402
from runtime.config import ModelConfig  # noqa: E402
from runtime.precision import Precision  # noqa: E402
from runtime.tokenizer import ChatTokenizer  # noqa: E402
from runtime.weights import ensure_safetensors, load_range  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers larger than 20.",
    "Translate 'good morning' into Spanish and German.",
    "What does a compiler do?",
    "Give me a short tip for learning to cook.",
    "Summarise the plot of Romeo and Juliet in one sentence.",
]


def q8_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp Q8_0's rule with float32 scales: per block of 32 along a row, ``d = max|x| / 127``,
    ``q = rint(x / d)``. Returns ``(q int8 [out, in], d float32 [out, in / 32])``."""
    b = np.asarray(w, dtype=np.float32).reshape(w.shape[0], -1, 32)
    d = (np.abs(b).max(axis=-1) / np.float32(127.0)).astype(np.float32)
    q = np.clip(np.rint(b / np.where(d == 0, np.float32(1.0), d)[..., None]), -127, 127).astype(np.int8)
    return q.reshape(w.shape), d


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt")
    ap.add_argument("--prompts", type=int, default=4, help=f"how many of the {len(PROMPTS)} prompts")
    ap.add_argument("--backend", default="wgpu", choices=["numpy", "wgpu"])
    ap.add_argument("--formats", default="f32,f16,q8", help="f32, f16, q8 (runtime/precision.py), and on wgpu "
                    "q8-block: int8 with one scale per block of 32 (llama.cpp's Q8_0 rule) instead of q8's scales")
    a = ap.parse_args(argv)
    d = ensure_safetensors()
    cfg = ModelConfig.load(d)
    tok = ChatTokenizer.from_dir(d)
    spec = StageSpec(0, cfg.n_layers, True)
    w32 = load_range(d, 0, cfg.n_layers, with_embedding=True, with_head=True)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS[: a.prompts]]

    def stage(fmt: str):
        p = Precision(weights="q8" if fmt == "q8-block" else fmt)
        if a.backend == "wgpu":
            from runtime.backends import wgpu_backend

            q8 = wgpu_backend.quantize_q8
            if fmt == "q8-block":  # the kernels read any per-block scales; numpy stores one per row
                wgpu_backend.quantize_q8 = q8_blocks
            try:
                return wgpu_backend.WgpuStage(cfg, spec, dict(w32), max_ctx=256, precision=p)
            finally:
                wgpu_backend.quantize_q8 = q8
        return NumpyStage(cfg, spec, dict(w32), max_ctx=256, precision=p)

    def run(st):
        """Logits at every prompt position, then greedy ids (stopping at eos)."""
        out = []
        for ids in prompts:
            st.rollback(0)
            h = st.embed_forward(ids, 0)
            logits = st.head(h)
            gen, pos = [], len(ids)
            for _ in range(a.tokens):
                t, h = st.head_embed_forward(h, pos)
                gen.append(t)
                pos += 1
                if t == cfg.eos_id:
                    break
            out.append((logits, gen))
        return out

    t0 = time.perf_counter()
    ref = run(NumpyStage(cfg, spec, dict(w32), max_ctx=256))
    res = {"model": "SmolLM2-135M-Instruct", "backend": a.backend, "prompts": len(prompts), "tokens": a.tokens, "formats": {}}
    if a.backend == "wgpu":
        from runtime.backends.wgpu_backend import adapter_summary

        res["adapter"] = adapter_summary()
    for fmt in a.formats.split(","):
        got = run(stage(fmt))
        errs, top1, same, lead = [], [], 0, []
        for (l32, g32), (l, g) in zip(ref, got):
            errs.append(float(np.abs(l - l32).max() / np.abs(l32).max()))
            top1.append(float((l.argmax(-1) == l32.argmax(-1)).mean()))
            same += g == g32
            n = 0
            while n < min(len(g), len(g32)) and g[n] == g32[n]:
                n += 1
            lead.append(n)
        res["formats"][fmt] = {
            "logits_rel_err_max": max(errs), "logits_rel_err_median": float(np.median(errs)),
            "top1_agreement_prompt_positions": float(np.mean(top1)),
            "greedy_identical_sequences": f"{same}/{len(prompts)}", "greedy_leading_agreement_mean": float(np.mean(lead)),
            "first_answer": tok.decode(got[0][1]),
        }
    res["seconds"] = time.perf_counter() - t0
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
