"""Fuzzing harness for every surface that takes input from outside (issue 11).

Each surface has a hypothesis strategy of hostile inputs and a ``try_*`` function that
feeds one input and returns an :class:`Outcome`: ``ok`` (accepted), ``refused`` (the
documented refusal: exit 2 with one line, the module's own error, a frame dropped),
``crash`` (anything else: a traceback, another exit status, an undocumented
exception, more than one line) or ``hang`` (no answer within the time limit, enforced
with SIGALRM). The short property tests (tests/property/test_fuzz_inputs.py) assert
no crash and no hang over a few dozen inputs; the benchmark run
(tests/benchmark/test_fuzz_counts.py, ``SPLITROOM_FUZZ_N=10000``) counts outcomes over
many more and writes them to a JSON file for docs/fuzzing.md.
"""

from __future__ import annotations

import asyncio

import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hypothesis import strategies as st

#: Seconds one input may take before it counts as a hang.
HANG_S = 20.0
#: a fuzzed request a room is answering is left (the client goes away) after this, seconds
ANSWER_WAIT_S = 3.0

#: A valid two-device room of the real model, small enough to simulate in milliseconds.
BASE = {
    "name": "fuzz",
    "seed": 3,
    "model": "smollm2-135m",
    "context": 256,
    "devices": [
        {"id": "a", "lends": "300 MB", "memory_bandwidth": "50 GB/s", "compute": "2 TFLOPS"},
        {"id": "b", "kind": "phone", "lends": "400 MB", "ms_per_layer": "0.5 ms"},
    ],
    "network": {"rtt": "2 ms", "jitter": {"distribution": "pareto", "scale": "0.2 ms"},
                "bandwidth": "100 Mbit/s", "hop_overhead": "0.5 ms"},
    "workload": {"questions": 2, "prompt_tokens": 20, "answer_tokens": 6},
    "decoding": {"prefill_chunk": 8, "speculative": {"drafter": "ngram", "draft_tokens": 3, "acceptance": 0.6},
                 "async_laps": 2},
}

#: Key paths of BASE (and a few optional keys) that mutations aim at.
PATHS = ["name", "seed", "model", "context", "kv_cache", "split", "phone_layers", "host", "stages",
         "devices", "devices[0]", "devices[0].id", "devices[0].lends", "devices[0].compute",
         "devices[0].memory_bandwidth", "devices[1].ms_per_layer", "devices[1].kind", "devices[1].emulate",
         "devices[1].emulate.slowdown", "devices[0].copy_speed", "devices[0].webgpu", "devices[1].clocks_down",
         "network", "network.rtt", "network.jitter", "network.jitter.distribution", "network.jitter.scale",
         "network.jitter.shape", "network.jitter.samples", "network.bandwidth", "network.hop_overhead",
         "network.episodes", "network.links", "network.window", "workload", "workload.questions",
         "workload.prompt_tokens", "workload.answer_tokens", "workload.prompts", "workload.asked_by",
         "decoding", "decoding.prefill_chunk", "decoding.speculative", "decoding.speculative.acceptance",
         "decoding.speculative.draft_tokens", "decoding.speculative.accepted_lengths",
         "decoding.speculative.accepted_sequence", "decoding.speculative.draft_cost", "decoding.async_laps",
         "decoding.return", "decoding.wake", "measured", "measured.ms_per_layer", "calibration"]

UNITS = ["B", "KiB", "MB", "GiB", "TB", "ms", "s", "us", "ns", "h", "GB/s", "Gbit/s", "Mbit/s", "TFLOPS",
         "PFLOPS", "USD/h", "", "m", "GiB/s", "bit", "kg", "%"]

NUMBERS = st.one_of(
    st.integers(-3, 3), st.integers(), st.integers(min_value=2**62, max_value=2**200).map(lambda x: x),
    st.integers(max_value=-2**62, min_value=-2**200),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, -1, 0.0, -0.0, 1e-320, 1e308, 2**64]))

QUANTITIES = st.builds(lambda n, u, sp: f"{n}{' ' if sp else ''}{u}", NUMBERS, st.sampled_from(UNITS), st.booleans())

SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, QUANTITIES, st.text(max_size=40),
                    st.sampled_from(["speed", "memory", "optimal", "phone", "computer", "a", "b", "ngram",
                                     "empirical", "pareto", "direct", "via_stages", "null", "~", "1-13", "0-0",
                                     "smollm2-135m", "qwen3.6-35b-a3b", "5-1", "a" * 10_000, "\x00", "é" * 50]))

#: Values a user might plausibly write: small numbers, real units, known words.
PLAUSIBLE = st.one_of(
    st.integers(0, 300), st.floats(0, 1), st.booleans(),
    st.builds(lambda n, u: f"{n} {u}", st.one_of(st.integers(0, 5000), st.floats(0, 100)),
              st.sampled_from(["GiB", "MB", "ms", "s", "us", "GB/s", "Mbit/s", "TFLOPS"])),
    st.sampled_from(["speed", "memory", "optimal", "phone", "computer", "a", "b", "ngram", "draft_layer",
                     "early_exit", "none", "normal", "lognormal", "gamma", "pareto", "paretonormal",
                     "empirical", "direct", "via_stages", "f16", "q8", "1-13", "1-30", "5-1", "0-3"]),
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
    st.lists(st.integers(0, 6), max_size=6),
    st.builds(lambda e, l, x: {"every": f"{e} s", "lasting": f"{l} s", "extra_rtt": f"{x} ms"},
              st.floats(0, 5), st.floats(0, 5), st.integers(0, 500)),
    st.builds(lambda a, b: [{"between": [a, b], "rtt": "3 ms"}], st.sampled_from(["a", "b", "c"]),
              st.sampled_from(["a", "b"])),
    st.builds(lambda a, b: [{"device": a, "layers": b}], st.sampled_from(["a", "b"]),
              st.sampled_from(["1-30", "1-15", "1-1", "30-30", "2-30"])),
    st.builds(lambda d, k: {"drafter": d, "draft_tokens": k}, st.sampled_from(["ngram", "draft_layer", "x"]),
              st.integers(0, 70)),
)

