"""``splitroom generate``: answer one prompt with the real model, streaming, then report speed.

The model is the bundled SmolLM2-135M-Instruct or ``--model PATH`` (a GGUF file or a
safetensors directory); ``--ids 1,2,3`` gives the prompt as token ids (no chat template, for
checkpoints without a tokenizer and for comparisons); ``--json`` prints the answer with its ids.

Wires :mod:`runtime` (weights, tokenizer, a backend, greedy generation) for the CLI; the
Typer command in :mod:`splitroom.cli` imports this lazily.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from runtime.backends import BACKENDS, StageSpec, make_stage
from planner.deal import LayerRangeError, parse_layers as parse_range
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

    ``spec`` is a comma-separated list of layer ranges as people write them, 1-based and
    inclusive (``--layers 1-15``: the host runs the first 15 layers;
    :func:`planner.deal.parse_layers`). The ranges must follow on from layer 1; whatever
    is left up to ``n_layers`` becomes one more worker stage. ``None`` or ``""`` means
    one stage with every layer. Returns the stages 0-based half-open.

    Raises:
        ValueError: one line, for malformed, overlapping, gapped or out-of-range ranges,
            and for a range starting at layer 0 (the old 0-based form, ``0-15``).
    """
    if not spec:
        return StagePlan(((0, n_layers),))
    ranges = []
    expect = 0
    for part in spec.split(","):
        part = part.strip()
        if part.split("-")[0].strip() == "0":
            raise ValueError(f"--layers {part!r}: layers count from 1 (1-based, inclusive: 1-15 is the first 15 "
                             f"layers); 0-based START-END is no longer read")
        try:
            a, b = parse_range(part, n_layers)
        except LayerRangeError as e:
            why = "write A-B, 1-based and inclusive, e.g. 1-15" if e.malformed else f"need 1 <= A <= B <= {n_layers}"
            raise ValueError(f"--layers {part!r}: {why}") from None
        if a != expect:
            raise ValueError(f"--layers {part!r} must start at layer {expect + 1} (ranges follow on from layer 1)")
        ranges.append((a, b))
        expect = b
    if expect < n_layers:
        ranges.append((expect, n_layers))
    return StagePlan(tuple(ranges))


def parse_ids(text: str, vocab: int) -> list[int]:
    """``--ids 1,2,3`` -> ``[1, 2, 3]``. Raises ValueError (one line) unless every item is an
    integer in ``[0, vocab)`` and there is at least one."""
    parts = [p.strip() for p in text.split(",")]
    try:
        ids = [int(p) for p in parts if p]
    except ValueError:
        raise ValueError(f"--ids {text[:80]!r}: write token ids as integers separated by commas, e.g. 1,2,3") from None
    if not ids:
        raise ValueError("--ids: give at least one token id")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"--ids: id {bad[0]} is outside the vocabulary [0, {vocab})")
    return ids


