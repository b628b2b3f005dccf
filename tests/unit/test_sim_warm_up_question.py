"""A room measured after a warm-up question is warm (``workload.warm_up_tokens``): the
simulator answers one question alone first, leaves it out of every figure and of the
trace, and keeps what it leaves behind, the links' grown congestion windows.

By hand. A host (the desktop, layers 1-20) and a worker (the laptop, 21-30), 40 ms apart,
no jitter, no stall episodes, no hand-off overhead, 100 Gbit/s. Prompts of 16 tokens: one
prefill chunk, a frame of 16 x 576 x 4 + 32 = 36,896 B each way (SmolLM2's hidden size,
float32, the 32-byte header), answers of 4 tokens (one-token frames of 2,336 B).

* With an initial window of 11,600 B (10 chunks of 1160 B) the 32-chunk frame goes as
  10, then 20 (each of the 10 acknowledgements arrives with the window full, grows it a
  chunk and sends two), then the last 2: 2 extra round trips, 80 ms, on each of the two
  hops, and the window is 21 chunks after it (aiortc's slow start, sim.link.sctp_frame_rounds).
  The room's first question gets its first token 160 ms later than in the same room
  without a window. The second question's frame from 21 chunks sends 21, then the last 11
  on the first 6 acknowledgements: 1 extra round trip on each hop, 80 ms, the window 27.
* After a warm-up question (the same 16-token prompt) the first question finds the window
  of 21 chunks and pays 80 ms; the second, from 27 chunks (27, then 5 on the first 3
  acknowledgements), pays 80 ms too. The warm-up is left out of every figure and of the
  trace.
"""

from __future__ import annotations

import pytest

from sim.driver import simulate
from splitroom.scenario import ScenarioError, load

ROOM = ["devices[0].lends=1 GB", "stages=[{device: desktop, layers: '1-20'}, {device: laptop, layers: '21-30'}]",
        "network.rtt=40 ms", "network.jitter={distribution: none}", "network.episodes=null",
        "network.bandwidth=100 Gbit/s", "network.hop_overhead=0 s",
        "workload.questions=2", "workload.prompt_tokens=16", "workload.answer_tokens=4"]
WINDOW = ["network.window=11600 B"]
EXTRA_RTT_S = 2 * 2 * 0.040  # two hops, two extra round trips each
ONE_RTT_S = 2 * 1 * 0.040  # two hops, one extra round trip each


def run(extra):
    return simulate(load("scenarios/home.yaml", ROOM + extra))


def test_a_cold_room_pays_slow_start_on_its_first_question_most():
    base = run([]).metrics["ttft_each_s"]
    assert base[0] == pytest.approx(base[1], abs=1e-9)
    cold = run(WINDOW).metrics["ttft_each_s"]
    assert cold[0] == pytest.approx(base[0] + EXTRA_RTT_S, abs=1e-9)
    assert cold[1] == pytest.approx(base[1] + ONE_RTT_S, abs=1e-9)


def test_after_a_warm_up_question_the_window_has_grown_and_the_warm_up_is_left_out():
    base = run([]).metrics
    res = run(WINDOW + ["workload.warm_up_tokens=2"])
    warm = res.metrics
    assert warm["ttft_each_s"] == pytest.approx([t + ONE_RTT_S for t in base["ttft_each_s"]], abs=1e-9)
    for k in ("questions", "answered", "refused", "tokens", "laps"):
        assert warm[k] == base[k]
    assert (warm["questions"], warm["tokens"]) == (2, 8)  # the warm-up's question and 2 tokens not counted
    # the decode laps (one-token frames, inside the window) are the windowless room's
    assert warm["inter_token_s"] == pytest.approx(base["inter_token_s"], abs=1e-9)
    assert warm["duration_s"] == pytest.approx(base["duration_s"] + 2 * ONE_RTT_S, abs=1e-9)
    # the trace holds the workload's two questions and starts when the warm-up ended
    asked = [(t, o.question_id) for t, o in res.trace if type(o).__name__ == "QuestionAsked"]
    assert [q for _, q in asked] == [0, 1]
    assert {o.question_id for _, o in res.trace if hasattr(o, "question_id")} == {0, 1}
    assert res.trace[0][0] == asked[0][0] > 0.0


def test_warm_up_tokens_bad_input_is_one_line_naming_the_key():
    with pytest.raises(ScenarioError, match=r"workload\.warm_up_tokens") as e:
        load("scenarios/home.yaml", ["workload.warm_up_tokens=-1"])
    assert "\n" not in str(e.value)
    with pytest.raises(ScenarioError, match=r"workload\.warm_up_tokens: a warm-up question cannot go with faults"):
        load("scenarios/home.yaml", ["workload.warm_up_tokens=8", "faults=[{device: phone, at: token 5}]"])


def test_a_real_room_refuses_a_warm_up_question():
    from planner.deal import deal_for
    from splitroom.real_configs import node_configs
    from splitroom.real_errors import RealRunError
    scn = load("scenarios/home.yaml", ["workload.warm_up_tokens=8"])
    with pytest.raises(RealRunError, match=r"^workload\.warm_up_tokens: a real room asks no warm-up question"):
        node_configs(scn, deal_for(scn), "unused", None, "numpy")


def test_each_question_gets_its_own_prompt_length_and_its_frames_pay_for_their_own_size():
    """``workload.prompt_tokens_each`` (a real run's own prompts): questions of 16 and 2
    tokens, asked in turn. The 2-token prompt's frame, 2 x 576 x 4 + 32 = 4,640 B, fits the
    11,600 B window: its question pays nothing, while the 16-token one pays its 2 extra
    round trips on each hop, as in the room without a window plus 160 ms."""
    import dataclasses
    each = (16, 2)

    def go(extra):
        scn = load("scenarios/home.yaml", ROOM + ["workload.questions=3"] + extra)
        scn = dataclasses.replace(scn, workload=dataclasses.replace(scn.workload, prompt_tokens_each=each))
        return simulate(scn, trace=True)

    base, cold = go([]), go(WINDOW)
    asked = [len(o.prompt) for _, o in cold.trace if type(o).__name__ == "QuestionAsked"]
    assert asked == [16, 2, 16]
    b, c = base.metrics["ttft_each_s"], cold.metrics["ttft_each_s"]
    assert c[0] == pytest.approx(b[0] + EXTRA_RTT_S, abs=1e-9)
    assert c[1] == pytest.approx(b[1], abs=1e-9)
