"""Fuzzing every outside input, briefly (issue 11): scenario files and ``--set`` values
through the CLI entry point. No input may crash (a traceback, an exit status other
than 0 or 2, more than one line of error) or hang.

The inputs come from tests/fuzzing.py. The default run keeps to a few dozen inputs per
surface (seconds); ``SPLITROOM_FUZZ_EXAMPLES=N`` asks for more here, and
tests/benchmark/test_fuzz_counts.py is the long counted run (docs/fuzzing.md).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings

from tests.fuzzing import BASE, _dump, scenario_files, set_options, try_cli

FAST = settings(max_examples=int(os.environ.get("SPLITROOM_FUZZ_EXAMPLES", "30")), deadline=None,
                suppress_health_check=list(HealthCheck), database=None)


def check(o):
    assert o.kind in ("ok", "refused"), f"{o.kind}: {o.detail}"


@FAST
@given(data=scenario_files())
def test_scenario_files_never_crash(tmp_path_factory, data):
    f = tmp_path_factory.mktemp("fz") / "room.yaml"
    f.write_bytes(data)
    check(try_cli(f, []))


@FAST
@given(sets=set_options())
def test_set_values_never_crash(tmp_path_factory, sets):
    f = tmp_path_factory.mktemp("fz") / "room.yaml"
    f.write_text(_dump(BASE))
    check(try_cli(f, sets))


def test_base_room_is_accepted_and_simulated(tmp_path):
    """The fuzzers' starting point is valid, so mutations test validation, not a broken base."""
    from tests.fuzzing import _cli, small_enough_to_simulate
    f = tmp_path / "room.yaml"
    f.write_text(_dump(BASE))
    assert small_enough_to_simulate(str(f), [])
    assert _cli(["simulate", str(f), "--json", "--no-progress"]).kind == "ok"


def test_a_known_crash_counts_as_one():
    """The classifier itself: an exception other than SystemExit is a crash, exit 2 with
    one line is a refusal, and a second line of error makes it a crash."""
    from tests.fuzzing import _cli
    assert _cli(["plan", "/nonexistent/x.yaml"]).kind == "refused"
    assert _cli(["no-such-command"]).kind == "crash"  # click's usage error: exit 2, several lines


# --- frames, control messages, relay, weights requests (the device and relay surfaces) ---

from tests import fuzzing  # noqa: E402


@FAST
@given(data=fuzzing.frames())
def test_frames_never_crash_a_worker(data):
    check(fuzzing.try_frame(fuzzing.worker_node(), data))


@FAST
@given(data=fuzzing.control_messages())
def test_control_messages_never_crash(data):
    check(fuzzing.try_control(data))


@FAST
@given(text=fuzzing.sdps())
def test_sdps_are_accepted_or_refused(text):
    check(fuzzing.try_sdp(text))


def _feed_all(fuzzer, strategy) -> None:
    """Every input ``strategy`` draws (FAST's number) through ``fuzzer.feed``: none may crash or hang."""
    @FAST
    @given(x=strategy)
    def go(x):
        check(fuzzer.feed(x))
    go()


def test_relay_sessions_leave_the_relay_serving():
    rf = fuzzing.RelayFuzzer()
    try:
        _feed_all(rf, fuzzing.relay_sessions())
    finally:
        rf.close()


def test_weights_requests_are_answered_or_refused():
    import asyncio


    from runtime.transport import LoopbackHub
    from runtime.weights import ensure_safetensors
    from runtime.weights_share import serve_weights

    async def make():
        return serve_weights(LoopbackHub().transport("server"), ensure_safetensors(), holds=(29, 30, False, False))
    loop = asyncio.new_event_loop()
    srv = loop.run_until_complete(make())
    try:
        @FAST
        @given(data=fuzzing.weights_requests())
        def go(data):
            check(fuzzing.try_weights_request(srv, data))
        go()
    finally:
        srv.close()
        loop.close()


def test_the_frame_classifier_sees_a_good_frame_and_a_long_one():
    """A well-formed decode frame is accepted; a prefill frame past the 2048-position
    context is refused by the node (counted), not passed on."""
    import numpy as np

    from planner.frames import FrameHeader, FrameKind
    from runtime.codec import encode_frame
    node = fuzzing.worker_node()
    ok = encode_frame(FrameHeader(FrameKind.PREFILL, 1, 1, 0, 4, 576), np.zeros((4, 576), np.float32))
    assert fuzzing.try_frame(node, ok).kind == "ok"
    long = encode_frame(FrameHeader(FrameKind.PREFILL, 2, 2, 0, 2100, 576), np.zeros((2100, 576), np.float32))
    assert fuzzing.try_frame(node, long).kind == "refused" and node.rejected_frames == 1


def test_api_requests_never_get_500_nor_stop_the_server():
    af = fuzzing.ApiFuzzer()
    try:
        _feed_all(af, fuzzing.api_requests())
        assert af.statuses.get(503, 0) + af.statuses.get(400, 0) > 0  # parsed and answered, not all refused early
    finally:
        af.close()


def test_api_requests_with_a_room_attached_never_get_500_and_the_room_still_answers():
    """The same requests answered by a real room (tests/servedroom.py), then a normal
    question: its answer names Paris (SmolLM2's greedy answer, as `splitroom generate`
    gives it)."""
    af = fuzzing.ApiFuzzer(room=True)
    try:
        _feed_all(af, fuzzing.api_requests())
        assert "Paris" in af.ask("What is the capital of France?")
    finally:
        af.close()