def _q(lo: float, hi: float, *units: str):
    return st.builds(lambda n, u: f"{n:g} {u}", st.floats(lo, hi), st.sampled_from(units))


_IDS = st.sampled_from(["a", "b", "c"])
#: Per key, values of the right kind and a plausible range (so most rooms are valid and
#: get simulated: the simulator meets odd but legal settings).
KEYED = {
    "name": st.text(max_size=30), "seed": st.integers(0, 2**64 - 1), "context": st.integers(1, 5000),
    "kv_cache": st.sampled_from(["f16", "q8"]), "split": st.sampled_from(["speed", "memory", "optimal"]),
    "phone_layers": st.booleans(), "host": _IDS,
    "devices[0].lends": _q(0, 2000, "MB"), "devices[0].compute": _q(0.001, 500, "TFLOPS"),
    "devices[0].memory_bandwidth": _q(0.001, 3000, "GB/s"), "devices[0].copy_speed": _q(0.001, 3000, "GB/s"),
    "devices[1].ms_per_layer": _q(0.0001, 500, "ms"), "devices[1].kind": st.sampled_from(["phone", "computer"]),
    "devices[1].emulate": st.builds(lambda x: {"slowdown": x}, st.floats(1, 10)),
    "devices[1].emulate.slowdown": st.floats(1, 100), "devices[0].webgpu": st.booleans(),
    "devices[1].clocks_down": st.booleans(),
    "network.rtt": _q(0, 2000, "ms"), "network.hop_overhead": _q(0, 100, "ms"),
    "network.bandwidth": _q(0.001, 10000, "Mbit/s"), "network.window": _q(1, 10**6, "B"),
    "network.jitter": st.builds(lambda d, sc, sh: {"distribution": d, "scale": f"{sc:g} ms", **sh},
                                st.sampled_from(["none", "normal", "lognormal", "gamma", "pareto",
                                                 "paretonormal"]), st.floats(0, 500),
                                st.one_of(st.just({}), st.builds(lambda x: {"shape": x}, st.floats(1.0001, 20)))),
    "network.jitter.scale": _q(0, 1000, "ms"), "network.jitter.shape": st.floats(1.0001, 50),
    "network.jitter.samples": st.lists(_q(0, 100, "ms"), min_size=1, max_size=5),
    "network.episodes": st.builds(lambda e, l, x: {"every": f"{e:g} s", "lasting": f"{min(l, e):g} s",
                                                   "extra_rtt": f"{x:g} ms"},
                                  st.floats(1e-6, 100), st.floats(0, 100), st.floats(0, 1000)),
    "network.links": st.lists(st.builds(lambda a, b, r: {"between": [a, b], "rtt": f"{r:g} ms"}, _IDS, _IDS,
                                        st.floats(0, 500)), max_size=3),
    "workload.questions": st.integers(1, 4), "workload.prompt_tokens": st.integers(1, 60),
    "workload.answer_tokens": st.integers(1, 40), "workload.asked_by": st.lists(_IDS, max_size=3),
    "workload.prompts": st.lists(st.text(max_size=20), max_size=3),
    "decoding.prefill_chunk": st.integers(1, 64), "decoding.async_laps": st.integers(1, 8),
    "decoding.return": st.sampled_from(["direct", "via_stages"]), "decoding.wake": st.booleans(),
    "decoding.speculative": st.one_of(st.none(), st.builds(
        lambda d, k, a: {"drafter": d, "draft_tokens": k, "acceptance": a},
        st.sampled_from(["ngram", "draft_layer", "early_exit", "model"]), st.integers(1, 8), st.floats(0, 1))),
    "decoding.speculative.acceptance": st.floats(0, 1), "decoding.speculative.draft_tokens": st.integers(1, 16),
    "decoding.speculative.accepted_lengths": st.lists(st.integers(0, 3), max_size=6),
    "decoding.speculative.accepted_sequence": st.lists(st.integers(0, 3), max_size=6),
    "decoding.speculative.draft_cost": _q(0, 100, "ms"),
    "measured.ms_per_layer": st.dictionaries(_IDS, _q(0.0001, 100, "ms"), max_size=2),
    "stages": st.lists(st.builds(lambda d, a, b: {"device": d, "layers": f"{a}-{b}"}, _IDS, st.integers(1, 30),
                                 st.integers(1, 30)), max_size=3),
}


VALUES = st.recursive(st.one_of(PLAUSIBLE, PLAUSIBLE, SCALARS), lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                        st.dictionaries(st.text(max_size=12), inner, max_size=5)),
                      max_leaves=25)


def set_path(data: dict, path: str, value) -> None:
    """Set ``path`` (``a.b[1].c``) in ``data``, creating mappings on the way; quietly
    does nothing when a step is not a mapping or a list index is out of range."""
    import re
    parts = [int(p) if p.isdigit() else p for p in re.split(r"\.|\[(\d+)\]", path) if p]
    cur = data
    for p in parts[:-1]:
        if isinstance(p, int):
            if not isinstance(cur, list) or p >= len(cur):
                return
            cur = cur[p]
        else:
            if not isinstance(cur, dict):
                return
            if not isinstance(cur.get(p), (dict, list)):
                cur[p] = {}
            cur = cur[p]
    last = parts[-1]
    if isinstance(last, int):
        if isinstance(cur, list) and last < len(cur):
            cur[last] = value
    elif isinstance(cur, dict):
        cur[last] = value


