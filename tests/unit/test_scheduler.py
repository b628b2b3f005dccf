"""The host and worker state machines, driven by the zero-time harness."""

import pytest

from planner.deal import Deal, Stage
from planner.frames import FrameKind
from planner.protocol import Draft, EmitToken, LapEnded, RunHead, RunStage, SendFrame, Wake
from planner.scheduler import HostScheduler, SchedulerConfig
from tests.harness import Harness, truth


def chain(*sizes, host="h", names=None):
    names = names or [host] + [f"w{i}" for i in range(1, len(sizes))]
    at, stages = 0, []
    for n, s in zip(names, sizes):
        stages.append(Stage(n, at, at + s))
        at += s
    return Deal(host=host, split="speed", stages=tuple(stages), guests=(), fits=True, notes=())


def cfg(**kw):
    base = dict(hidden=8, prefill_chunk=4)
    base.update(kw)
    return SchedulerConfig(**base)


def test_plain_decode_answers_the_reference_tokens_one_lap_each():
    h = Harness(chain(2, 2, 2), cfg())
    h.ask(0, "h", prompt_len=10, max_new=7)
    h.run()
    assert h.answers()[0] == [truth(10 + i) for i in range(7)]
    assert h.ended() == {0: "answered"}
    decode_laps = [x for x in h.laps() if x.kind == "decode"]
    # first token comes from the prefill; then one lap per token
    assert len(decode_laps) == 6 and all(x.kept == 1 and not x.stale for x in decode_laps)


def test_prefill_goes_in_chunks_and_only_the_last_chunk_returns():
    h = Harness(chain(2, 2), cfg(prefill_chunk=4))
    h.ask(0, "h", prompt_len=10, max_new=1)
    h.run()
    prefill_runs = [c for c in h.log if isinstance(c, RunStage) and c.device == "h"]
    assert [(c.first_pos, c.tokens) for c in prefill_runs] == [(0, 4), (4, 4), (8, 2)]
    sends = [c for c in h.log if isinstance(c, SendFrame)]
    back = [c for c in sends if c.dst == "h"]
    assert len(back) == 1 and back[0].header.first_pos == 8
    heads = [c for c in h.log if isinstance(c, RunHead)]
    assert [c.rows for c in heads] == [1]


def test_prefill_is_pipelined_chunk_two_starts_before_chunk_one_leaves_stage_two():
    h = Harness(chain(2, 2), cfg(prefill_chunk=4))
    h.ask(0, "h", prompt_len=8, max_new=1)
    h.step()  # question asked -> host runs chunk 0
    h.step()  # host finished chunk 0 -> frame to w1 and chunk 1 starts on the host
    runs = [c for c in h.log if isinstance(c, RunStage) and c.device == "h"]
    assert [c.first_pos for c in runs] == [0, 4]
    assert not any(isinstance(c, RunStage) and c.device == "w1" for c in h.log)


@pytest.mark.parametrize("k,accept,expect_per_lap", [(4, 4, 5), (4, 0, 1), (4, 2, 3), (3, 3, 4)])
def test_speculative_keeps_accepted_prefix_plus_correction(k, accept, expect_per_lap):
    h = Harness(chain(3, 3), cfg(draft_tokens=k), accept=lambda kk: accept)
    h.ask(0, "h", prompt_len=5, max_new=41)
    h.run()
    assert h.answers()[0] == [truth(5 + i) for i in range(41)]
    verify = [x for x in h.laps() if x.kind == "verify" and not x.stale]
    # every full lap keeps exactly accepted + 1 tokens (the last may be cut by max_new)
    assert all(x.kept == expect_per_lap for x in verify[:-1])
    assert sum(x.kept for x in verify) >= 40


