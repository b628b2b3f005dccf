"""Several questions in flight (``decoding.questions_in_flight``): the planner's
memory accounting of one KV cache per question in flight on every stage.

Expected values are hand calculations on a toy model: 10 layers of exactly 1 GiB and
a KV cache of 1/4 GiB per layer at the room's context of 1,024 positions (f16), no
embedding, head or draft.
"""

from __future__ import annotations

from planner.deal import deal
from planner.model import ModelSpec
from planner.room import DealOptions, Device

GiB = 2**30
CONTEXT = 1024
#: a quarter GiB of f16 KV per layer at CONTEXT positions
KV_PER_TOKEN = GiB // 4 // CONTEXT


def toy() -> ModelSpec:
    return ModelSpec(id="toy-kv", name="toy-kv", layers=10, hidden=2048, layer_bytes=GiB,
                     layer_active_bytes=GiB, layer_flops_per_token=0.0, kv_bytes_per_token=KV_PER_TOKEN)


def room() -> list[Device]:
    return [Device(id="host", kind="computer", lends_bytes=8 * GiB),
            Device(id="desk", kind="computer", lends_bytes=8 * GiB)]


def test_one_cache_is_the_product_pages_deal():
    # 1 + 1/4 GiB a layer: 8 / 1.25 = 6.4, so each holds 6; the host's 6, the desk the other 4
    d = deal(room(), toy(), DealOptions(context_tokens=CONTEXT, host="host"))
    assert d.kv_caches == 1 and d.fits
    assert [(s.device, s.layers) for s in d.stages] == [("host", 6), ("desk", 4)]


