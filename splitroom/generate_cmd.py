"""``splitroom generate``: answer one prompt with the real model, streaming, then report speed.

Wires :mod:`runtime` (weights, tokenizer, a backend, greedy generation) for the CLI; the
Typer command in :mod:`splitroom.cli` imports this lazily.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from runtime.backends import BACKENDS, StageSpec, make_stage
from planner.sampling import MAX_SEED, Sampling
from runtime.generate import generate_greedy, generate_sampled


def _sampling(temperature: float, top_p: float, top_k: int, seed: int | None) -> Sampling:
    """The CLI's sampling flags as a Sampling; a sampled one without ``seed`` gets a
    fresh seed. Raises ValueError naming the flag."""
    try:
        s = Sampling(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    except ValueError as e:
        flag = str(e).split(" ", 1)[0].replace("_", "-")
        raise ValueError(f"--{flag}: {e}") from None
    if not s.greedy and s.seed is None:
        import secrets
        s = s.with_seed(secrets.randbelow(MAX_SEED + 1))
    return s


@dataclass(frozen=True)
class StagePlan:
    """Half-open layer ranges, host first; covers ``[0, n_layers)`` in order."""

    ranges: tuple[tuple[int, int], ...]

    def describe(self) -> str:
        parts = []
        for i, (a, b) in enumerate(self.ranges):
            who = "host" if i == 0 else f"worker {i}"
            parts.append(f"{who}: {StageSpec(a, b).label()}")
        return "; ".join(parts)


def parse_layers(spec: str | None, n_layers: int) -> StagePlan:
    """Parse ``--layers`` into stages.

    ``spec`` is a comma-separated list of half-open, 0-based ranges ``START-END`` (code notation,
    as in ``--layers 0-15`` = the host runs the first 15 layers). The ranges must be contiguous
    from 0; whatever is left up to ``n_layers`` becomes one more worker stage. ``None`` or ``""``
    means one stage with every layer.

    Raises:
        ValueError: malformed, overlapping, gapped or out-of-range ranges.
    """
    if not spec:
        return StagePlan(((0, n_layers),))
    ranges = []
    expect = 0
    for part in spec.split(","):
        try:
            a_s, b_s = part.strip().split("-")
            a, b = int(a_s), int(b_s)
        except ValueError:
            raise ValueError(f"bad layer range {part!r}; write START-END, half-open and 0-based, e.g. 0-15") from None
        if a != expect:
            raise ValueError(f"layer range {part!r} must start at {expect} (ranges are contiguous from 0)")
        if not (a <= b <= n_layers):
            raise ValueError(f"layer range {part!r} is outside 0-{n_layers}")
        ranges.append((a, b))
        expect = b
    if expect < n_layers:
        ranges.append((expect, n_layers))
    return StagePlan(tuple(ranges))


def run_generate(
    prompt: str,
    backend: str = "numpy",
    layers: str | None = None,
    max_new_tokens: int = 256,
    system: str | None = None,
    raw: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
) -> int:
    """Generate an answer to ``prompt`` and stream it to ``out``; return the process exit code
    (0, or 1 after a numerical fault: a NaN or an inf reached the head, said in one line).

    ``temperature`` 0 (the default) decodes greedily; above 0 the answer is sampled
    (``top_p``, ``top_k``) from the ``seed``'s stream (a fresh seed when None; the
    speed line names it, so the answer can be had again).

    Raises:
        ValueError: unknown backend, bad ``layers`` or a sampling value out of range.
    """
    from runtime.config import ModelConfig
    from runtime.tokenizer import ChatTokenizer
    from runtime.weights import ensure_safetensors

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    sampling = _sampling(temperature, top_p, top_k, seed)
    model_dir = ensure_safetensors()
    cfg = ModelConfig.load(model_dir)
    plan = parse_layers(layers, cfg.n_layers)
    tok = ChatTokenizer.from_dir(model_dir)
    if raw:
        ids = tok.encode(prompt)
    else:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        ids = tok.encode_chat(msgs)
    ctx = len(ids) + max_new_tokens + 1
    stages = [make_stage(backend, model_dir, StageSpec(a, b, host=(i == 0)), max_ctx=ctx) for i, (a, b) in enumerate(plan.ranges)]
    print(f"[{backend}; {plan.describe()}]", file=err, flush=True)
    dec = tok.stream_decoder()

    def on_token(t: int) -> None:
        if t in tok.stop_ids:
            return
        piece = dec.push(t)
        if piece:
            out.write(piece)
            out.flush()

    from runtime.work import NumericalFault
    try:
        if sampling.greedy:
            res = generate_greedy(stages, ids, max_new_tokens=max_new_tokens, stop_ids=tok.stop_ids,
                                  on_token=on_token)
        else:
            res = generate_sampled(stages, ids, sampling, max_new_tokens=max_new_tokens, stop_ids=tok.stop_ids,
                                   on_token=on_token)
    except NumericalFault as e:  # an error, never token 0
        out.write(dec.flush() + "\n")
        print(f"error: numerical fault: {e}", file=err, flush=True)
        return 1
    out.write(dec.flush() + "\n")
    n = len(res.ids)
    out.write(
        f"-- {n} tokens; decode {res.decode_tok_per_s:.1f} tok/s; prefill {res.prompt_tokens} tokens "
        f"in {res.prefill_s:.2f} s ({res.prefill_tok_per_s:.1f} tok/s)"
        f"{'' if res.stopped else '; stopped at --max-tokens'}"
        f"{'' if sampling.greedy else f'; sampled, seed {sampling.seed}'}\n"
    )
    out.flush()
    return 0