def test_rejection_rolls_back_the_host_kv_to_the_accepted_prefix():
    h = Harness(chain(2, 2), cfg(draft_tokens=4), accept=lambda k: 1)
    h.ask(0, "h", prompt_len=6, max_new=3)
    h.run()
    from planner.protocol import RollbackKV
    rb = [c for c in h.log if isinstance(c, RollbackKV) and c.device == "h"]
    # first verify lap: inputs at 6..10 (last prompt token at 5? no: first token at 6 is
    # committed by the prefill, lap starts at position 6); 1 draft accepted -> keep 6, 7
    assert rb and rb[0].to_pos == 8


def test_worker_rolls_back_by_frame_position_and_drops_stale_frames():
    h = Harness(chain(2, 2, 2), cfg(draft_tokens=3, async_laps=3), accept=lambda k: 1)
    h.ask(0, "h", prompt_len=4, max_new=20)
    h.run()
    assert h.answers()[0] == [truth(4 + i) for i in range(20)]
    from planner.protocol import DropFrame, RollbackKV
    assert any(isinstance(c, RollbackKV) and c.device != "h" for c in h.log)
    assert any(x.stale for x in h.laps())
    # a dropped frame is never one of a lap that was kept
    kept = {x.lap_id for x in h.laps() if not x.stale}
    assert not any(isinstance(c, DropFrame) and c.header.lap_id in kept for c in h.log)


def test_async_laps_keep_that_many_verify_laps_in_flight_when_all_accepted():
    h = Harness(chain(2, 2), cfg(draft_tokens=2, async_laps=3), accept=lambda k: k)
    h.ask(0, "h", prompt_len=4, max_new=30)
    max_live = 0
    while h.step():
        live = sum(1 for i in h.host.inflight if not h.host.laps[i].stale)
        max_live = max(max_live, live)
    assert max_live == 3
    assert h.answers()[0] == [truth(4 + i) for i in range(30)]
    # nothing was rejected: the only stale laps are those still in flight when the answer was complete
    verify = [x for x in h.laps() if x.kind == "verify"]
    last_kept = max(i for i, x in enumerate(verify) if not x.stale)
    assert not any(x.stale for x in verify[:last_kept]) and len(verify) - 1 - last_kept <= 2


def test_async_continuation_lap_drafts_k_plus_one_tokens():
    h = Harness(chain(2, 2), cfg(draft_tokens=2, async_laps=2), accept=lambda k: k)
    h.ask(0, "h", prompt_len=4, max_new=10)
    h.run()
    ks = [c.k for c in h.log if isinstance(c, Draft)]
    assert ks[0] == 2 and 3 in ks


def test_via_stages_returns_through_every_stage():
    h = Harness(chain(1, 1, 1), cfg(return_path="via_stages"))
    h.ask(0, "h", prompt_len=2, max_new=2)
    h.run()
    hops = [(c.src, c.dst, c.header.kind) for c in h.log if isinstance(c, SendFrame) and c.header.lap_id == 1]
    assert hops == [("h", "w1", FrameKind.DECODE), ("w1", "w2", FrameKind.DECODE), ("w2", "w1", FrameKind.RETURN),
                    ("w1", "h", FrameKind.RETURN)]


def test_direct_return_skips_the_detour():
    h = Harness(chain(1, 1, 1), cfg())
    h.ask(0, "h", prompt_len=2, max_new=2)
    h.run()
    hops = [(c.src, c.dst) for c in h.log if isinstance(c, SendFrame) and c.header.lap_id == 1]
    assert hops == [("h", "w1"), ("w1", "w2"), ("w2", "h")]


def test_queue_refuses_the_eleventh_and_a_devices_third():
    h = Harness(chain(2, 2), cfg())
    h.ask(0, "a", 3, 2)  # answered now
    for i in range(1, 3):
        h.ask(i, "a", 3, 2)  # two waiting from a
    h.ask(3, "a", 3, 2)  # a's third waiting: refused
    for i in range(4, 13):
        h.ask(i, f"d{i}", 3, 2)  # 8 fit (10 waiting), then the 11th waiting is refused
    # deliver only the asks first
    while h.channels.get(("ask",)):
        h.channels  # noqa
        h.dispatch(h.channels[("ask",)].popleft())
    ended = h.ended()
    assert ended[3].startswith("refused: a already has 2")
    refused_full = [q for q, r in ended.items() if "queue full" in r]
    assert refused_full == [12]
    assert len(h.host.queue) == 10
    h.run()
    assert sum(1 for r in h.ended().values() if r == "answered") == 11