def bomb(levels: int, width: int) -> str:
    """A "billion laughs" YAML value: ``width ** (levels + 1)`` leaves from a few lines."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines)


@st.composite
def mutated_scenarios(draw) -> dict:
    """BASE with 1-4 keys replaced by arbitrary YAML values, or deleted."""
    import copy
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        if draw(st.integers(0, 9)) == 0:
            set_path(data, path, None)
        else:
            set_path(data, path, draw(VALUES))
    return data


def _dump(data) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


@st.composite
def scenario_files(draw) -> bytes:
    """Bytes of a scenario file: mostly BASE mutated, else an alias bomb in some key,
    deep nesting, random YAML, random bytes, or a valid file cut short."""
    kind = draw(st.sampled_from(["mutated"] * 4 + ["plausible"] * 4 + ["bomb", "deep", "yaml", "bytes", "cut",
                                                                        "bigint"]))
    if kind == "mutated":
        return _dump(draw(mutated_scenarios())).encode()
    if kind == "plausible":  # one key set to a value a user might write: mostly valid rooms, simulated
        import copy
        data = copy.deepcopy(BASE)
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(sorted(KEYED)))
            set_path(data, path, draw(KEYED[path]))
        return _dump(data).encode()
    if kind == "bomb":
        levels, width = draw(st.integers(1, 12)), draw(st.integers(2, 12))
        key = draw(st.sampled_from(["name", "devices", "workload.prompts", "model", "network.links"]))
        base = _dump({k: v for k, v in BASE.items() if k != key.split(".")[0]})
        ref = f"*l{levels}"
        line = f"{key}: {ref}" if "." not in key else f"{key.split('.')[0]}: {{{key.split('.')[1]}: {ref}}}"
        return (bomb(levels, width) + "\n" + base + line + "\n").encode()
    if kind == "deep":
        n = draw(st.integers(20, 30000))
        opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}"), ("- ", "")]))
        if opener == "- ":
            body = "\n".join("  " * i + "- " for i in range(min(n, 3000))) + "x"
            return ("name:\n" + body + "\n").encode()
        return (_dump(BASE) + f"measured: {opener * n}1{closer * n}\n").encode()
    if kind == "yaml":
        return _dump(draw(VALUES)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "bigint":
        return (_dump(BASE) + "seed: " + "9" * draw(st.integers(4000, 20000)) + "\n").encode()
    text = _dump(BASE).encode()
    return text[:draw(st.integers(0, len(text)))]


SET_KEYS = st.one_of(st.sampled_from(PATHS), st.sampled_from(PATHS), st.sampled_from(PATHS), st.text(max_size=20),
                     st.sampled_from(["devices[9].lends", "devices.1.id", "a..b", "[0]", ".", "devices[-1]",
                                      "devices[99999999999999999999]", "name.x.y", "decoding.speculative.x"]))


@st.composite
def set_options(draw) -> list[str]:
    """One to three ``--set KEY=VALUE`` strings: YAML values, bombs, garbage."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(SET_KEYS)
        kind = draw(st.sampled_from(["keyed"] * 5 + ["value"] * 4 + ["text", "bomb", "noeq"]))
        if kind == "keyed":
            key = draw(st.sampled_from(sorted(KEYED)))
            v = yaml.safe_dump(draw(KEYED[key]), default_flow_style=True, width=10**9).strip()
            if v.endswith("\n..."):
                v = v[:-4].strip()
            out.append(f"{key}={v}")
        elif kind == "value":
            v = yaml.safe_dump(draw(st.one_of(PLAUSIBLE, VALUES)), default_flow_style=True, width=10**9).strip()
            if v.endswith("\n..."):
                v = v[:-4].strip()
            out.append(f"{key}={v}")
        elif kind == "text":
            out.append(f"{key}={draw(st.text(max_size=40))}")
        elif kind == "bomb":
            levels, width = draw(st.integers(1, 10)), draw(st.integers(2, 10))
            inner = ", ".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "lol"] * width) + "]"
                              for i in range(levels + 1))
            out.append(f"{key}={{{inner}}}")
        else:
            out.append(draw(st.text(max_size=30)).replace("=", ""))
    return out


# --------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    """What one input did: ``kind`` is ok | refused | crash | hang; ``detail`` says why."""

    kind: str
    detail: str = ""


@dataclass
class Tally:
    """Counts of outcomes per surface, and the first few crashes/hangs in full."""

    counts: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)

    def add(self, surface: str, outcome: Outcome, given: object) -> None:
        c = self.counts.setdefault(surface, {"inputs": 0, "ok": 0, "refused": 0, "crash": 0, "hang": 0})
        c["inputs"] += 1
        c[outcome.kind] += 1
        if outcome.kind in ("crash", "hang"):
            ex = self.examples.setdefault(surface, [])
            if len(ex) < 5:
                ex.append({"outcome": outcome.kind, "detail": outcome.detail[-2000:], "input": repr(given)[:2000]})