def run_generate(
    prompt: str | None,
    backend: str = "numpy",
    layers: str | None = None,
    max_new_tokens: int = 256,
    system: str | None = None,
    raw: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    model: str | None = None,
    ids: str | None = None,
    as_json: bool = False,
    weights: str | None = None,
) -> int:
    """Generate an answer to ``prompt`` (or to the token ids ``ids``, ``"1,2,3"``) and stream it
    to ``out``; with ``as_json`` print one JSON object instead (``model``, ``text``,
    ``token_ids``, ``prompt_ids``, ``stopped``, timings). Return the process exit code (0, or 1
    after a numerical fault: a NaN or an inf reached the head, said in one line).

    ``temperature`` 0 (the default) decodes greedily; above 0 the answer is sampled
    (``top_p``, ``top_k``) from the ``seed``'s stream (a fresh seed when None; the
    speed line names it, so the answer can be had again).

    ``weights``: storage (runtime.precision.WEIGHTS); None: ``gguf`` (the blocks as stored) for a
    ``model`` that is a GGUF file, ``f32`` otherwise.
    ``model``: a GGUF file or safetensors directory (None: the bundled SmolLM2). ``out`` /
    ``err``: default ``sys.stdout`` / ``sys.stderr`` at the time of the call.

    Raises:
        ValueError: unknown backend, bad ``layers`` or ``ids``, a sampling value out of range,
            both or neither of prompt and ids, a model path that cannot be used
            (:class:`splitroom.models.ModelError`), a model without a tokenizer given a text
            prompt, or a backend that lacks a model feature.
    """
    from runtime.config import ModelConfig
    from runtime.tokenizer import ChatTokenizer
    from splitroom.models import model_dir as resolve
    from splitroom.models import read_config

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    sampling = _sampling(temperature, top_p, top_k, seed)
    if (prompt is None) == (ids is None):
        raise ValueError("give a PROMPT or --ids 1,2,3, not both" if prompt is not None else
                         "give a PROMPT (or the prompt as token ids: --ids 1,2,3)")
    from runtime.precision import Precision
    from splitroom.models import checkpoint_kind

    if model is not None:  # the checkpoint's metadata first: bad input is refused before any conversion
        shape = read_config(model)
        plan = parse_layers(layers, shape.n_layers)
        prompt_ids = parse_ids(ids, shape.vocab) if ids is not None else None
    if weights is None:
        weights = "gguf" if model is not None and checkpoint_kind(Path(model).expanduser().resolve()) == "gguf" else "f32"
    precision = Precision(weights=weights)  # PrecisionError (a ValueError): one line
    model_dir = resolve(model, stored=weights == "gguf")
    cfg = ModelConfig.load(model_dir)
    if model is None:
        plan = parse_layers(layers, cfg.n_layers)
        prompt_ids = parse_ids(ids, cfg.vocab) if ids is not None else None
    tok = ChatTokenizer.from_dir(model_dir) if (model_dir / "tokenizer.json").is_file() else None
    if prompt_ids is None and tok is None:
        raise ValueError(f"{model or 'the model'} has no tokenizer: give the prompt as token ids (--ids 1,2,3)")
    if prompt_ids is None and raw:
        prompt_ids = tok.encode(prompt)
    elif prompt_ids is None:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        prompt_ids = tok.encode_chat(msgs)
    if not prompt_ids:
        raise ValueError("the prompt is empty once tokenized")
    # the tokenizer's stop ids already hold the checkpoint's (ChatTokenizer.from_dir)
    stops = frozenset(i for i in (tok.stop_ids if tok else cfg.all_stop_ids) if i >= 0)
    ctx = len(prompt_ids) + max_new_tokens + 1
    stages = [make_stage(backend, model_dir, StageSpec(a, b, host=(i == 0)), max_ctx=ctx, precision=precision)
              for i, (a, b) in enumerate(plan.ranges)]
    from planner.model import BUNDLED_MODEL_ID
    name = BUNDLED_MODEL_ID if model is None else (cfg.name or cfg.arch)  # the bundled model's catalog id
    print(f"[{name}; {backend}; {plan.describe()}]", file=err, flush=True)
    dec = tok.stream_decoder() if tok is not None and not as_json else None

    def on_token(t: int) -> None:
        if dec is None or t in stops:
            return
        piece = dec.push(t)
        if piece:
            out.write(piece)
            out.flush()

    from runtime.work import NumericalFault
    try:
        if sampling.greedy:
            res = generate_greedy(stages, prompt_ids, max_new_tokens=max_new_tokens, stop_ids=stops,
                                  on_token=on_token)
        else:
            res = generate_sampled(stages, prompt_ids, sampling, max_new_tokens=max_new_tokens, stop_ids=stops,
                                   on_token=on_token)
    except NumericalFault as e:  # an error, never token 0
        if dec is not None:
            out.write(dec.flush() + "\n")
        print(f"error: numerical fault: {e}", file=err, flush=True)
        return 1
    if as_json:
        answer = [t for t in res.ids if t not in stops]
        json.dump({"model": name, "text": tok.decode(answer) if tok is not None else None,
                   "token_ids": res.ids, "prompt_ids": list(prompt_ids), "stopped": res.stopped,
                   "prefill_s": res.prefill_s, "decode_tok_per_s": res.decode_tok_per_s,
                   "seed": None if sampling.greedy else sampling.seed}, out, ensure_ascii=False)
        out.write("\n")
        out.flush()
        return 0
    out.write((dec.flush() if dec is not None else ",".join(str(t) for t in res.ids)) + "\n")
    n = len(res.ids)
    out.write(
        f"-- {n} tokens; decode {res.decode_tok_per_s:.1f} tok/s; prefill {res.prompt_tokens} tokens "
        f"in {res.prefill_s:.2f} s ({res.prefill_tok_per_s:.1f} tok/s)"
        f"{'' if res.stopped else '; stopped at --max-tokens'}"
        f"{'' if sampling.greedy else f'; sampled, seed {sampling.seed}'}\n"
    )
    out.flush()
    return 0