def test_two_caches_are_counted_in_every_stage():
    # 1 + 2/4 GiB a layer: 8 / 1.5 = 5.33 -> 5 each, 10 in all: the model just fits
    d = deal(room(), toy(), DealOptions(context_tokens=CONTEXT, host="host", kv_caches=2))
    assert d.kv_caches == 2 and d.fits
    assert [(s.device, s.layers) for s in d.stages] == [("host", 5), ("desk", 5)]
    used = {sh.device: sh.used_bytes for sh in d.shares}
    assert used == {"host": 5 * GiB + 5 * 2 * GiB // 4, "desk": 5 * GiB + 5 * 2 * GiB // 4}
    # what is left after 5 GiB of weights (3 GiB), over 5 layers x 2 caches x 1/4 GiB per 1,024
    # positions: 3 GiB / (2.5 GiB / 1024) = 1228.8 positions per question
    assert {sh.device: sh.max_context for sh in d.shares} == {"host": 1228, "desk": 1228}


def test_caches_that_do_not_fit_are_dealt_down_never_over_committed():
    # 4 caches: 2 GiB a layer, 4 each = 8 < 10; 3 caches: 1.75 GiB, 4 each (4.57) = 8 < 10;
    # 2 caches fit (above): the deal holds 2 and says so
    d = deal(room(), toy(), DealOptions(context_tokens=CONTEXT, host="host", kv_caches=4))
    assert d.kv_caches == 2 and d.fits
    assert [(s.device, s.layers) for s in d.stages] == [("host", 5), ("desk", 5)]
    assert d.notes[-1].startswith("2 of the 4 questions in flight fit")
    for sh in d.shares:
        assert sh.used_bytes <= sh.lends_bytes


def test_a_room_that_cannot_hold_one_cache_still_says_it_does_not_fit():
    small = [Device(id="host", kind="computer", lends_bytes=5 * GiB),
             Device(id="desk", kind="computer", lends_bytes=5 * GiB)]
    d = deal(small, toy(), DealOptions(context_tokens=CONTEXT, host="host", kv_caches=3))
    assert d.kv_caches == 1 and not d.fits


def test_lap_cost_with_questions_in_flight_by_hand():
    from planner.lapcost import SAMPLE_S, LapCost
    from planner.room import Network

    # measured 10 ms per layer everywhere; a 1 GiB head over 100 GB/s scaled by measured/roofline
    devs = [Device(id="host", kind="computer", lends_bytes=8 * GiB, s_per_layer=0.010, memory_bandwidth_Bps=100e9),
            Device(id="desk", kind="computer", lends_bytes=8 * GiB, s_per_layer=0.010, memory_bandwidth_Bps=100e9)]
    model = ModelSpec(id="t", name="t", layers=10, hidden=8, layer_bytes=GiB, layer_active_bytes=GiB,
                      layer_flops_per_token=0.0, kv_bytes_per_token=0, embedding_bytes=GiB,
                      residual_bytes_per_token=0)
    lc = LapCost(devs, model, Network(rtt_s=0.040, hop_overhead_s=0.0, bandwidth_Bps=1e12))
    head = GiB / 100e9 * (0.010 / (GiB / 100e9)) + SAMPLE_S  # = 10 ms + 0.1 ms
    stages = [("host", 0, 6), ("desk", 6, 10)]
    hop = 0.020 + 32 / 1e12
    lap = head + 0.060 + 0.040 + 2 * hop  # 0.1401 + 0.04 = 0.180... s
    assert abs(lc.lap_s("host", stages) - lap) < 1e-12
    assert abs(lc.tokens_per_s_in_flight("host", stages, 1) - 1 / lap) < 1e-9
    # two questions: 2 / lap = 11.1 tok/s, under the host's bound 1 / (60 ms + head) = 14.3
    assert abs(lc.tokens_per_s_in_flight("host", stages, 2) - 2 / lap) < 1e-9
    # four: the host is busy 70.1 ms per token, so at most 14.27 tok/s
    assert abs(lc.tokens_per_s_in_flight("host", stages, 4) - 1 / (0.060 + head)) < 1e-9


def test_a_frame_carries_its_kv_cache_slot():
    import pytest

    from planner.frames import MAX_SLOTS, FrameError, FrameHeader, FrameKind, decode_header, encode_header
    for slot in (0, 1, 9, MAX_SLOTS - 1):
        h = FrameHeader(FrameKind.DECODE, 7, 8, 9, 0, 16, returns=True, slot=slot)
        raw = encode_header(h)
        assert raw[7] == 1 | slot << 1  # the flags byte: bit 0 returns, bits 1-4 the slot
        assert decode_header(raw) == h
    with pytest.raises(FrameError):
        encode_header(FrameHeader(FrameKind.DECODE, 7, 8, 9, 0, 16, slot=MAX_SLOTS))
    bad = bytearray(encode_header(FrameHeader(FrameKind.DECODE, 7, 8, 9, 0, 16)))
    bad[7] = 0x40  # a flag no side defines
    with pytest.raises(FrameError, match="flags"):
        decode_header(bytes(bad))


def test_aggregate_rate_and_time_to_first_token_from_asking_by_hand():
    from planner.metrics import compute
    from planner.protocol import AnswerDone, BeginAnswer, EmitToken, QuestionAsked
    tr = [(0.0, QuestionAsked(1, "a", (1,), 3)), (0.0, QuestionAsked(2, "b", (1,), 2)),
          (0.0, BeginAnswer(1, "a", 1)), (0.5, EmitToken(1, "a", 0, 5)), (1.0, EmitToken(1, "a", 1, 5)),
          (1.5, EmitToken(1, "a", 2, 5)), (1.5, AnswerDone(1, "a", 3, "length")),
          (1.5, BeginAnswer(2, "b", 1)), (2.0, EmitToken(2, "b", 0, 5)), (4.0, EmitToken(2, "b", 1, 5)),
          (4.0, AnswerDone(2, "b", 2, "length"))]
    m = compute(tr)
    assert m["aggregate_tokens_per_s"] == 5 / 4.0  # 5 tokens from the first ask (0 s) to the last (4 s)
    # from asking: question 1 waited 0.5 s, question 2 2.0 s; numpy's linear percentiles of [0.5, 2.0]
    assert m["ttft_asked_s"]["p50"] == 1.25
    assert abs(m["ttft_asked_s"]["p99"] - (0.5 + 0.99 * 1.5)) < 1e-12


def test_simulated_clients_ask_at_once_and_each_asks_again_when_answered():
    from planner.protocol import AnswerDone, QuestionAsked
    from sim.driver import simulate
    from splitroom.scenario import load
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    scn = load(root / "scenarios" / "home.yaml", ["workload.clients=3", "workload.questions=5"])
    tr = simulate(scn).trace
    asked = [(t, o) for t, o in tr if isinstance(o, QuestionAsked)]
    done = {o.question_id: t for t, o in tr if isinstance(o, AnswerDone)}
    assert sorted(done) == [0, 1, 2, 3, 4]
    assert [o.question_id for _, o in asked] == [0, 1, 2, 3, 4]
    assert [t for t, _ in asked[:3]] == [0.0, 0.0, 0.0]
    assert {o.device for _, o in asked[:3]} == {"client-0", "client-1", "client-2"}
    # one question answered at a time: question 3 is asked when question 0 ends, by its client
    assert asked[3][0] == done[0] and asked[3][1].device == "client-0"
    assert asked[4][0] == done[1] and asked[4][1].device == "client-1"


def test_the_scenario_key_reaches_the_deal_and_the_scheduler():
    from pathlib import Path

    from planner.deal import deal as make_deal
    from planner.scheduler import SchedulerConfig
    from splitroom.scenario import load
    home = Path(__file__).resolve().parents[2] / "scenarios" / "home.yaml"
    scn = load(home, ["decoding.questions_in_flight=3", "context=512"])
    assert scn.decoding.questions_in_flight == 3 and scn.options.kv_caches == 3
    d = make_deal(scn.devices, scn.model, scn.options)
    assert d.kv_caches == 3 and SchedulerConfig.from_scenario(scn, deal=d).questions_in_flight == 3
    # at home.yaml's own context (2,048) the desktop holds one cache of its 19 layers and no
    # more (plan: max_context 2,395 positions), so the deal deals the room down to one
    scn = load(home, ["decoding.questions_in_flight=3"])
    d = make_deal(scn.devices, scn.model, scn.options)
    assert d.kv_caches == 1 and d.fits
    assert SchedulerConfig.from_scenario(scn, deal=d).questions_in_flight == 1


def test_the_in_flight_line_says_how_many_of_those_asked_the_room_holds():
    from splitroom.report import in_flight_line

    assert in_flight_line(1, 1) is None and in_flight_line(1, None) is None
    assert in_flight_line(3, 3) == "questions in flight: 3 at once, each with its own KV cache on every stage"
    assert in_flight_line(3, None).startswith("questions in flight: 3 at once")  # a deal by hand: as asked
    assert in_flight_line(4, 2).startswith("questions in flight: 2 of the 4 asked, as the stages hold only 2 KV caches")
    assert in_flight_line(3, 1).startswith("questions in flight: 1 of the 3 asked, as the stages hold only 1 KV cache ")


def test_simulate_says_when_the_room_holds_fewer_questions_in_flight_than_asked():
    """home.yaml at its own context (2,048): the desktop's 19 layers leave room for one KV cache
    (`plan`: max_context 2,395 positions with one; two would need 2 x 2,048), so N = 3 is dealt
    down to 1 and the table says so; at context 512 all three fit (docs/benchmarks.md's rooms)."""
    from typer.testing import CliRunner

    from splitroom.cli import app

    def simulate(*sets: str) -> str:
        args = ["simulate", "scenarios/home.yaml", "--no-progress", "--no-range", "--set", "workload.questions=2"]
        for s in sets:
            args += ["--set", s]
        r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        return r.output

    assert "questions in flight: 1 of the 3 asked" in simulate("decoding.questions_in_flight=3", "workload.clients=2")
    assert "questions in flight: 3 at once" in simulate("decoding.questions_in_flight=3", "workload.clients=2",
                                                        "context=512")
    assert "questions in flight" not in simulate()