class Hang(BaseException):
    """Raised by the alarm when an input takes longer than its limit."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`Hang` in the main thread after ``seconds`` (SIGALRM; main thread only)."""
    def _alarm(signum, frame):
        raise Hang()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _cli(args: list[str]) -> Outcome:
    """Run ``splitroom ARGS`` in this process; classify the result."""
    from typer.testing import CliRunner

    from splitroom.cli import app
    r = CliRunner().invoke(app, args, catch_exceptions=True)
    exc = r.exception
    if isinstance(exc, Hang):
        raise exc
    out = r.stdout + r.stderr
    if "Traceback" in out:
        return Outcome("crash", out[-2000:])
    if r.exit_code == 0 and exc is None:
        return Outcome("ok")
    if r.exit_code == 2 and isinstance(exc, SystemExit):
        err = r.stderr.strip()
        if "\n" in err or not err.startswith("error: "):
            return Outcome("crash", f"not one line: {err[:2000]}")
        return Outcome("refused", err[:200])
    import traceback
    tb = "".join(traceback.format_exception(exc)) if exc is not None and not isinstance(exc, SystemExit) else ""
    return Outcome("crash", f"exit {r.exit_code}: {type(exc).__name__}: {exc}\n{tb}{out}"[-3000:])


def small_enough_to_simulate(path: str, sets: list[str]) -> bool:
    """True when the scenario loads and its workload is a few hundred tokens at most
    (simulating what a user asked for is not a hang, however long it takes)."""
    from splitroom.scenario import ScenarioError, load
    try:
        s = load(path, sets)
    except ScenarioError:
        return False
    w = s.workload
    return w.questions * (w.prompt_tokens + w.answer_tokens) <= 400


def try_cli(path: Path, sets: list[str], limit_s: float = HANG_S) -> Outcome:
    """``splitroom plan FILE [--set ...] --json``, then ``simulate`` the same when the
    workload is small; the worse outcome of the two."""
    set_args = [a for s in sets for a in ("--set", s)]
    t0 = time.perf_counter()
    try:
        with time_limit(limit_s):
            o = _cli(["plan", str(path), "--json", *set_args])
            if o.kind == "ok" and small_enough_to_simulate(str(path), sets):
                o2 = _cli(["simulate", str(path), "--json", "--no-progress", "--no-range", *set_args])
                if o2.kind != "ok":
                    o = o2
    except Hang:
        return Outcome("hang", f"over {limit_s:g} s")
    except Exception as e:  # from small_enough_to_simulate: the loader itself crashed
        import traceback
        return Outcome("crash", "".join(traceback.format_exception(e))[-3000:])
    o.detail += f" ({time.perf_counter() - t0:.2f} s)" if o.kind == "crash" else ""
    return o


# --------------------------------------------------------------------------- frames


def _frame_bytes(kind: int, qid: int, lap: int, first: int, tokens: int, hidden: int, dtype: int, flags: int,
                 payload_field: int | None, body: bytes, version: int = 1, magic: bytes = b"SRFM") -> bytes:
    import struct
    pf = len(body) if payload_field is None else payload_field
    return struct.pack("<4sBBBBIIIIII", magic, version, kind, dtype, flags, qid, lap, first, tokens, hidden,
                       pf) + body


U32 = st.one_of(st.integers(0, 64), st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**24, 2047, 2048, 2049]),
                st.integers(0, 2**32 - 1))


