"""Bad input through the CLI (issue 11): every input below prints ONE line on stderr
naming the file (or option) and the key path, exits with status 2, and shows no
traceback; nothing is half-written."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from splitroom.cli import app

ONE = """\
name: one
model: smollm2-135m
context: 2048
devices:
  - id: a
    lends: 1 GiB
workload: {questions: 1, prompt_tokens: 8, answer_tokens: 6}
"""

TWO = ONE.replace("    lends: 1 GiB\n", "    lends: 1 GiB\n  - id: b\n    lends: 1 GiB\n")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_line_exit_2(r, *parts: str) -> str:
    """Exit 2, one stderr line, no traceback, every part in the line."""
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr, r.exception)
    assert isinstance(r.exception, SystemExit), r.exception
    # a first use of the bundled model on this machine converts it once, with progress lines
    # ("splitroom: converting ...", "dequantized N/M", "wrote ... MB"); the error is the rest
    err = "\n".join(ln for ln in r.stderr.strip().splitlines() if not ln.startswith("splitroom: ")).strip()
    assert err and "\n" not in err, err
    assert "Traceback" not in r.stderr + r.stdout
    for p in parts:
        assert p in err, (p, err)
    return err


def write(tmp_path, text: str, name: str = "room.yaml"):
    f = tmp_path / name
    f.write_text(text)
    return str(f)


def test_acceptance_null_without_recorded_lengths_cannot_be_simulated(tmp_path):
    f = write(tmp_path, ONE + "decoding: {speculative: {acceptance: null}}\n")
    # planning does not need an acceptance model: null is allowed there (documented)
    assert invoke("plan", f, "--json").exit_code == 0
    one_line_exit_2(invoke("simulate", f, "--no-progress"), "room.yaml: ", "decoding.speculative.acceptance",
                    "null", "accepted_lengths")


def test_acceptance_null_with_recorded_lengths_simulates(tmp_path):
    f = write(tmp_path, ONE + "decoding: {speculative: {acceptance: null, draft_tokens: 2, drafter: ngram, "
                              "accepted_sequence: [2, 1]}}\n")
    r = invoke("simulate", f, "--no-progress", "--json")
    assert r.exit_code == 0, r.stderr


def test_simulate_refuses_a_drafter_the_model_does_not_have(tmp_path):
    # SmolLM2 has no draft layer (MTP head): the default drafter cannot run, in any room.
    f = write(tmp_path, ONE)
    one_line_exit_2(invoke("simulate", f, "--no-progress", "--set", "decoding.speculative.draft_tokens=4"),
                    "room.yaml: ", "decoding.speculative.drafter", "draft_layer", "smollm2-135m", "ngram")
    r = invoke("simulate", f, "--no-progress", "--json", "--set", "decoding.speculative.draft_tokens=4",
               "--set", "decoding.speculative.drafter=ngram")
    assert r.exit_code == 0, r.stderr


def test_run_real_refuses_a_room_that_does_not_fit_before_starting_it(tmp_path):
    # 30 layers of SmolLM2 and its embedding (about 540 MB at float32) in 400 MB lent.
    f = write(tmp_path, ONE.replace("lends: 1 GiB", "lends: 400 MB"))
    one_line_exit_2(invoke("run", f, "--real", "--loopback", "--timeout", "20"), "room.yaml: ",
                    "the room does not fit", "a needs")


def test_run_real_refuses_a_prompt_longer_than_the_context_with_the_lengths(tmp_path):
    # 2,100 words of one token each (" word" is one token of SmolLM2's vocabulary) and
    # the chat template's few: more than the 2,048 positions of the context.
    f = write(tmp_path, ONE + "  prompts: [\"" + "word " * 2100 + "\"]\n")
    f2 = write(tmp_path, open(f).read().replace("workload: {questions: 1, prompt_tokens: 8, answer_tokens: 6}\n"
                                                "  prompts:", "workload:\n  questions: 1\n  answer_tokens: 6\n"
                                                "  prompts:"), "room2.yaml")
    err = one_line_exit_2(invoke("run", f2, "--real", "--loopback", "--timeout", "20"), "room2.yaml: ",
                          "question 1 does not fit", "+ 6 answer tokens > 2,048 positions")
    n = int(err.split("a prompt of ")[1].split(" tokens")[0].replace(",", ""))
    assert 2100 < n < 2200


def test_run_real_in_process_delay_refuses_jitter_before_starting_the_room(tmp_path):
    # the in-process delay applies one round trip and no jitter: a room that asks for jitter is
    # refused in one line (the prediction would count jitter the room never had)
    f = write(tmp_path, TWO + "network: {rtt: 40 ms, jitter: {distribution: normal, scale: 5 ms}}\n")
    one_line_exit_2(invoke("run", f, "--real", "--loopback", "--in-process-delay", "--timeout", "20"),
                    "room.yaml: ", "network.jitter 5 ms", "in-process delay has no jitter")


def test_serve_in_process_delay_refuses_jitter_before_starting_the_room(tmp_path):
    # as run --real: the in-process delay has no jitter, so serve refuses such a room in one line
    f = write(tmp_path, TWO + "network: {rtt: 40 ms, jitter: {distribution: normal, scale: 5 ms}}\n")
    one_line_exit_2(invoke("serve", f, "--loopback", "--in-process-delay", "--port", "0"),
                    "room.yaml: ", "network.jitter 5 ms", "in-process delay has no jitter")


@pytest.mark.parametrize("seed", ["-1", "-99999999999999999999", "1.5", "many", str(2**64)])
def test_bad_seed(tmp_path, seed):
    f = write(tmp_path, ONE + f"seed: {seed}\n")
    one_line_exit_2(invoke("simulate", f, "--no-progress"), "room.yaml: seed:")


def test_largest_seed_is_accepted(tmp_path):
    f = write(tmp_path, ONE + f"seed: {2**64 - 1}\n")
    assert invoke("simulate", f, "--no-progress", "--json").exit_code == 0


def test_plot_of_a_room_whose_gaps_are_all_equal(tmp_path):
    """One device, no jitter: every inter-token gap is the same (numpy's "Too many bins")."""
    f = write(tmp_path, ONE)
    png = tmp_path / "one.png"
    r = invoke("simulate", f, "--no-progress", "--plot", str(png))
    assert r.exit_code == 0, (r.stderr, r.exception)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hist_bins_for_equal_and_spread_values():
    import numpy as np

    from splitroom.plots import _hist_bins
    eq = np.array([12.3, 12.3 + 1e-12, 12.3])
    assert _hist_bins(eq) == {"bins": 1, "range": (12.3 - 0.5, 12.3 + 1e-12 + 0.5)}
    np.histogram(eq, **_hist_bins(eq))  # numpy accepts it
    spread = np.array([1.0, 2.0, 4.0])
    assert _hist_bins(spread) == {"bins": 60, "range": (1.0, 4.0)}


@pytest.mark.parametrize("option", ["--trace", "--plot"])
def test_output_into_a_missing_directory(tmp_path, option):
    f = write(tmp_path, ONE)
    target = tmp_path / "no" / "such" / "out.file"
    err = one_line_exit_2(invoke("simulate", f, "--no-progress", option, str(target)), option, "does not exist")
    assert str(target.parent) in err
    assert not (tmp_path / "no").exists()


def test_output_onto_a_directory(tmp_path):
    f = write(tmp_path, ONE)
    one_line_exit_2(invoke("simulate", f, "--no-progress", "--trace", str(tmp_path)), "--trace", "directory")


@pytest.mark.parametrize("data, byte", [(b'name: "caf\xe9"\n', "0xe9"), (b"\xff\xfename: x\n", "0xff")])
def test_scenario_that_is_not_utf8(tmp_path, data, byte):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(data)
    one_line_exit_2(invoke("plan", str(f)), "latin1.yaml: ", "not UTF-8", byte)


def test_calibration_file_that_is_not_utf8(tmp_path):
    (tmp_path / "cal.yaml").write_bytes(b"measured: {ms_per_layer: {a: \"1 \xb5s\"}}\n")
    f = write(tmp_path, ONE + "calibration: cal.yaml\n")
    one_line_exit_2(invoke("plan", f), "room.yaml", "cal.yaml", "not UTF-8")


@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_relay_port_out_of_range(port):
    one_line_exit_2(invoke("relay", "--port", port), f"--port {port}", "0-65535")


def test_relay_port_in_use():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        port = s.getsockname()[1]
        one_line_exit_2(invoke("relay", "--port", str(port)), f"--port {port}", "cannot listen")
    finally:
        s.close()


@pytest.mark.parametrize("key, value, kind", [
    ("compute", "0 TFLOPS", "compute"),
    ("ms_per_layer", "0 ms", "a time"),
    ("memory_bandwidth", "0 GB/s", "a rate"),
    ("copy_speed", "0 GB/s", "a rate"),
])
@pytest.mark.parametrize("room", [ONE, TWO], ids=["one-device", "two-devices"])
@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_zero_capacity_device(tmp_path, key, value, kind, room, command):
    f = write(tmp_path, room.replace("    lends: 1 GiB\n", f"    lends: 1 GiB\n    {key}: {value}\n", 1))
    one_line_exit_2(invoke(command, f), f"room.yaml: devices[0].{key}: ", kind, "more than 0", value)


def test_zero_network_bandwidth(tmp_path):
    f = write(tmp_path, TWO + "network: {bandwidth: 0 Gbit/s}\n")
    one_line_exit_2(invoke("simulate", f), "room.yaml: network.bandwidth: ", "more than 0")


@pytest.mark.parametrize("text, parts", [
    ("context: 100000000\n", ["context:", "less than or equal to 16777216"]),
    ("workload: {questions: 1000000000}\n", ["workload.questions", "100000"]),
    ("decoding: {speculative: {acceptance: .nan}}\n", ["decoding.speculative.acceptance"]),
    ("devices: [{id: a, lends: 1 GiB, emulate: {slowdown: .inf}}]\n", ["devices[0].emulate.slowdown", "finite"]),
    ("name: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[x]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n", ["nested more than 32"]),
])
def test_huge_and_odd_values(tmp_path, text, parts):
    base = ONE if not text.startswith("devices") else ONE.split("devices:")[0]
    if text.startswith("workload"):
        base = ONE.replace("workload: {questions: 1, prompt_tokens: 8, answer_tokens: 6}\n", "")
    one_line_exit_2(invoke("plan", write(tmp_path, base + text)), "room.yaml: ", *parts)


def test_integer_too_long_to_read(tmp_path):
    one_line_exit_2(invoke("plan", write(tmp_path, ONE + "seed: " + "9" * 5000 + "\n")), "room.yaml: ", "4300")


def test_yaml_nested_beyond_the_parser(tmp_path):
    one_line_exit_2(invoke("plan", write(tmp_path, "name: " + "[" * 20000 + "]" * 20000 + "\n")),
                    "room.yaml: ", "nested too deep")


def bomb(levels: int, width: int = 9) -> str:
    """A "billion laughs" YAML: ``width ** levels`` leaves from a few hundred bytes."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nname: *l{levels}\n"


def test_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    """9**10 = 3.5e9 leaves from a few hundred bytes: expanded, they would take gigabytes and
    hours. The refusal must come from counting at most MAX_VALUES visits, so the process's
    peak of new memory stays tiny (a bound on bytes, which a busy machine cannot miss)."""
    import tracemalloc
    from splitroom import scenario
    f = write(tmp_path, ONE.replace("name: one\n", "") + bomb(9))
    one_line_exit_2(invoke("plan", f), "room.yaml: ", "alias")
    tracemalloc.start()
    try:
        with pytest.raises(scenario.ScenarioError, match="alias"):
            scenario.load(f)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the YAML text is ~1 KB and its loaded graph shares every alias (10 lists of 9); the
    # count's stack holds at most depth x width entries: far below 32 MB, where an expansion
    # of even 0.1 % of the leaves (3.5e6 list slots of 8 bytes = 28 MB) would pass it
    assert peak_bytes < 32 * 2**20, peak_bytes


def test_alias_bomb_in_a_set_value(tmp_path):
    f = write(tmp_path, ONE)
    value = "{a: &a [x, x, x, x, x, x, x, x], b: &b [*a, *a, *a, *a, *a, *a, *a, *a], " \
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b], d: &d [*c, *c, *c, *c, *c, *c, *c, *c], " \
            "e: &e [*d, *d, *d, *d, *d, *d, *d, *d], f: [*e, *e, *e, *e, *e, *e, *e, *e]}"
    one_line_exit_2(invoke("plan", f, "--set", f"name={value}"), "room.yaml: ", "--set", "alias")


def test_small_shared_alias_is_fine(tmp_path):
    text = ONE.replace("devices:\n  - id: a\n    lends: 1 GiB\n",
                       "devices:\n  - &dev {id: a, lends: 1 GiB, compute: 1 TFLOPS}\n  - {<<: *dev, id: b}\n")
    r = invoke("plan", write(tmp_path, text), "--json")
    assert r.exit_code == 0, r.stderr


def test_long_value_is_shown_short(tmp_path):
    f = write(tmp_path, ONE.replace("lends: 1 GiB", "lends: " + "x" * 100_000))
    err = one_line_exit_2(invoke("plan", f), "devices[0].lends", "expected a size")
    assert len(err) < 300


@pytest.mark.parametrize("context", ["1", "79"])
def test_simulate_questions_longer_than_the_context_are_refused(tmp_path, context):
    """2 questions of 32 + 48 tokens: neither fits 79 positions (nor 1), none is
    reported answered, and the line names the lengths."""
    f = write(tmp_path, TWO.replace("workload: {questions: 1, prompt_tokens: 8, answer_tokens: 6}",
                                    "workload: {questions: 2, prompt_tokens: 32, answer_tokens: 48}"))
    one_line_exit_2(invoke("simulate", f, "--no-progress", "--set", f"context={context}"),
                    "room.yaml: ", "none of its 2 questions", "2 refused", "32 tokens", "48 answer tokens",
                    f"> {context} positions")


def test_simulate_questions_that_just_fit_are_answered(tmp_path):
    import json
    f = write(tmp_path, TWO.replace("workload: {questions: 1, prompt_tokens: 8, answer_tokens: 6}",
                                    "workload: {questions: 2, prompt_tokens: 32, answer_tokens: 48}"))
    r = invoke("simulate", f, "--no-progress", "--json", "--set", "context=80")
    assert r.exit_code == 0, r.stderr
    m = json.loads(r.stdout)["metrics"]
    assert (m["answered"], m["refused"]) == (2, 0)


@pytest.mark.parametrize("args, parts", [
    (["--backend", "cuda"], ["--backend cuda", "numpy or wgpu"]),
    (["--timeout", "-1"], ["--timeout -1", "more than 0"]),
    (["--timeout", "nan"], ["--timeout nan", "more than 0"]),
])
def test_run_real_options_are_checked_before_anything_starts(tmp_path, args, parts):
    f = write(tmp_path, ONE)
    one_line_exit_2(invoke("run", f, "--real", *args), *parts)


@pytest.mark.parametrize("dist", ["pareto", "paretonormal"])
def test_heavy_tail_shape_must_be_above_one(tmp_path, dist):
    f = write(tmp_path, TWO + f"network: {{jitter: {{distribution: {dist}, scale: 1 ms, shape: 0.5}}}}\n")
    one_line_exit_2(invoke("simulate", f), "room.yaml: network.jitter: ", "shape > 1", "0.5")


@pytest.mark.parametrize("where", ["network: {window: 0 TB}\n",
                                   "network: {links: [{between: [a, b], window: 0 B}]}\n"])
def test_zero_transport_window(tmp_path, where):
    """Found by the long fuzzing run: a zero congestion window was a simulator traceback."""
    f = write(tmp_path, TWO + where)
    one_line_exit_2(invoke("simulate", f), "room.yaml: network.", "window", "more than 0")


def test_calibration_path_with_a_nul_character(tmp_path):
    """Found by the long fuzzing run: open() raised ValueError (embedded null byte)."""
    f = write(tmp_path, ONE + 'calibration: "a\\0b"\n')
    one_line_exit_2(invoke("plan", f), "room.yaml: calibration", "not a file name")


@pytest.mark.parametrize("args,parts", [
    (["--executor", "dask"], ["--executor", "process or ray", "dask"]),
    (["--sort", "price"], ["--sort", "cost", "price"]),
    (["--sort", "cost"], ["--sort cost", "no device", "price"]),  # no device of ONE has a price
])
def test_sweep_executor_and_sort_are_checked(tmp_path, args, parts):
    scn = tmp_path / "one.yaml"
    scn.write_text(ONE)
    one_line_exit_2(invoke("sweep", str(scn), "--vary", "network.rtt=1ms,2ms", "--jobs", "1", "--json", *args), *parts)


def test_an_unreachable_relay_is_one_line_in_words():
    # a loopback port nobody listens on (bound, then closed): the connection is refused
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = invoke("join", f"ws://127.0.0.1:{port}/room/x", "--device", "a", "--peers", "b", "--timeout", "5")
    assert r.exit_code != 0
    err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and err[0].endswith(f"cannot reach the relay at ws://127.0.0.1:{port}/room/x: "
                                            "Connection refused"), r.stderr
    assert "ConnectionKey" not in r.stderr and "Traceback" not in r.stderr


def test_a_killed_device_is_reported_as_killed_not_by_its_stale_log_line():
    from splitroom.real_procs import ended_how
    stale = "w: every device connected; serving"  # what a worker logs long before it is killed
    assert ended_how(-9, stale) == "killed by SIGKILL"
    assert ended_how(-15, stale) == "killed by SIGTERM"
    assert ended_how(3, "w: could not join room r: timed out") == "status 3: w: could not join room r: timed out"
    assert ended_how(1, "") == "status 1"


@pytest.mark.parametrize("flag,value,expected", [("--rejoin-live", v, "0 to 600") for v in ("-1", "nan", "601")]
                         + [("--slowdown", v, "1 to 100") for v in ("0.5", "nan", "101")])
def test_join_rejoin_live_and_slowdown_out_of_range_are_one_line(flag, value, expected):
    r = invoke("join", "ws://127.0.0.1:9/room/x", "--device", "a", "--peers", "b", flag, value)
    assert r.exit_code == 2
    err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and f"{flag} {value}" in err[0] and expected in err[0], r.stderr
    assert "Traceback" not in r.stderr
