#!/usr/bin/env python3
"""Error of the wgpu backend's float16 and int8 weight formats against float32, on the real model.

For each prompt of a fixed set (chat-formatted), runs SmolLM2-135M-Instruct with float32 weights
and with the weights as each format stores them, then reports:

* logits error after the prompt: ``max |l - l32| / max |l32|`` over every prompt position, and the
  share of positions whose arg-max (next token) equals float32's;
* greedy agreement: the generated ids (``--tokens`` of them) compared with float32's: identical
  sequences, and the mean number of leading tokens that agree.

The format's arithmetic is evaluated with the numpy reference on the dequantized weights
(:func:`runtime.backends.wgpu_backend.dequantized`: exactly the values the WGSL kernels read;
tests/integration/test_wgpu_formats.py checks wgpu against that reference within 1e-5), so this
runs anywhere in about a minute; ``--backend wgpu`` runs the formats on the wgpu backend itself
(slow on lavapipe). Prints a JSON object.
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
from runtime.backends.wgpu_backend import dequantized  # noqa: E402
from runtime.config import ModelConfig  # noqa: E402
from runtime.generate import generate_greedy  # noqa: E402
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--backend", default="numpy", choices=["numpy", "wgpu"])
    ap.add_argument("--formats", default="float16,int8")
    a = ap.parse_args(argv)
    d = ensure_safetensors()
    cfg = ModelConfig.load(d)
    tok = ChatTokenizer.from_dir(d)
    spec = StageSpec(0, cfg.n_layers, True)
    w32 = load_range(d, 0, cfg.n_layers, with_embedding=True, with_head=True)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]

    def stage(fmt: str):
        if a.backend == "wgpu":
            from runtime.backends.wgpu_backend import WgpuStage

            return WgpuStage(cfg, spec, dict(w32), max_ctx=256, weights_dtype=fmt)
        return NumpyStage(cfg, spec, {k: dequantized(v, fmt) for k, v in w32.items()}, max_ctx=256)

    def run(st):
        out = []
        for ids in prompts:
            st.rollback(0)
            logits = st.head(st.embed_forward(ids, 0))
            st.rollback(0)
            gen = generate_greedy([st], ids, a.tokens)
            out.append((logits, gen.ids))
        return out

    t0 = time.perf_counter()
    ref = run(NumpyStage(cfg, spec, dict(w32), max_ctx=256))
    res = {"model": "SmolLM2-135M-Instruct", "backend": a.backend, "prompts": len(PROMPTS), "tokens": a.tokens, "formats": {}}
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