@st.composite
def frames(draw) -> bytes:
    """Residual frames: random bytes, headers with any field values (claimed payloads up
    to 4 GiB), well-formed frames of any kind/position/length, truncated or padded."""
    kind = draw(st.sampled_from(["bytes", "header", "wellformed", "wellformed", "cut"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "header":
        return _frame_bytes(draw(st.integers(0, 255)), draw(U32), draw(U32), draw(U32), draw(U32), draw(U32),
                            draw(st.integers(0, 255)), draw(st.integers(0, 255)), draw(U32),
                            draw(st.binary(max_size=64)), version=draw(st.sampled_from([1, 1, 1, 0, 2, 255])),
                            magic=draw(st.sampled_from([b"SRFM"] * 5 + [b"SRFX", b"\x00" * 4])))
    tokens = draw(st.integers(0, 80))
    hidden = draw(st.sampled_from([576, 576, 576, 0, 1, 575]))
    dtype = draw(st.sampled_from([0, 0, 1]))
    body = bytes(tokens * hidden * (4 if dtype == 0 else 2))
    if draw(st.booleans()):
        import numpy as np
        body = np.frombuffer(draw(st.binary(min_size=len(body), max_size=len(body))) if len(body) < 4096
                             else body, dtype=np.uint8).tobytes()
    data = _frame_bytes(draw(st.sampled_from([1, 2, 3, 4, 5, 6, 0, 7])), draw(st.integers(0, 5)),
                        draw(st.integers(0, 50)), draw(st.one_of(st.integers(0, 3000), U32)), tokens, hidden, dtype,
                        draw(st.integers(0, 3)), None, body)
    if kind == "cut":
        return data[:draw(st.integers(0, len(data)))] + draw(st.binary(max_size=8))
    return data


class _NullTransport:
    device = "w1"
    handler = None

    def set_handler(self, fn):
        self.handler = fn

    async def send(self, dst, channel, data):
        pass


def worker_node():
    """A worker Node (no stage: nothing is computed) of a two-device chain, hidden 576,
    a 2048-position context: what a device process's frame handler sees."""
    from runtime.control import NodeConfig
    from runtime.room import Node
    cfg = NodeConfig.model_validate({
        "device": "w1", "host": "host", "stages": [["host", 0, 15], ["w1", 15, 30]],
        "scheduler": {"hidden": 576, "context": 2048}, "model_dir": "/nonexistent"})
    node = Node(cfg, None, _NullTransport())
    node.fuzz_loop = asyncio.new_event_loop()  # a device process handles frames inside its event loop
    return node


def try_frame(node, data: bytes) -> Outcome:
    """Decode ``data`` and hand it to a worker node's frame handler. ``refused``: the
    decoder raised FrameError or the node counted it rejected; ``ok``: accepted (queued
    for compute or dropped as stale by the scheduler); anything raised is a crash."""
    from planner.frames import FrameError
    from runtime.codec import decode_frame
    try:
        with time_limit(HANG_S):
            try:
                decode_frame(data)
                decoded = True
            except FrameError:
                decoded = False
            before = node.rejected_frames
            async def handle() -> None:
                node._on_message("host", "residual", data)
                await asyncio.sleep(0)  # let the sends it started run (the transport drops them)
            node.fuzz_loop.run_until_complete(handle())
            while not node.work.empty():  # nothing computes here: forget queued work
                node.work.get_nowait()
            node.residual.clear()
            if len(node.trace) > 1000:
                node.trace.clear()
    except Hang:
        return Outcome("hang", f"over {HANG_S:g} s")
    except Exception as e:
        import traceback
        return Outcome("crash", "".join(traceback.format_exception(e))[-3000:])
    if decoded and node.rejected_frames > before:
        return Outcome("refused", "rejected by the node")
    return Outcome("ok" if decoded else "refused")


# --------------------------------------------------------------------------- control messages


@st.composite
def control_messages(draw) -> bytes:
    """Control-plane JSON: valid messages with fields replaced, random JSON, random bytes."""
    import json
    base = draw(st.sampled_from([
        {"type": "hello", "device": "w1", "host": False, "layers": [15, 30], "lends": 1000},
        {"type": "plan", "host": "host", "stages": [["host", 0, 15], ["w1", 15, 30]],
         "scheduler": {"hidden": 576, "prefill_chunk": 16, "draft_tokens": 2, "async_laps": 2, "eos_token": 2,
                       "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3}},
         "max_new_tokens": 8},
        {"type": "abort", "reason": "x"}, {"type": "bye"},
        {"type": "fault", "lap_id": 3, "device": "w1", "reason": "the residual it sent has 1 NaN/inf value"},
        {"type": "heartbeat", "sent_s": 12.5, "echo_s": 3.25, "held_s": 0.125},
        {"type": "stamps", "arrived": [[3, "host", 12.5]], "sent": [[3, "host", 12.75]]},
        {"type": "progress", "percent": 40}]))
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "json", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        try:
            return json.dumps(draw(VALUES)).encode()
        except ValueError:
            return b"null"
    import copy
    m = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(["type", "device", "host", "layers", "lends", "stages", "stages[0]",
                                     "stages[1]", "stages[0][1]", "scheduler", "scheduler.hidden",
                                     "scheduler.context", "scheduler.draft_tokens", "scheduler.return_path",
                                     "scheduler.dtype", "scheduler.phones", "scheduler.sampling",
                                     "scheduler.sampling.temperature", "scheduler.sampling.top_p",
                                     "scheduler.sampling.top_k", "scheduler.sampling.seed", "lap_id",
                                     "max_new_tokens", "reason", "extra", "sent_s", "echo_s", "held_s",
                                     "arrived", "arrived[0]", "arrived[0][0]", "arrived[0][1]", "arrived[0][2]",
                                     "sent", "percent"]))
        set_path(m, path.replace("][", "].["), draw(st.one_of(PLAUSIBLE, VALUES)))
    try:
        return json.dumps(m, allow_nan=draw(st.booleans())).encode()
    except ValueError:
        return json.dumps(m, default=str).encode()


def try_control(data: bytes) -> Outcome:
    """Parse a control message as a device does, and for a plan build the deal, the
    scheduler settings and the device's chain; a fault goes to a host scheduler (as
    LapFailed) answering a sampled question; a heartbeat, stamps or progress goes to a
    model host's Node as its worker's (its clocks, hop stamps and progress stay bounded).
    ControlError / ValueError is a refusal."""
    from planner.chain import Chain
    from runtime.control import ControlError, Fault, Plan, parse_control
    try:
        with time_limit(HANG_S):
            msg = parse_control(data)
            if isinstance(msg, Plan):
                deal = msg.deal()
                cfg = msg.scheduler.config()
                for dev in {s[0] for s in msg.stages} | {msg.host}:
                    Chain(deal, cfg, runs={dev})
            elif isinstance(msg, Fault):
                _fault_to_host(msg)
            elif msg.type in ("heartbeat", "stamps", "progress"):
                _to_host_node(data)
    except Hang:
        return Outcome("hang", f"over {HANG_S:g} s")
    except (ControlError, ValueError):
        return Outcome("refused")
    except Exception as e:
        import traceback
        return Outcome("crash", "".join(traceback.format_exception(e))[-3000:])
    return Outcome("ok")


_HOST_NODE: list = []


def _to_host_node(data: bytes) -> None:
    """``data`` from worker w1 to one model host Node (made once, never started): it must
    take or ignore it, its clocks, pending stamps and progress within their bounds."""
    if not _HOST_NODE:
        from runtime.control import NodeConfig
        from runtime.room import Node

        class Wire:
            def set_handler(self, fn):
                pass

            async def send(self, dst, channel, data):
                pass
        cfg = NodeConfig(device="host", host="host", stages=[["host", 0, 15], ["w1", 15, 30]],
                         scheduler={"hidden": 576}, model_dir="/nonexistent", peers=["w1"])
        _HOST_NODE.append(Node(cfg, None, Wire()))
    node = _HOST_NODE[0]
    node._on_message("w1", "reply", data)
    from planner.hops import CLOCK_SAMPLES
    if len(node.clocks) > 1 or any(len(c._samples) > CLOCK_SAMPLES for c in node.clocks.values()):
        raise AssertionError(f"clocks grew: {node.clocks}")
    if node.hops.pending > 2 * node.hops.max_pending or not set(node.progress) <= {"w1"}:
        raise AssertionError(f"hop stamps or progress grew: {node.hops.pending}, {node.progress}")


def _fault_to_host(msg) -> None:
    """A Fault as the host takes it: LapFailed to a host scheduler that has a sampled
    question in flight (laps 0-1 its prefill); the scheduler must refuse or ignore."""
    from planner.chain import Chain
    from planner.protocol import LapFailed, QuestionAsked
    from planner.sampling import Sampling
    from planner.scheduler import SchedulerConfig
    from runtime.control import chain_deal
    chain = Chain(chain_deal("host", [["host", 0, 15], ["w1", 15, 30]]), SchedulerConfig(hidden=576, prefill_chunk=4),
                  runs={"host"})
    chain.handle(QuestionAsked(0, "host", (1, 2, 3, 4, 5), 4, Sampling(0.8, seed=1)), 0.0)
    chain.handle(LapFailed(msg.lap_id, msg.device, msg.reason), 0.0)


# --------------------------------------------------------------------------- relay


SDP_GOOD = "\r\n".join([
    "v=0", "o=- 4005022537 4005022537 IN IP4 0.0.0.0", "s=-", "t=0 0", "a=group:BUNDLE 0",
    "a=msid-semantic:WMS *", "m=application 36726 UDP/DTLS/SCTP webrtc-datachannel", "c=IN IP4 192.0.2.2",
    "a=mid:0", "a=sctp-port:5000", "a=max-message-size:262144",
    "a=candidate:f957a2332b1715da3b0ef8ba684454eb 1 udp 2130706431 192.0.2.2 36726 typ host",
    "a=end-of-candidates", "a=ice-ufrag:IdK4", "a=ice-pwd:ti0cfhuodlxbceIR01Tf5V",
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32), "a=setup:actpass", ""])


@st.composite
def sdps(draw) -> str:
    """SDP text: the good offer with lines replaced, inserted, cut, or random text."""
    lines = SDP_GOOD.split("\r\n")
    kind = draw(st.sampled_from(["edit", "edit", "edit", "text"]))
    if kind == "text":
        return draw(st.text(max_size=300))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["replace", "insert", "append", "delete"]))
        prefix = draw(st.sampled_from(["v=", "o=", "s=", "i=", "c=", "b=", "t=", "m=", "a=", "a=candidate:",
                                       "a=ice-pwd:", "a=ice-ufrag:", "a=fingerprint:sha-256 ", "a=mid:", "x=", ""]))
        new = prefix + draw(st.one_of(st.text(max_size=60), st.from_regex(r"[A-Za-z0-9+/ :.-]{0,60}",
                                                                          fullmatch=True)))
        if op == "replace":
            lines[i] = new
        elif op == "insert":
            lines.insert(i, new)
        elif op == "append":
            lines[i] += new
        elif len(lines) > 1:
            del lines[i]
    return draw(st.sampled_from(["\r\n", "\n", "\r"])).join(lines)