def test_phones_holding_layers_are_woken_each_lap_unless_wake_is_off():
    d = chain(2, 2, names=["h", "ph"])
    h = Harness(d, cfg(phones=frozenset({"ph"})))
    h.ask(0, "h", 2, 3)
    h.run()
    wakes = [c for c in h.log if isinstance(c, Wake)]
    host_runs = [c for c in h.log if isinstance(c, RunStage) and c.device == "h"]
    assert len(wakes) == len(host_runs) and all(w.device == "ph" and w.max_s == 0.05 for w in wakes)
    h2 = Harness(d, cfg(phones=frozenset({"ph"}), wake=False))
    h2.ask(0, "h", 2, 3)
    h2.run()
    assert not any(isinstance(c, Wake) for c in h2.log)


def test_eos_ends_the_answer_early():
    h = Harness(chain(2, 2), cfg(eos_token=truth(7)))
    h.ask(0, "h", prompt_len=4, max_new=50)
    h.run()
    assert h.answers()[0] == [truth(4), truth(5), truth(6)]
    from planner.protocol import AnswerDone
    done = [c for c in h.log if isinstance(c, AnswerDone)]
    assert done[0].reason == "eos" and done[0].tokens == 3


def test_host_holding_every_layer_needs_no_frames():
    h = Harness(chain(4), cfg(draft_tokens=2), accept=lambda k: 1)
    h.ask(0, "h", prompt_len=3, max_new=9)
    h.run()
    assert h.answers()[0] == [truth(3 + i) for i in range(9)]
    assert not any(isinstance(c, SendFrame) for c in h.log)


def test_coordinator_host_with_no_layers_embeds_and_sends():
    d = Deal(host="c", split="pinned", stages=(Stage("a", 0, 2), Stage("b", 2, 4)), guests=(), fits=True, notes=())
    h = Harness(d, cfg())
    h.ask(0, "c", prompt_len=3, max_new=4)
    h.run()
    assert h.answers()[0] == [truth(3 + i) for i in range(4)]
    first = [c for c in h.log if isinstance(c, SendFrame)][0]
    assert (first.src, first.dst) == ("c", "a")


def test_host_range_must_start_the_chain():
    d = Deal(host="h", split="pinned", stages=(Stage("a", 0, 2), Stage("h", 2, 4)), guests=(), fits=True, notes=())
    with pytest.raises(ValueError):
        HostScheduler(d, cfg())


def test_device_lost_refuses_active_and_waiting_questions():
    from planner.protocol import DeviceLost
    h = Harness(chain(2, 2), cfg())
    h.ask(0, "x", 3, 5)
    h.ask(1, "y", 3, 5)
    h.step()
    h.step()
    h.dispatch(DeviceLost("w1", "timeout"))
    h.run()
    ended = h.ended()
    assert ended[0].startswith("refused") and ended[1].startswith("refused")
    assert not any(isinstance(c, EmitToken) and c.question_id == 1 for c in h.log)


def test_emitted_tokens_are_counted_once():
    h = Harness(chain(2, 2), cfg(draft_tokens=3, async_laps=2), accept=lambda k: 2)
    h.ask(0, "h", 4, 25)
    h.run()
    emits = [c for c in h.log if isinstance(c, EmitToken)]
    assert [c.index for c in emits] == list(range(25))
    assert h.host.emitted == 25
    kept = sum(x.kept for x in h.laps() if not x.stale)
    assert kept >= 25 and kept - 25 < 4 + 1  # only the last lap may keep more than the answer needs
    assert isinstance(h.laps()[0], LapEnded)
