"""What a newcomer broke by trying the scenario language and the CLI from the README and
docs/scenario.md alone: each case is bad or extreme input that must end in one line and
exit 2 (docs/scenario.md "Rules for every key"), or a table that must say where time goes."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from planner.deal import LayerRangeError, parse_layers
from splitroom.cli import app

# Two devices, no jitter; the home room's stall episodes are what turned an infinite time
# into a traceback (sim/episodes: int(nan)).
ROOM = """\
name: newcomer
model: smollm2-135m
context: 512
devices:
  - {id: a, lends: 500 MB, memory_bandwidth: 100 GB/s, compute: 10 TFLOPS}
  - {id: b, lends: 500 MB, memory_bandwidth: 100 GB/s, compute: 10 TFLOPS}
stages: [{device: a, layers: "1-15"}, {device: b, layers: "16-30"}]
network: {rtt: 10 ms, bandwidth: 1 Gbit/s}
workload: {questions: 1, prompt_tokens: 8, answer_tokens: 6}
"""
EPISODES = ROOM.replace("bandwidth: 1 Gbit/s}", "bandwidth: 1 Gbit/s, "
                        "episodes: {every: 60 s, lasting: 3 s, extra_rtt: 50 ms}}")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_line_exit_2(r, *parts: str) -> str:
    """Exit 2, one stderr line, no traceback, every part in the line."""
    assert r.exit_code == 2, (r.exit_code, r.stdout[-800:], r.stderr[-800:], r.exception)
    assert isinstance(r.exception, SystemExit), r.exception
    err = r.stderr.strip().splitlines()
    err = [line for line in err if "warning:" not in line]  # the slow-deal warning may come first
    assert len(err) == 1, err
    assert "Traceback" not in r.stderr + r.stdout
    for p in parts:
        assert p in err[0], (p, err[0])
    return err[0]


def write(tmp_path, text: str) -> str:
    f = tmp_path / "room.yaml"
    f.write_text(text)
    return str(f)


# A poll of 1e308 s is a finite time the loader accepts; half of it added to a hop's
# 5 ms flight is still finite, but the simulated clock then overflows to inf.
# An efficiency of 1e-320 is in (0, 1] as documented; roofline / 1e-320 is inf.
@pytest.mark.parametrize("room", [ROOM, EPISODES], ids=["plain", "episodes"])
@pytest.mark.parametrize("setting", ["network.poll=1e308 s", "devices[0].efficiency=1e-320",
                                     "devices[1].overhead={pass: 1e308 s}"])
def test_a_time_too_large_to_simulate_is_one_line_not_nan_or_a_traceback(tmp_path, room, setting):
    f = write(tmp_path, room)
    r = invoke("simulate", f, "--no-progress", "--no-range", "--set", setting)
    one_line_exit_2(r, "room.yaml: ", "not finite", "no prediction")


def test_simulate_json_is_never_nan(tmp_path):
    """--json must be JSON: Python's json writes NaN and Infinity, which JSON has not."""
    f = write(tmp_path, ROOM)
    r = invoke("simulate", f, "--no-progress", "--no-range", "--json", "--set", "network.poll=1e308 s")
    if r.exit_code == 0:
        json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"--json printed {c}"))
    else:
        one_line_exit_2(r, "not finite")


def test_an_ordinary_room_still_simulates(tmp_path):
    """The guard refuses only what overflows: 1 ms of poll is a hop of 5 + 0.5 ms."""
    f = write(tmp_path, ROOM)
    r = invoke("simulate", f, "--no-progress", "--no-range", "--json", "--set", "network.poll=1 ms")
    assert r.exit_code == 0, (r.stderr, r.exception)
    m = json.loads(r.stdout)["metrics"]
    hops = [x["mean_s"] for x in m["breakdown"] if x["kind"] == "hop"]
    # rtt / 2 + poll / 2 = 5.5 ms, plus one token's frame at 125 MB/s: a 32-byte header
    # (planner/frames.py) and SmolLM2's 576-wide residual at float32 (the runtime's own)
    assert all(math.isclose(h, 0.0055 + (32 + 576 * 4) / 125e6, rel_tol=1e-6) for h in hops), hops


@pytest.mark.parametrize("text", ["１-３０", "1_0-30", "1-3_0", "٣-30", "²-30"])
def test_a_layer_range_is_ascii_digits_only(text):
    """int() reads full-width and Arabic-Indic digits and underscores; a range people
    type is plain 1-based digits, anything else is malformed (one line)."""
    with pytest.raises(LayerRangeError) as e:
        parse_layers(text, 30)
    assert e.value.malformed


def test_full_width_digits_in_a_pinned_stage_are_refused_by_plan(tmp_path):
    f = write(tmp_path, ROOM)
    r = invoke("plan", f, "--set", "stages=[{device: a, layers: '１-３０'}]")
    one_line_exit_2(r, "stages[0].layers", "expected a range like '1-13'")


def test_an_empty_stages_list_is_refused_without_a_1_0_range(tmp_path):
    """`stages: []` gave 'stages cover layers 1-0 but the model has 30'."""
    f = write(tmp_path, ROOM)
    r = invoke("plan", f, "--set", "stages=[]")
    err = one_line_exit_2(r, "stages")
    assert "1-0" not in err, err