def try_sdp(text) -> Outcome:
    """check_sdp on an offer holding ``text``: ok, or RelayReject; anything else a crash.
    An accepted SDP must hold only allowed line types (checked again here)."""
    from runtime.relay import RelayReject, check_sdp
    try:
        with time_limit(HANG_S):
            check_sdp({"type": "offer", "sdp": text})
    except Hang:
        return Outcome("hang", f"over {HANG_S:g} s")
    except RelayReject:
        return Outcome("refused")
    except Exception as e:
        import traceback
        return Outcome("crash", "".join(traceback.format_exception(e))[-3000:])
    for line in filter(None, text.replace("\r\n", "\n").split("\n")):
        if line[:2] not in ("v=", "o=", "s=", "t=", "c=", "b=", "m=", "a="):
            return Outcome("crash", f"accepted a line {line[:60]!r}")
    return Outcome("ok")


@st.composite
def relay_sessions(draw) -> list:
    """What one websocket client sends: text (JSON or not), binary, hellos, signals with
    fuzzed SDPs, a close at some point."""
    import json
    out = []
    for _ in range(draw(st.integers(0, 4))):
        k = draw(st.sampled_from(["hello", "hello", "signal", "signal", "json", "text", "binary"]))
        if k == "hello":
            hello = {"type": "hello", "device": draw(st.one_of(
                st.sampled_from(["a", "b", "fz", "y"]), st.text(max_size=70), st.integers(), st.none()))}
            if draw(st.booleans()):  # asks for ICE servers with a key that is one, or anything
                from runtime.transport.ice import CredentialKey
                hello["ice"] = draw(st.one_of(st.just(CredentialKey().public), st.text(max_size=120),
                                              st.binary(max_size=70).map(lambda b: b.hex()), VALUES))
            try:
                out.append(json.dumps(hello))
            except ValueError:
                out.append("{}")
        elif k == "signal":
            out.append(json.dumps({"type": "signal", "to": draw(st.sampled_from(["y", "fz", "nobody", 3])),
                                   "data": {"type": draw(st.sampled_from(["offer", "answer", "x"])),
                                            "sdp": draw(sdps())}}))
        elif k == "json":
            try:
                out.append(json.dumps(draw(VALUES)))
            except ValueError:
                out.append("{}")
        elif k == "text":
            out.append(draw(st.text(max_size=100)))
        else:
            out.append(draw(st.binary(max_size=100)))
    return out


