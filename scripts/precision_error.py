"""The error each storage precision adds against the float32 reference (docs/precision.md).

    .venv/bin/python scripts/precision_error.py [--new 32] [--json out.json]

For each precision (weights f16 / q8, KV f16, residual frames f16, and combinations) the
model is split in two stages (layers 1-15 on the host, 16-30 on a worker) and the residual
crosses the wire twice per lap (host -> worker -> host), converted to the frame dtype with
runtime.codec as a real room does. Over a fixed set of chat prompts it reports:

* teacher-forced logits: the prompt plus the float32 reference's greedy answer in one pass;
  the largest |logit - reference logit| over the answer positions (the logits' own spread,
  max - min per row, is printed beside it for scale), and the share of those positions whose
  arg-max equals the reference's;
* free-running greedy: how many prompts give the identical answer (``--new`` tokens), and
  where the first differing token is in those that do not.

The float32 reference is the numpy backend with float32 everywhere (the backend that
tests/integration/test_model_reference.py checks against transformers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.frames import DType, FrameHeader, FrameKind  # noqa: E402
from runtime.backends import StageSpec, make_stage  # noqa: E402
from runtime.codec import decode_frame, encode_frame  # noqa: E402
from runtime.precision import Precision  # noqa: E402
from runtime.tokenizer import ChatTokenizer  # noqa: E402
from runtime.weights import ensure_safetensors  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Rewrite this sentence in the passive voice: The committee approved the new budget on Monday.",
    "Summarize in one sentence: The river flooded the valley after three days of rain, and the villagers "
    "moved their animals to the hills until the water went down.",
    "Write a Python function that returns the factorial of n.",
    "List three uses of copper.",
    "What is 17 times 23?",
    "Translate to French: The weather is nice today.",
    "Fix the grammar: She don't like apples and he have two cat.",
]
CUT = 15  # layers [0, 15) on the host, [15, 30) on the worker
PRECISIONS = [
    Precision(),
    Precision(kv="f16"),
    Precision(residual="f16"),
    Precision(weights="f16"),
    Precision(weights="q8"),
    Precision(weights="f16", kv="f16", residual="f16"),
    Precision(weights="q8", kv="f16", residual="f16"),
]


class Pair:
    """Host ``[0, CUT)`` + embedding/head and worker ``[CUT, 30)`` in one precision."""

    def __init__(self, model_dir, p: Precision, n_layers: int):
        self.host = make_stage("numpy", model_dir, StageSpec(0, CUT, True), max_ctx=1024, precision=p)
        self.worker = make_stage("numpy", model_dir, StageSpec(CUT, n_layers, False), max_ctx=1024, precision=p)
        self.dtype = DType.FLOAT16 if p.residual == "f16" else DType.FLOAT32
        self.hidden = self.host.cfg.hidden

    def wire(self, x: np.ndarray, pos: int) -> np.ndarray:
        h = FrameHeader(FrameKind.DECODE, 1, 1, pos, x.shape[0], self.hidden, self.dtype)
        return decode_frame(encode_frame(h, x))[1]

    def lap(self, ids, pos: int) -> np.ndarray:
        """Logits ``[len(ids), vocab]`` for ``ids`` at positions ``pos..``; caches advance."""
        x = self.host.embed_forward(ids, pos)
        x = self.wire(self.worker.forward(self.wire(x, pos), pos), pos)
        return self.host.head(x)

    def reset(self):
        self.host.rollback(0)
        self.worker.rollback(0)

    def greedy(self, prompt, n_new: int) -> list[int]:
        self.reset()
        logits = self.lap(prompt, 0)
        out, pos = [], len(prompt)
        for _ in range(n_new):
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            if tok == 2:
                break
            logits = self.lap([tok], pos)
            pos += 1
        return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new", type=int, default=32, help="answer tokens per prompt (greedy)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    md = ensure_safetensors()
    tok = ChatTokenizer.from_dir(md)
    prompts = [tok.encode_chat(p) for p in PROMPTS]
    from runtime.config import ModelConfig
    n_layers = ModelConfig.load(md).n_layers
    ref = Pair(md, PRECISIONS[0], n_layers)
    ref_answers = [ref.greedy(p, a.new) for p in prompts]
    ref_logits = []
    for p, ans in zip(prompts, ref_answers):
        ref.reset()
        ref_logits.append(ref.lap(p + ans, 0)[len(p) - 1:])  # rows predicting each answer token
    spread = float(np.median([np.median(lg.max(axis=1) - lg.min(axis=1)) for lg in ref_logits]))
    rows = []
    for prec in PRECISIONS:
        t0 = time.perf_counter()
        m = ref if prec.is_reference else Pair(md, prec, n_layers)
        err, agree, total, same, first_diff = 0.0, 0, 0, 0, []
        for p, ans, rl in zip(prompts, ref_answers, ref_logits):
            m.reset()
            lg = m.lap(p + ans, 0)[len(p) - 1:]
            err = max(err, float(np.abs(lg - rl).max()))
            agree += int((lg.argmax(axis=1) == rl.argmax(axis=1)).sum())
            total += lg.shape[0]
            got = m.greedy(p, a.new)
            if got == ans:
                same += 1
            else:
                first_diff.append(next((i for i, (x, y) in enumerate(zip(got, ans)) if x != y), min(len(got), len(ans))))
        row = {"precision": prec.to_json(), "label": prec.label(), "max_logit_error": err,
               "teacher_forced_top1_agreement": agree / total, "positions": total,
               "greedy_identical": same, "prompts": len(prompts), "first_difference_at": first_diff,
               "seconds": time.perf_counter() - t0}
        rows.append(row)
        print(f"{prec.label():40s} max |dlogit| {err:8.4f}  top-1 {agree}/{total}  "
              f"greedy identical {same}/{len(prompts)}  first diff {first_diff}", flush=True)
    out = {"prompts": PROMPTS, "answer_tokens": a.new, "split": [CUT, n_layers],
           "median_logit_spread": spread, "results": rows,
           "reference_answers": [tok.decode(x) for x in ref_answers]}
    print(f"median logit spread (max - min per row) of the reference: {spread:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
