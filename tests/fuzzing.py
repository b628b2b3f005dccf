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

import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hypothesis import strategies as st

#: Seconds one input may take before it counts as a hang.
HANG_S = 20.0

#: A valid two-device room of the real model, small enough to simulate in milliseconds.
BASE = {
    "name": "fuzz",
    "seed": 3,
    "model": "smollm2-135m",
    "context": 256,
    "devices": [
        {"id": "a", "lends": "1 GiB", "memory_bandwidth": "50 GB/s", "compute": "2 TFLOPS"},
        {"id": "b", "kind": "phone", "lends": "200 MB", "ms_per_layer": "0.5 ms"},
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
    kind = draw(st.sampled_from(["mutated"] * 6 + ["bomb", "deep", "yaml", "bytes", "cut", "bigint"]))
    if kind == "mutated":
        return _dump(draw(mutated_scenarios())).encode()
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
        kind = draw(st.sampled_from(["value"] * 6 + ["text", "bomb", "noeq"]))
        if kind == "value":
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
                o2 = _cli(["simulate", str(path), "--json", "--no-progress", *set_args])
                if o2.kind != "ok":
                    o = o2
    except Hang:
        return Outcome("hang", f"over {limit_s:g} s")
    except Exception as e:  # from small_enough_to_simulate: the loader itself crashed
        import traceback
        return Outcome("crash", "".join(traceback.format_exception(e))[-3000:])
    o.detail += f" ({time.perf_counter() - t0:.2f} s)" if o.kind == "crash" else ""
    return o