class RelayFuzzer:
    """One relay on 127.0.0.1 (port 0) in its own event loop, fed session after session;
    a device ``y`` stays connected and must only ever receive peers lists and checked
    SDP signals, and a fresh device must be able to join after every session."""

    def __init__(self):
        import asyncio
        from runtime.relay import Relay, run_relay
        from runtime.transport.ice import TurnIssuer, parse_ice_server
        self.loop = asyncio.new_event_loop()
        turn = TurnIssuer(turn=parse_ice_server("turn:198.51.100.3:3478", credentials=False), secret="fuzz-secret",
                          stun=parse_ice_server("stun:198.51.100.3"))
        self.relay = Relay(hello_timeout_s=5.0, max_clients_per_address=1000, turn=turn)
        self.runner, self.url = self.loop.run_until_complete(run_relay("127.0.0.1", 0, self.relay))
        self.session = None
        self.y = None

    async def _ensure(self):
        import aiohttp
        if self.session is None:
            self.session = aiohttp.ClientSession()
        if self.y is None or self.y.closed:
            self.y = await self.session.ws_connect(f"{self.url}/room/fz")
            await self.y.send_json({"type": "hello", "device": "y"})
            await self.y.receive_json()

    async def _feed(self, msgs: list) -> str | None:
        import asyncio

        import aiohttp

        from runtime.relay import check_sdp
        await self._ensure()
        async with self.session.ws_connect(f"{self.url}/room/fz") as w:
            for m in msgs:
                if w.closed:
                    break
                if isinstance(m, bytes):
                    await w.send_bytes(m)
                else:
                    await w.send_str(m)
        while True:  # what reached y
            try:
                m = await asyncio.wait_for(self.y.receive(), 0.02)
            except asyncio.TimeoutError:
                break
            if m.type != aiohttp.WSMsgType.TEXT:
                return f"y received {m.type}"
            obj = __import__("json").loads(m.data)
            if obj.get("type") == "signal":
                check_sdp(obj["data"])
            elif obj.get("type") != "peers":
                return f"y received {obj}"
        async with self.session.ws_connect(f"{self.url}/room/fz") as ok:
            await ok.send_json({"type": "hello", "device": "probe"})
            got = await asyncio.wait_for(ok.receive_json(), 5)
            if "probe" not in got.get("devices", []):
                return f"a fresh device could not join: {got}"
        return None

    def feed(self, msgs: list) -> Outcome:
        import asyncio
        try:
            problem = self.loop.run_until_complete(asyncio.wait_for(self._feed(msgs), HANG_S))
        except asyncio.TimeoutError:
            return Outcome("hang", f"over {HANG_S:g} s")
        except Exception as e:
            import traceback
            return Outcome("crash", "".join(traceback.format_exception(e))[-3000:])
        return Outcome("crash", problem) if problem else Outcome("ok")

    def close(self) -> None:
        async def _close():
            if self.y is not None:
                await self.y.close()
            if self.session is not None:
                await self.session.close()
            await self.runner.cleanup()
        self.loop.run_until_complete(_close())
        self.loop.close()


# --------------------------------------------------------------------------- weights requests


@st.composite
def weights_requests(draw) -> bytes:
    """Weights-channel requests: fields of the three ops replaced by anything
    (Infinity, NaN, huge ranges, lists), random headers, random bytes."""
    import json
    import struct
    kind = draw(st.sampled_from(["op", "op", "op", "bytes", "header"]))
    if kind == "bytes":
        return draw(st.binary(max_size=100))
    if kind == "header":
        return struct.pack("<BI", ord("Q"), draw(U32)) + draw(st.binary(max_size=100))
    req = draw(st.sampled_from([
        {"id": 1, "op": "manifest", "start": 29, "end": 30, "embedding": False, "head": False},
        {"id": 2, "op": "tensor", "name": "model.layers.29.mlp.up_proj.weight", "offset": 0, "length": 64},
        {"id": 3, "op": "file", "name": "config.json"}]))
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from(["id", "op", "start", "end", "embedding", "head", "host", "name", "offset",
                                    "length"]))
        req[key] = draw(st.one_of(PLAUSIBLE, VALUES, st.sampled_from([float("inf"), float("nan"), -1, 2**70,
                                                                       10**30, "0", True]),
                                  st.integers(-2**40, 2**40)))
    h = json.dumps(req).encode()
    return struct.pack("<BI", ord("Q"), len(h)) + h


def try_weights_request(server, data: bytes) -> Outcome:
    """The server's answer to one request: a refusal or an answer, never an exception."""
    from runtime.weights_share import decode
    try:
        with time_limit(HANG_S):
            reply = server._safe_reply("fuzzer", data)
            _, h, _ = decode(reply)
    except Hang:
        return Outcome("hang", f"over {HANG_S:g} s")
    except Exception as e:
        import traceback
        return Outcome("crash", "".join(traceback.format_exception(e))[-3000:])
    if h.get("error", "").startswith("request failed"):  # the catch-all: something unforeseen
        return Outcome("crash", h["error"])
    return Outcome("ok" if h.get("ok") else "refused")


# --------------------------------------------------------------------------- serve API requests

#: A chat request the API accepts (the room behind it is not attached: 503 after parsing).
GOOD_CHAT = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "What is the capital of France?"}],
             "max_tokens": 5, "stream": False}
_HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=60)