def test_an_error_after_the_progress_bar_is_still_one_line(tmp_path):
    """Without --no-progress, on stderr that is not a terminal (a log, a pipe), the
    transient progress bar left an empty line before the error: two lines."""
    f = write(tmp_path, ROOM)
    r = invoke("simulate", f, "--no-range", "--set", "workload.prompt_tokens=600")
    assert r.exit_code == 2, (r.stderr, r.exception)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), repr(r.stderr)
    assert "600 tokens" in r.stderr


@pytest.mark.parametrize("room", [ROOM, EPISODES], ids=["plain", "episodes"])
def test_sweep_gives_an_overflowing_combination_that_line_as_its_error(tmp_path, room):
    """sweep printed 'inf ms' and 0.00 tok/s for it (Infinity in --json), or with stall
    episodes the raw 'cannot convert float NaN to integer'; the 1 ms row is predicted."""
    f = write(tmp_path, room)
    r = invoke("sweep", f, "--no-range", "--jobs", "1", "--json", "--vary", "network.poll=1e308 s,1ms")
    assert r.exit_code == 0, (r.stderr, r.exception)
    rows = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"--json printed {c}"))["rows"]
    by = {row["values"][0][1]: row for row in rows}
    assert "not finite" in by["1e308 s"]["error"], by["1e308 s"]
    assert by["1ms"]["error"] is None and by["1ms"]["tokens_per_s"] > 0


@pytest.mark.parametrize("key", ["devices[-1].lends", "devices[x].lends", "devices[0.lends"])
def test_a_set_index_that_is_not_a_list_item_names_the_set(tmp_path, key):
    """--set devices[-1].lends=... said '(top): unknown key (a typo?)': the bracketed
    text became a top-level key."""
    f = write(tmp_path, ROOM)
    err = one_line_exit_2(invoke("plan", f, "--set", f"{key}=1 GB"), "--set", key)
    assert "(top)" not in err, err


@pytest.mark.parametrize("param", ["temperature", "top_p", "top_k"])
def test_a_sampling_parameter_sent_as_a_string_is_shown_as_one(param):
    """`"temperature": "1"` got 'temperature must be a number from 0 to 2 (got 1)': the
    client cannot see that it sent a string."""
    from runtime.serve.api import ApiError, parse_chat_request
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], param: "1"}
    with pytest.raises(ApiError) as e:
        parse_chat_request(body, "smollm2-135m")
    assert e.value.param == param and e.value.status == 400
    assert "'1'" in e.value.message, e.value.message


@pytest.mark.parametrize("param,limit", [("temperature", "0 to 2"), ("top_p", "at most 1"), ("top_k", None)])
def test_an_integer_too_large_for_a_float_is_a_400_naming_the_parameter(param, limit):
    """JSON allows integers of any length: 1 followed by 400 zeros cannot become a float
    (a conversion raises OverflowError, which must not surface as a 500). It is a number,
    out of range (top_k has no upper bound: it is taken, meaning no cut)."""
    from runtime.serve.api import ApiError, parse_chat_request
    body = json.loads('{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], '
                      f'"temperature": 1, "{param}": 1{"0" * 400}}}')
    if limit is None:
        assert parse_chat_request(body, "smollm2-135m").sampling.top_k == 10 ** 400
        return
    with pytest.raises(ApiError) as e:
        parse_chat_request(body, "smollm2-135m")
    assert (e.value.param, e.value.status) == (param, 400) and limit in e.value.message


def test_every_error_names_the_scenario_as_typed(tmp_path):
    """docs/scenario.md: 'FILE: key.path: problem'. `plan DIR/room.yaml --set seed=-1`
    printed 'room.yaml: seed: ...' but `--set stages=[...bad...]` 'DIR/room.yaml: cannot
    deal the room: ...': one command, two names for one file."""
    f = write(tmp_path, ROOM)
    key = one_line_exit_2(invoke("plan", f, "--set", "seed=-1"), "seed")
    deal = one_line_exit_2(invoke("plan", f, "--set", "stages=[{device: a, layers: '2-30'}]"), "cannot deal")
    assert key.startswith(f"error: {f}: ") and deal.startswith(f"error: {f}: "), (key, deal)


@pytest.mark.parametrize("spec", ["{drafter: ngram, draft_passes: k+1}", "{drafter: early_exit, draft_passes: k}"])
def test_draft_passes_needs_the_model_drafter_as_its_siblings_do(tmp_path, spec):
    """draft_model, draft_device and draft_engine with drafter: ngram are refused in one
    line; draft_passes was accepted and silently did nothing."""
    f = write(tmp_path, ROOM)
    one_line_exit_2(invoke("plan", f, "--set", f"decoding.speculative={spec}"),
                    "decoding.speculative", "draft_passes needs drafter: model")


@pytest.mark.parametrize("setting", ["context=true", "seed=true", "workload.questions=true",
                                     "devices[0].efficiency=true", "network.round_trips_per_hop=true"])
def test_a_boolean_is_not_a_number(tmp_path, setting):
    """`--set context=true` planned a room of context 1 and exited 0."""
    f = write(tmp_path, ROOM)
    one_line_exit_2(invoke("plan", f, "--set", setting), setting.split("=")[0].split("[")[0], "boolean")
