"""Measuring a calibration profile on this machine (``splitroom calibrate``).

Everything a prediction needs, measured without running any scenario's workload:

* compute (:func:`measure_passes`): the time of one forward pass of a stage as a
  function of the layers in it, the new tokens in the pass and the context already in
  its KV cache. For each context ``c`` and token count ``n`` of the grid, stages of a
  few layer counts are timed (median of ``reps`` passes, each rolled back), and a
  least-squares line over the layer counts splits the time into a fixed part per pass
  (Python, dispatch, the residual's copies) and a part per layer;
* the model host's output head (final norm, head matrix, argmax) on 1..16 rows
  (:func:`measure_head`);
* each drafter (:func:`measure_drafters`): a greedy speculative walk over a small
  calibration prompt set (:data:`CALIBRATION_PROMPTS`, not any scenario's prompts):
  from the answer's second token on (the first is the prefill's, as in a room), at
  each step the drafter proposes ``k`` tokens after the answer so far, the number
  that match the model's own greedy answer is recorded, and the walk moves on by that
  many plus one, as a verify lap does; each call is timed; the walk is made once per
  workload kind (chat: :data:`CALIBRATION_PROMPTS`; grounded, copying a given passage:
  :data:`GROUNDED_CALIBRATION_PROMPTS`), since what is asked decides acceptance;
* the transport (:func:`measure_transport`): two processes connected by the project's
  WebRTC data channels through a local relay, ping-ponging residual frames of the
  decode, verify and prefill sizes; one-way time = round trip / 2 (median); and a
  peer's copy of single layers' weights (:func:`measure_weights_copy`), the rate a
  re-dealt device gets its layers at; and how late the in-process delay delivers
  (:func:`measure_delay_lateness`);
* on a GPU (wgpu), the idle factors (:func:`measure_idle`): one-token passes of a stage
  after the GPU sat idle for a range of gaps, over the same passes back to back (the
  clock falls while a room waits on the network).

The measured times are this process's, on this machine; a device with an emulated
slowdown gets them times its slowdown (the device process pads its compute exactly
so, runtime/room.py). All times in seconds.
"""

from __future__ import annotations

from runtime.threads import pin_one_blas_thread

pin_one_blas_thread()  # as a device process computes (runtime.node), before numpy loads

import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable, Sequence  # noqa: E402

import numpy as np  # noqa: E402

from planner.frames import frame_bytes  # noqa: E402
from planner.room import RUNTIME_DRAFTERS  # noqa: E402
from planner.profile import (SAMPLE, Curve, DrafterProfile, PassCurve, TransportProfile, fit_line,  # noqa: E402
                             sample_workload)

#: token counts of the pass grid: decode (1), verify laps of k+1 for k = 1, 2, 4, 8,
#: a prefill chunk (16) and a large one (64)
PASS_TOKENS = (1, 2, 3, 5, 9, 16, 64)
#: contexts of the pass grid, positions already cached
PASS_CONTEXTS = (128, 512, 2048)
#: rows of the head curve
HEAD_ROWS = (1, 2, 3, 5, 9, 16)
#: draft lengths measured for each drafter
DRAFT_KS = (1, 2, 4, 8)
#: the calibration prompts: chosen to be unlike the shipped scenarios' prompts, so a
#: prediction from them is a prediction, not a replay
CALIBRATION_PROMPTS = (
    "Explain why the sky is blue.",
    "List five fruits and their colours.",
    "Give me three tips for learning to cook.",
    "What does a compiler do?",
)

#: grounded calibration prompts (workload.kind grounded): copying or rewriting a passage
#: given in the prompt, where prompt-lookup drafts are right most of the time; the
#: passages are unlike scripts/spec_gain.py's, so its grounded figure stays held out
GROUNDED_CALIBRATION_PROMPTS = (
    "Repeat the following text without changing a word: A small boat drifted across the calm lake while two "
    "herons watched from the reeds by the shore.",
    "Copy this exactly: Please bring your own notebook, a pencil and a packed lunch to the field trip on "
    "Friday morning.",
    "Write this sentence out again, exactly as it is: The library opens at nine, closes at six, and stays open "
    "late on the first Thursday of every month.",
    "Repeat after me, word for word: Every morning the baker lights the oven, kneads the dough and sets the "
    "loaves to rise by the window.",
    "Copy the following line exactly: Trains to the city leave every twenty minutes from platform four, except "
    "on Sundays and public holidays.",
    "Please write out this sentence again without any changes: My grandmother kept a small garden with "
    "tomatoes, beans, and a row of bright yellow sunflowers.",
)