@st.composite
def api_requests(draw) -> tuple[bytes, dict]:
    """``(body, headers)`` for ``POST /v1/chat/completions``: the accepted request with 1-3
    fields (top level or in a message) replaced by anything, extra fields, random JSON,
    text that is not JSON, random bytes; headers with any Content-Type, Authorization
    and Accept (printable ASCII, as HTTP carries them)."""
    import json
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "json", "text", "bytes"]))
    if kind == "bytes":
        body = draw(st.binary(max_size=300))
    elif kind == "text":
        body = draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    else:
        if kind == "json":
            obj = draw(VALUES)
        else:
            obj = json.loads(json.dumps(GOOD_CHAT))
            for _ in range(draw(st.integers(1, 3))):
                where = draw(st.sampled_from(["top", "top", "message", "messages"]))
                value = draw(st.one_of(VALUES, st.sampled_from([float("inf"), float("nan"), -1, 0, 2**63, 10**30,
                                                                "", "x" * 5000, None, [], {}])))
                if where == "top":
                    key = draw(st.sampled_from(["model", "messages", "max_tokens", "max_completion_tokens",
                                                "stream", "stop", "temperature", "top_p", "top_k", "seed", "n",
                                                "stream_options", "logprobs", "tools", "user"])
                               | st.text(max_size=12))
                    obj[key] = value
                elif where == "message" and isinstance(obj.get("messages"), list) and obj["messages"] \
                        and isinstance(obj["messages"][0], dict):
                    key = draw(st.sampled_from(["role", "content", "name"]) | st.text(max_size=8))
                    obj["messages"][0][key] = value
                elif where == "messages":
                    obj["messages"] = draw(st.lists(VALUES, max_size=4))
        try:
            body = json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")
        except (ValueError, TypeError):
            body = b"{}"
    headers = {}
    if draw(st.booleans()):
        headers["Content-Type"] = draw(st.sampled_from(["application/json", "text/plain", "application/json; "
                                                         "charset=latin-1", ""]) | _HEADER_TEXT)
    if draw(st.booleans()):
        headers["Authorization"] = draw(st.sampled_from(["Bearer k", "Bearer ", "Basic x"]) | _HEADER_TEXT)
    if draw(st.booleans()):
        headers["Accept"] = draw(_HEADER_TEXT)
    return body, headers


class ApiFuzzer:
    """The serve API (runtime.serve.server.RoomServer) on 127.0.0.1 in its own event
    loop: each request must get a status other than 500 within the time limit, and
    /health must answer after it (the server is alive: 503 with its JSON body when no
    room is attached, 200 and ready with one).

    Without ``room`` no room is attached: a request the parser accepts gets 503 ("ok").
    With ``room`` a real two-device room answers it (tests/servedroom.py): "ok" is 200,
    or an answer still running after :data:`ANSWER_WAIT_S` (the client goes away, which
    withdraws the question); "refused" a 4xx; any 5xx is a crash (the room is ready).
    :meth:`ask` puts a question to it afterwards."""

    def __init__(self, room: bool = False):
        from runtime.serve.host import start_api
        import contextlib
        import socket
        self.loop = asyncio.new_event_loop()
        self.room = room
        self._stack = contextlib.AsyncExitStack()
        if room:
            from tests.servedroom import served_room
            self.server, self.url = self.loop.run_until_complete(self._stack.enter_async_context(served_room()))
        else:
            sock = socket.create_server(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            self.server, runner = self.loop.run_until_complete(start_api(sock, "smollm2-135m"))
            self._stack.push_async_callback(runner.cleanup)
        self.session = None
        self.statuses: dict[int, int] = {}
        self.gave_up = 0

    async def _feed(self, body: bytes, headers: dict) -> Outcome:
        import aiohttp
        if self.session is None:
            self.session = aiohttp.ClientSession()
        try:
            async with self.session.post(self.url + "/v1/chat/completions", data=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=ANSWER_WAIT_S if self.room else None)
                                         ) as r:
                await r.read()
                status = r.status
        except asyncio.TimeoutError:
            if not self.room:
                raise
            self.gave_up += 1  # an answer still running: this client leaves, its question is withdrawn
            status = 200
        self.statuses[status] = self.statuses.get(status, 0) + 1
        async with self.session.get(self.url + "/health") as h:
            if h.status != (200 if self.room else 503) or (await h.json()).get("ready") is not self.room:
                return Outcome("crash", f"/health answered {h.status} after a request")
        if status >= 500 and (self.room or status != 503):
            return Outcome("crash", f"status {status} for {body[:200]!r} {headers}")
        return Outcome("ok" if status in (200, 503) else "refused")

    def ask(self, question: str, max_tokens: int = 12) -> str:
        """The room's answer to ``question`` (greedy), as text."""
        async def go():
            import aiohttp
            async with aiohttp.ClientSession() as s:
                async with s.post(self.url + "/v1/chat/completions", json={
                        "model": "smollm2-135m", "max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": question}]}) as r:
                    out = await r.json()
            return out["choices"][0]["message"]["content"]
        return self.loop.run_until_complete(asyncio.wait_for(go(), 300))

    def feed(self, given: tuple[bytes, dict]) -> Outcome:
        try:
            return self.loop.run_until_complete(asyncio.wait_for(self._feed(*given), HANG_S))
        except asyncio.TimeoutError:
            return Outcome("hang", f"over {HANG_S:g} s")
        except Exception as e:
            import traceback
            return Outcome("crash", "".join(traceback.format_exception(e))[-3000:])

    def close(self) -> None:
        async def _close():
            if self.session is not None:
                await self.session.close()
            await self._stack.aclose()
        self.loop.run_until_complete(_close())
        self.loop.close()