Log = Callable[[str], None]


#: a buffer larger than any CPU's last-level cache, read before each timed pass so that
#: the pass finds its weights in memory, not in cache, as in a room where other stages
#: (other processes) ran in between
_FLUSH = np.ones(48 * 1024 * 1024 // 8, dtype=np.float64)


#: idle gaps of :func:`measure_idle`, seconds (a room's wait between passes: a round trip and the other stages)
IDLE_GAPS_S = (0.0, 0.005, 0.010, 0.020, 0.040, 0.080, 0.120)


def _precision(weights: str):
    """The :class:`runtime.precision.Precision` of stages holding ``weights`` (KV float32)."""
    from runtime.precision import Precision
    return Precision(weights=weights)


def _flush_caches() -> None:
    float(_FLUSH.sum())


def _median_time(fn: Callable[[], object], reps: int) -> float:
    xs = []
    for _ in range(reps):
        _flush_caches()
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return float(statistics.median(xs))


def measure_passes(model_dir: str, backend: str = "numpy", tokens: Sequence[int] = PASS_TOKENS,
                   contexts: Sequence[int] = PASS_CONTEXTS, layer_counts: Sequence[int] | None = None,
                   reps: int = 3, log: Log = lambda s: None, weights: str = "f32") -> PassCurve:
    """Time forward passes and fit ``pass_s = fixed_s + layers * per_layer_s`` per grid point.

    Args:
        model_dir: the model directory (runtime.weights.ensure_safetensors()).
        backend: ``numpy`` or ``wgpu``.
        tokens, contexts: the grid (increasing).
        layer_counts: stage sizes timed (default: 1, half the layers, all layers).
        reps: passes per point; the median is kept.
        weights: how the stages hold the weights (runtime.precision.WEIGHTS; ``gguf``: the
            blocks as stored, for a model directory made from a GGUF).
    Returns:
        A :class:`planner.profile.PassCurve` of this process's times, seconds.
    Raises:
        ValueError: an empty grid or a context beyond what a stage can cache.
    """
    from runtime.backends import StageSpec, make_stage
    from runtime.config import ModelConfig
    cfg = ModelConfig.load(model_dir)
    if not tokens or not contexts:
        raise ValueError("the pass grid needs token counts and contexts")
    counts = tuple(layer_counts or sorted({1, max(cfg.n_layers // 2, 1), cfg.n_layers}))
    max_ctx = max(contexts) + max(tokens) + 1
    rng = np.random.default_rng(0)
    times: dict[int, np.ndarray] = {}  # layers -> [contexts, tokens]
    for L in counts:
        stage = make_stage(backend, model_dir, StageSpec(0, L, False), max_ctx=max_ctx, precision=_precision(weights))
        grid = np.zeros((len(contexts), len(tokens)))
        filled = 0
        for ci, c in enumerate(contexts):
            while filled < c:  # fill the cache to c positions, in chunks
                n = min(256, c - filled)
                stage.forward((rng.standard_normal((n, cfg.hidden)) * 0.1).astype(np.float32), filled)
                filled += n
            for ti, n in enumerate(tokens):
                x = (rng.standard_normal((n, cfg.hidden)) * 0.1).astype(np.float32)

                def one(x=x, c=c, stage=stage):
                    stage.forward(x, c)
                    stage.rollback(c)
                one()  # warm-up
                grid[ci, ti] = _median_time(one, reps)
        times[L] = grid
        log(f"compute: {L} layer(s) timed at {len(tokens)} token counts x {len(contexts)} contexts")
        del stage
    fixed = np.zeros((len(contexts), len(tokens)))
    per_layer = np.zeros_like(fixed)
    for ci in range(len(contexts)):
        for ti in range(len(tokens)):
            a, b = fit_line([float(L) for L in counts], [float(times[L][ci, ti]) for L in counts])
            fixed[ci, ti], per_layer[ci, ti] = a, max(b, 0.0)
    return PassCurve(tuple(int(t) for t in tokens), tuple(int(c) for c in contexts),
                     tuple(tuple(float(v) for v in r) for r in fixed),
                     tuple(tuple(float(v) for v in r) for r in per_layer))


def measure_head(model_dir: str, backend: str = "numpy", rows: Sequence[int] = HEAD_ROWS, reps: int = 7,
                 weights: str = "f32") -> Curve:
    """Seconds of the host's head (final norm, head matrix, argmax per row) by rows
    (``weights`` as in :func:`measure_passes`)."""
    from runtime.backends import StageSpec, make_stage
    from runtime.config import ModelConfig
    cfg = ModelConfig.load(model_dir)
    stage = make_stage(backend, model_dir, StageSpec(0, 0, True), max_ctx=64, precision=_precision(weights))
    rng = np.random.default_rng(1)
    ys = []
    for r in rows:
        x = (rng.standard_normal((r, cfg.hidden)) * 0.1).astype(np.float32)

        def one(x=x):
            np.argmax(stage.head(x), axis=1)
        one()
        ys.append(_median_time(one, reps))
    return Curve(tuple(float(r) for r in rows), tuple(ys))


def greedy_answers(model_dir: str, prompts: Sequence[str], max_new_tokens: int, eos: int = 2,
                   backend: str = "numpy", weights: str = "f32") -> list[tuple[list[int], list[int]]]:
    """``[(prompt ids, greedy answer ids)]`` of the whole model for each chat prompt
    (``weights`` as in :func:`measure_passes`)."""
    from runtime.backends import StageSpec, make_stage
    from runtime.config import ModelConfig
    from runtime.generate import generate_greedy
    from runtime.tokenizer import ChatTokenizer
    cfg = ModelConfig.load(model_dir)
    tok = ChatTokenizer.from_dir(model_dir)
    out = []
    for p in prompts:
        stage = make_stage(backend, model_dir, StageSpec(0, cfg.n_layers, True), max_ctx=2048,
                           precision=_precision(weights))
        ids = tok.encode_chat(p)
        res = generate_greedy([stage], ids, max_new_tokens=max_new_tokens, stop_ids=frozenset({eos}))
        out.append((list(ids), list(res.ids)))
    return out


def speculative_walk(drafter: Callable[[Sequence[int], int], list[int]], prompt: Sequence[int],
                     answer: Sequence[int], k: int) -> tuple[list[int], list[float]]:
    """Walk ``answer`` as one-lap-at-a-time speculative decoding would: draft ``k``
    tokens after the prompt and the answer so far, count the leading drafts equal to
    the answer (the accepted length, at most what is left), then move on by that many
    plus one (the lap's correction or bonus token). Returns the accepted lengths and
    the seconds of each drafter call."""
    accepted: list[int] = []
    secs: list[float] = []
    done = 0
    while done < len(answer):
        ctx = list(prompt) + list(answer[:done])
        t0 = time.perf_counter()
        d = drafter(ctx, k)
        secs.append(time.perf_counter() - t0)
        m = 0
        while m < k and done + m < len(answer) and d[m] == answer[done + m]:
            m += 1
        accepted.append(m)
        done += m + 1
    return accepted, secs


def measure_drafters(model_dir: str, answers: Sequence[tuple[list[int], list[int]]],
                     kinds: Sequence[str] = RUNTIME_DRAFTERS, ks: Sequence[int] = DRAFT_KS,
                     log: Log = lambda s: None) -> dict[str, DrafterProfile]:
    """Each drafter's seconds per call (by k) and accepted lengths (by k) over the
    greedy ``answers`` (see :func:`speculative_walk`), each walked from its second token:
    the first comes from the prefill's head in a room, so no lap drafts it (walking it
    too counted a lap, the one drafted from the prompt alone and seldom right, that no
    room runs: on short copied answers it took a fifth of the laps). A walk's first call
    is left out of the call times when the walk made more than one: a drafter that runs
    layers catches up on the whole prompt in it (its KV cache starts empty), once a
    question, not once a lap; with short walks (a quick calibration's 8 tokens: 2-3 calls)
    it decided the median (the model drafter at k=4 on the 16-core device machine, 2026-12-03:
    380 ms a call, while its k=4 laps in the rooms took 9 ms longer than prompt lookup's)."""
    from runtime.drafters import make_drafter
    out = {}
    for kind in kinds:
        call_s: list[float] = []
        accepted: dict[int, tuple[int, ...]] = {}
        walks: dict[int, tuple[tuple[int, ...], ...]] = {}
        for k in ks:
            drafter = make_drafter(kind, model_dir)  # a fresh KV cache for each walk
            per: list[tuple[int, ...]] = []
            secs: list[float] = []
            for prompt, answer in answers:
                # a room's first answer token comes from the prefill's head, not from a lap:
                # the walk begins after it, that token in the context (as the first verify lap)
                a, s = speculative_walk(drafter, list(prompt) + list(answer[:1]), answer[1:], k)
                per.append(tuple(a))
                secs += s[1:] if len(s) > 1 else s
            walks[k] = tuple(per)
            accepted[k] = tuple(x for w in per for x in w)
            call_s.append(float(statistics.median(secs)) if secs else 0.0)
        out[kind] = DrafterProfile(Curve(tuple(float(k) for k in ks), tuple(call_s)), accepted,
                                   walks={"chat": walks})
        means = ", ".join(f"k={k}: {np.mean(accepted[k]):.2f}" for k in ks)
        log(f"drafter {kind}: mean accepted {means}")
    return out


async def _ping_pong(sizes: Sequence[int], n: int, warmup: int, delay_s: float = 0.0) -> dict[int, list[float]]:
    """``{size: [one-way seconds]}``: ping-pongs with an echo process; ``delay_s`` > 0 holds
    what this side sends that long in process (runtime.transport.emulate_delay)."""
    from runtime.relay import run_relay
    from runtime.transport import connect_room, emulate_delay
    runner, url = await run_relay("127.0.0.1", 0)
    total = len(sizes) * (n + warmup)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "runtime.transport", "echo", url, str(total),
                                                stdout=asyncio.subprocess.PIPE)
    try:
        a = await connect_room(url, "bench2", "a", ["b"], host_addresses=["127.0.0.1"])
        if delay_s > 0:
            emulate_delay(a, delay_s)
        q: asyncio.Queue = asyncio.Queue()
        a.set_handler(lambda src, ch, d: q.put_nowait(time.perf_counter()))
        out: dict[int, list[float]] = {}
        for size in sizes:
            payload = bytes(size)
            xs = []
            for i in range(n + warmup):
                t0 = time.perf_counter()
                await a.send("b", "residual", payload)
                t1 = await asyncio.wait_for(q.get(), 30)
                if i >= warmup:
                    xs.append((t1 - t0) / 2)
            out[size] = xs
        await asyncio.wait_for(proc.stdout.readline(), 30)
        await a.close()
        await asyncio.wait_for(proc.wait(), 30)
        return out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await runner.cleanup()


def measure_transport(hidden: int, token_counts: Sequence[int] = (1, 5, 9, 16), n: int = 60,
                      warmup: int = 10) -> TransportProfile:
    """One-way seconds (median of ``n`` ping-pongs / 2) of residual frames of
    ``token_counts`` positions (float32, ``hidden`` wide) between two processes on
    loopback, and the transport's initial congestion window."""
    from runtime.transport import INITIAL_WINDOW_BYTES
    sizes = [frame_bytes(t, hidden) for t in token_counts]
    res = asyncio.run(_ping_pong(sizes, n, warmup))
    return TransportProfile(Curve(tuple(float(s) for s in sizes),
                                  tuple(float(statistics.median(res[s])) for s in sizes)),
                            window_bytes=float(INITIAL_WINDOW_BYTES))


def measure_delay_lateness(hidden: int, delay_s: float = 0.010, n: int = 40, warmup: int = 8) -> float:
    """Seconds a decode frame's one-way time exceeds an in-process delay of ``delay_s``
    (runtime.transport.emulate_delay on the sending side): the median round trip of ``n``
    ping-pongs with the delay, less the same without it, less ``delay_s``; at least 0. The
    held packet leaves when the event loop runs its timer, after its due time."""
    size = frame_bytes(1, hidden)
    base = statistics.median(asyncio.run(_ping_pong([size], n, warmup))[size])
    late = statistics.median(asyncio.run(_ping_pong([size], n, warmup, delay_s))[size])
    return max(2 * (late - base) - delay_s, 0.0)


def measure_idle(model_dir: str, backend: str, weights: str = "f32", layers: int | None = None,
                 gaps_s: Sequence[float] = IDLE_GAPS_S, rounds: int = 30, context: int = 64) -> Curve:
    """The idle factors (planner.profile.DeviceProfile.idle): one-token passes (forward and
    read-back) of a stage of ``layers`` layers (default half the model) started ``gap``
    seconds after the last one ended (``time.sleep``), for each of ``gaps_s`` (0 first),
    interleaved over ``rounds`` rounds so the machine's drift spreads over every gap;
    returns gap -> median pass at that gap over the median at gap 0."""
    import numpy as np

    from runtime.backends import StageSpec, make_stage
    from runtime.config import ModelConfig
    cfg = ModelConfig.load(model_dir)
    n = layers or max(cfg.n_layers // 2, 1)
    stage = make_stage(backend, model_dir, StageSpec(0, n, False), max_ctx=context + 8, precision=_precision(weights))
    rng = np.random.default_rng(0)
    stage.forward((rng.standard_normal((context, cfg.hidden)) * 0.1).astype(np.float32), 0)
    x = (rng.standard_normal((1, cfg.hidden)) * 0.1).astype(np.float32)
    for _ in range(3):  # warm-up
        stage.forward(x, context)
        stage.rollback(context)
    times: dict[float, list[float]] = {float(g): [] for g in gaps_s}
    for _ in range(rounds):
        for g in times:
            time.sleep(g)
            t0 = time.perf_counter()
            stage.forward(x, context)
            times[g].append(time.perf_counter() - t0)
            stage.rollback(context)
    med = {g: statistics.median(v) for g, v in times.items()}
    back_to_back = med[min(med)]
    return Curve(tuple(sorted(med)), tuple(med[g] / back_to_back for g in sorted(med)))


async def _weights_copy(model_dir: str, layers: Sequence[int]) -> list[tuple[int, float]]:
    """``[(stored bytes, seconds)]`` of copying each of ``layers`` (0-based) from a peer
    process over the project's transport, as a recovering device does."""
    import tempfile

    from runtime.relay import run_relay
    from runtime.transport import connect_room
    from runtime.weights_share import fetch_range, make_manifest
    runner, url = await run_relay("127.0.0.1", 0)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "runtime.calibrate", "--weights-peer", url,
                                                model_dir, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE)
    try:
        a = await connect_room(url, "calw", "a", ["b"], host_addresses=["127.0.0.1"])
        await asyncio.wait_for(proc.stdout.readline(), 30)  # the peer serves
        out = []
        with tempfile.TemporaryDirectory(prefix="splitroom-calw-") as tmp:
            for i, layer in enumerate(layers):
                m = make_manifest(model_dir, layer, layer + 1, False, False)
                t0 = time.perf_counter()
                await fetch_range(a, "b", layer, layer + 1, False, False, f"{tmp}/{i}", m["sha256"])
                out.append((sum(e["nbytes"] for e in m["tensors"].values()), time.perf_counter() - t0))
        await a.close()
        return out
    finally:
        if proc.returncode is None:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        await runner.cleanup()


async def _weights_peer(url: str, model_dir: str) -> None:
    """The serving side of :func:`_weights_copy`: serve every tensor of ``model_dir``
    until stdin closes."""
    from runtime.transport import connect_room
    from runtime.weights_share import serve_weights
    b = await connect_room(url, "calw", "b", ["a"], host_addresses=["127.0.0.1"])
    srv = serve_weights(b, model_dir)
    print("serving", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    srv.close()
    await b.close()


def measure_weights_copy(model_dir: str, layers: Sequence[int] = (3, 17, 26)) -> float:
    """Stored bytes per second of a peer copy of one layer between two processes on
    loopback (median over ``layers``), as :func:`runtime.weights_share.fetch_range`
    makes it when a device is re-dealt layers: manifest, packed slices, checks. On one
    machine the transport's CPU work, not a wire, sets the rate (docs/transport.md)."""
    res = asyncio.run(_weights_copy(model_dir, layers))
    return float(statistics.median(n / s for n, s in res))


def machine_notes(backend: str) -> dict[str, str]:
    """Where and how a profile was measured (free text for the profile's notes)."""
    import os
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"machine": f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "backend": backend,
            "python": platform.python_version(), "numpy": np.__version__,
            "how": "one process; each device's times = this process's times x its emulated slowdown"}


#: a workload.sample's prompts walked by prompt lookup (the rest are left out, and the
#: notes say so); the drafters that run layers walk the first few, shorter
SAMPLE_MAX_PROMPTS = 24
SAMPLE_LAYER_DRAFTER_PROMPTS = 4
#: a quick calibration's walks (tests and the small held-out study): a sample's first
#: prompts, answers of up to this many tokens, k = 1, 4
SAMPLE_QUICK_PROMPTS = 4
QUICK_WALK_ANSWER_TOKENS = 16
#: a quick calibration's model drafter: the first prompt of each workload, answers of up to
#: this many tokens, k = 2, 4 (its call time by k is what a prediction of a model-drafter
#: room needs; early exit is not walked)
QUICK_LAYER_DRAFTER_TOKENS = 8


def walked_sample(sample: Sequence[str], quick: bool = False) -> tuple[str, ...]:
    """The prompts of ``sample`` (a scenario's ``workload.sample``) that the drafters walk:
    the first :data:`SAMPLE_MAX_PROMPTS`, or :data:`SAMPLE_QUICK_PROMPTS` when ``quick``."""
    return tuple(sample[:SAMPLE_QUICK_PROMPTS if quick else SAMPLE_MAX_PROMPTS])


#: the longest answer a drafter's walk follows (tokens)
WALK_ANSWER_TOKENS = 64


def measure_walks(model_dir: str, backend: str, by_kind: dict[str, Sequence[str]], quick: bool = False,
                  log: Log = lambda s: None, weights: str = "f32",
                  answer_tokens: int | None = None) -> dict[str, dict[str, DrafterProfile]]:
    """Each drafter's speculative walks (:func:`measure_drafters`) over the greedy
    answers to each workload's prompts: ``{workload: {drafter: DrafterProfile}}``, the
    walk of each under its ``accepted`` and ``walks["chat"]``. Prompt lookup walks
    every prompt's answer of up to 64 tokens at k = 1, 2, 4, 8 (16 tokens, k = 1, 4
    when ``quick``: :data:`QUICK_WALK_ANSWER_TOKENS`); the drafters that run layers (``early_exit``, ``model``) the
    first 2 prompts (:data:`SAMPLE_LAYER_DRAFTER_PROMPTS` of a sample) at 32 tokens,
    k = 2, 4; when ``quick``, the model drafter alone on the first prompt at
    :data:`QUICK_LAYER_DRAFTER_TOKENS` tokens, k = 2, 4 (its call times and a first
    acceptance); none with ``weights`` ``gguf`` (those drafters load the model's float32
    safetensors, which a checkpoint held as stored does not have).
    ``answer_tokens``: the scenario's answer cap; when given, no walk follows an answer
    past it (a room never drafts beyond its answers' end, and a copied passage's share
    of the answer depends on where the answer stops)."""
    from runtime.config import ModelConfig
    cfg = ModelConfig.load(model_dir)
    max_new, ks = (QUICK_WALK_ANSWER_TOKENS, (1, 4)) if quick else (WALK_ANSWER_TOKENS, DRAFT_KS)
    cap = max_new if answer_tokens is None else max(1, min(max_new, int(answer_tokens)))
    max_new = cap
    out: dict[str, dict[str, DrafterProfile]] = {}
    for workload, prompts in by_kind.items():
        answers = greedy_answers(model_dir, prompts, max_new, eos=cfg.eos_id, backend=backend, weights=weights)
        sample = workload.startswith(SAMPLE)
        what = "workload.sample prompts" if sample else "calibration prompts"
        log(f"drafters ({'sample' if sample else workload}): greedy answers to {len(prompts)} {what} "
            f"({sum(len(a) for _, a in answers)} tokens)")
        measured = measure_drafters(model_dir, answers, kinds=("ngram",), ks=ks, log=log)
        if weights == "gguf":
            log("drafters early_exit, model: not measured (they load float32 weights; this model is held as stored)")
        elif quick:  # the model drafter's call times, on one short answer
            measured.update(measure_drafters(model_dir, [(p, a[:min(QUICK_LAYER_DRAFTER_TOKENS, cap)])
                                                         for p, a in answers[:1]],
                                             kinds=("model",), ks=(2, 4), log=log))
        else:  # drafters that run layers cost a forward pass a token: a shorter walk
            n = SAMPLE_LAYER_DRAFTER_PROMPTS if sample else 2
            measured.update(measure_drafters(model_dir, [(p, a[:min(32, cap)]) for p, a in answers[:n]],
                                             kinds=("early_exit", "model"), ks=(2, 4), log=log))
        out[workload] = measured
    return out


def sample_notes(sample: Sequence[str], answer_tokens: int | None = None, quick: bool = False) -> dict[str, str]:
    """The profile notes saying what of ``sample`` was walked (as :func:`measure_walks`
    walks it, ``quick`` or not), keyed by its workload."""
    walked = len(walked_sample(sample, quick))
    top = QUICK_WALK_ANSWER_TOKENS if quick else WALK_ANSWER_TOKENS
    cap = top if answer_tokens is None else max(1, min(top, int(answer_tokens)))
    layers = (f"the model drafter alone, the first 1, {min(QUICK_LAYER_DRAFTER_TOKENS, cap)} tokens (a quick "
              "calibration)" if quick
              else f"the first {min(SAMPLE_LAYER_DRAFTER_PROMPTS, walked)}, {min(32, cap)} tokens")
    return {sample_workload(sample): (
        f"{len(sample)} workload.sample prompts, the first {walked} walked (prompt lookup, up to {cap} answer tokens"
        f"{' (the scenario answer cap)' if answer_tokens is not None else ''}; "
        f"the drafters that run layers: {layers})")}


def measure_acceptance(model_dir: str, backend: str, sample: Sequence[str], quick: bool = False, weights: str = "f32",
                       log: Log = lambda s: None, answer_tokens: int | None = None) -> dict:
    """The acceptance step alone: every drafter's walks over ``sample`` (a scenario's
    ``workload.sample``), as ``{"drafters": {name: {"workloads": {key: {k: lengths}},
    "walks": {key: {k: [[...], ...]}}}}, "notes": {...}}`` with ``key`` the sample's
    workload (:func:`planner.profile.sample_workload`), to add to a profile; ``answer_tokens``
    as in :func:`measure_walks`."""
    key = sample_workload(sample)
    walks = measure_walks(model_dir, backend, {key: walked_sample(sample, quick)}, quick, log, weights,
                          answer_tokens)[key]
    return {"drafters": {name: {"workloads": {key: {int(k): list(v) for k, v in dr.accepted.items()}},
                                "walks": {key: {int(k): [list(x) for x in v] for k, v in dr.walks["chat"].items()}}}
                         for name, dr in walks.items()},
            "notes": sample_notes(sample, answer_tokens, quick)}


def measure_all(model_dir: str, backend: str = "numpy", quick: bool = False, log: Log = lambda s: None,
                sample: Sequence[str] = (), weights: str = "f32", answer_tokens: int | None = None) -> dict:
    """Every measurement of the module doc, as a plain mapping: ``stage`` (a
    PassCurve mapping), ``head_s``, ``drafters`` (name -> DrafterProfile mapping),
    ``transport``, ``notes``. ``quick`` takes a smaller grid and fewer repetitions
    (for tests: seconds instead of about two minutes). ``sample``: a scenario's
    ``workload.sample`` prompts; the drafters' walks are then also made on them (the
    prompts :func:`walked_sample` keeps), kept as that sample's workload. ``weights``: as
    in :func:`measure_passes`; with ``gguf`` a peer's copy of a layer is not measured
    (peers serve float32 safetensors), so ``transport`` has no ``weights_Bps``.
    ``answer_tokens``: the scenario's answer cap, as in :func:`measure_walks`."""
    from runtime.config import ModelConfig
    cfg = ModelConfig.load(model_dir)
    t0 = time.perf_counter()
    if quick:
        stage = measure_passes(model_dir, backend, tokens=(1, 5, 16), contexts=(16, 64), reps=3, log=log,
                               weights=weights)
        n_prompts, n_frames = 1, 15
    else:
        stage = measure_passes(model_dir, backend, log=log, weights=weights)
        n_prompts, n_frames = len(CALIBRATION_PROMPTS), 60
    head = measure_head(model_dir, backend, weights=weights)
    log("head: timed on " + ", ".join(f"{int(r)}" for r in head.xs) + " rows")
    by_kind = {"chat": CALIBRATION_PROMPTS[:n_prompts],
               "grounded": GROUNDED_CALIBRATION_PROMPTS[:n_prompts if quick else None]}
    if sample:
        by_kind[sample_workload(sample)] = walked_sample(sample, quick)
    drafters: dict[str, DrafterProfile] = {}
    for workload, measured in measure_walks(model_dir, backend, by_kind, quick, log, weights, answer_tokens).items():
        for name, dr in measured.items():
            if workload == "chat":  # the chat walk is the drafter's own; its call times are kept
                drafters[name] = dr
            else:
                drafters[name] = dataclasses.replace(
                    drafters[name], workloads={**drafters[name].workloads, workload: dr.accepted},
                    walks={**drafters[name].walks, workload: dr.walks["chat"]})
    transport = measure_transport(cfg.hidden, n=n_frames)
    cells = ", ".join(f"{int(b)} B {s * 1e3:.2f} ms" for b, s in zip(transport.one_way_s.xs, transport.one_way_s.ys))
    log(f"transport: one-way {cells}")
    if weights == "gguf":
        log("transport: a peer's copy of a layer not measured with weights gguf (the copy carries the GGUF's "
            "blocks; its rate is measured on float32 checkpoints only)")
    else:
        weights_Bps = measure_weights_copy(model_dir, layers=(3,) if quick else (3, 17, 26))
        transport = dataclasses.replace(transport, weights_Bps=weights_Bps)
        log(f"transport: a peer's copy of a layer moves {weights_Bps / 1e6:.1f} MB/s of stored weights")
    idle = None
    if not quick:
        late = measure_delay_lateness(cfg.hidden)
        transport = dataclasses.replace(transport, delay_late_s=late)
        log(f"transport: an in-process delay of 10 ms delivers {late * 1e3:.2f} ms late (median)")
        if backend == "wgpu":
            idle = measure_idle(model_dir, backend, weights)
            log("idle: a one-token pass after " + ", ".join(f"{g * 1e3:g} ms x{f:.3f}" for g, f in
                                                           zip(idle.xs, idle.ys)) + " idle")
    notes = machine_notes(backend)
    notes["weights"] = weights
    notes["took"] = f"{time.perf_counter() - t0:.0f} s"
    if sample:
        notes.update(sample_notes(sample, answer_tokens, quick))
    return {"stage": stage.to_mapping(), "head_s": head.to_mapping(),
            "drafters": {k: v.to_mapping() for k, v in drafters.items()},
            "transport": transport.to_mapping(), "notes": notes,
            **({"idle": idle.to_mapping()} if idle is not None else {})}


def main(argv: Sequence[str]) -> int:  # pragma: no cover - run as a child by splitroom calibrate
    """``python -m runtime.calibrate MODEL_DIR OUT_JSON BACKEND [quick] [--sample PROMPTS_JSON]
    [--acceptance-only] [--weights W] [--answer-tokens N]``: measure (everything, or the sample's walks alone) and write JSON;
    progress lines on stderr. Exit 0, or 1 with one line on stderr."""
    import logging
    logging.basicConfig(level=logging.ERROR)
    if argv and argv[0] == "--weights-peer":  # the serving side of measure_weights_copy
        asyncio.run(_weights_peer(argv[1], argv[2]))
        return 0
    rest = list(argv[3:])
    sample: list[str] = []
    if "--sample" in rest:  # a JSON file holding the list of prompts
        i = rest.index("--sample")
        with open(rest[i + 1], encoding="utf-8") as f:
            sample = list(json.load(f))
        del rest[i:i + 2]
    weights = "f32"
    if "--weights" in rest:
        i = rest.index("--weights")
        weights = rest[i + 1]
        del rest[i:i + 2]
    answer_tokens = None
    if "--answer-tokens" in rest:
        i = rest.index("--answer-tokens")
        answer_tokens = int(rest[i + 1])
        del rest[i:i + 2]
    acceptance_only = "--acceptance-only" in rest
    if acceptance_only:
        rest.remove("--acceptance-only")
    say = (lambda s: print(s, file=sys.stderr, flush=True))
    try:
        quick = bool(rest) and rest[0] == "quick"
        if acceptance_only:
            out = measure_acceptance(argv[0], argv[2], sample, quick=quick, weights=weights, log=say,
                                     answer_tokens=answer_tokens)
        else:
            out = measure_all(argv[0], argv[2], quick=quick, log=say, sample=sample, weights=weights,
                              answer_tokens=answer_tokens)
    except Exception as e:  # one line for the parent, whatever went wrong
        print(f"calibration failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
