"""Several questions in flight (``questions_in_flight`` N > 1) under random rooms (ends-local
ones among them: the host's tail runs the last layers), questions, decodings, acceptance,
losses and delivery orders (hypothesis, zero-time
harness whose KV caches hold token ids per slot: tests/kvharness.py).

The reference is each question alone: :func:`tests.kvharness.alone` decodes its
prompt with the target model (a hash of the whole prefix), greedy or with the
question's own uniform stream, independently of the scheduler. A lap run over another
question's cache, a position not rolled back or a frame that skipped a stage changes
the tokens, so "every answer equals its answer alone" checks the slots too.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.chain import merge_lost
from planner.deal import Deal, Stage
from planner.privacy import tail_id
from planner.protocol import AnswerDone, BeginAnswer, EmitToken, Refuse
from planner.sampling import Sampling
from planner.scheduler import MAX_WAITING, MAX_WAITING_PER_DEVICE, SchedulerConfig
from tests.kvharness import KVHarness, alone, model_next

EOS = 2


@st.composite
def rooms(draw, min_stages=1):
    n_stages = draw(st.integers(min_stages, 4))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n_stages, max_size=n_stages))
    coordinator = draw(st.booleans()) and n_stages > 1
    names = [f"s{i}" for i in range(n_stages)]
    host = "c" if coordinator else names[0]
    at, stages = 0, []
    for n, s in zip(names, sizes):
        stages.append(Stage(n, at, at + s))
        at += s
    # ends-local privacy (planner/privacy.py): the host's own tail runs the last layers
    tail = tail_id(host) if not coordinator and n_stages > 1 and draw(st.booleans()) else None
    if tail is not None:
        stages.append(Stage(tail, at, at + draw(st.integers(1, 2))))
    deal = Deal(host=host, split="pinned", stages=tuple(stages), guests=(), fits=True, notes=())
    k = draw(st.sampled_from([0, 0, 1, 3]))
    config = SchedulerConfig(
        hidden=4, prefill_chunk=draw(st.integers(1, 5)), draft_tokens=k,
        async_laps=draw(st.integers(1, 3)) if k else 1,
        return_path=draw(st.sampled_from(["direct", "via_stages"])),
        phones=frozenset(draw(st.sets(st.sampled_from(names)))),
        eos_token=EOS, questions_in_flight=draw(st.integers(1, 4)))
    return deal, config, [n for n in names if n != host]  # the workers a room can lose (never the tail)


def _questions(draw, askers):
    qs = draw(st.lists(st.tuples(st.sampled_from(askers), st.lists(st.integers(3, 1500), min_size=1, max_size=7),
                                 st.integers(1, 9), st.sampled_from([None, None, 11, 12345])),
                       min_size=1, max_size=8))
    return [(dev, prompt, max_new, None if seed is None else Sampling(temperature=0.8, seed=seed))
            for dev, prompt, max_new, seed in qs]


def _reference(prompt, max_new, sampling, qid):
    seed = None if sampling is None else (sampling.seed if sampling.seed is not None else qid)
    return alone(prompt, max_new, sampling, seed, stop=frozenset({EOS}))


def _drive(h: KVHarness, choices, limit, on_step=None):
    steps = 0
    most = 0
    while True:
        if on_step is not None:
            on_step(steps)
        if not h.step(choices[steps % len(choices)]):
            if on_step is None or not on_step(-1):
                return most
            continue
        most = max(most, h.host.in_flight)
        steps += 1
        assert steps < limit


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(room=rooms(), data=st.data())
def test_interleaved_questions_answer_each_as_alone(room, data):
    deal, config, _ = room
    accepts = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=20))
    counter = iter(range(10**9))
    h = KVHarness(deal, config, accept=lambda k: accepts[next(counter) % len(accepts)])
    questions = _questions(data.draw, ["a", "b", "c", "s0"])
    for qid, (dev, prompt, max_new, sampling) in enumerate(questions):
        h.ask_prompt(qid, dev, prompt, max_new, sampling)
    choices = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=64))
    most = _drive(h, choices, 200_000)
    ended = h.ended()
    ends = [x for x in h.log if isinstance(x, (AnswerDone, Refuse))]
    assert set(ended) == set(range(len(questions))) and len(ends) == len(questions)
    # answered, or refused by page 001's queue limits only
    assert all(v == "answered" or "waiting" in v for v in ended.values()), ended
    assert most <= config.questions_in_flight  # never more in flight than asked for
    assert h.max_waiting_seen <= MAX_WAITING and h.max_waiting_per_device_seen <= MAX_WAITING_PER_DEVICE
    assert not h.corrupt_laps
    answers = h.answers()
    for qid, (dev, prompt, max_new, sampling) in enumerate(questions):
        if ended[qid] == "answered":
            assert answers.get(qid, []) == _reference(prompt, max_new, sampling, qid), qid
        else:
            assert qid not in answers
    emits = [x for x in h.log if isinstance(x, EmitToken)]
    for qid, toks in answers.items():
        assert [x.index for x in emits if x.question_id == qid] == list(range(len(toks)))
    assert not [i for i in h.ignored if i.reason == "bug"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(room=rooms(min_stages=2), data=st.data())
def test_a_lost_worker_replays_every_question_in_flight(room, data):
    deal, config, workers = room
    accepts = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=10))
    counter = iter(range(10**9))
    h = KVHarness(deal, config, accept=lambda k: accepts[next(counter) % len(accepts)],
                  redeal=lambda d, lost: merge_lost(d, lost))
    askers = ["g", "h2", deal.host] + workers
    questions = _questions(data.draw, askers)
    for qid, (dev, prompt, max_new, sampling) in enumerate(questions):
        h.ask_prompt(qid, dev, prompt, max_new, sampling)
    n_losses = data.draw(st.integers(1, len(workers)))
    lost = data.draw(st.permutations(workers))[:n_losses]
    loss_steps = sorted(data.draw(st.lists(st.integers(0, 150), min_size=n_losses, max_size=n_losses)))
    deliver_sent = data.draw(st.lists(st.booleans(), min_size=n_losses, max_size=n_losses))
    choices = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=64))
    done = [0]

    def on_step(step):  # lose the next device at its step, or now when the room went idle first
        if done[0] < n_losses and (step < 0 or step >= loss_steps[done[0]]):
            h.lose(lost[done[0]], deliver_sent[done[0]])
            done[0] += 1
            return True
        return False
    most = _drive(h, choices, 200_000, on_step)
    assert most <= config.questions_in_flight
    ended = h.ended()
    ends = [x for x in h.log if isinstance(x, (AnswerDone, Refuse))]
    assert set(ended) == set(range(len(questions))) and len(ends) == len(questions)
    assert not h.corrupt_laps
    answers = h.answers()
    coordinator_alone = deal.host == "c" and set(lost) == set(workers)
    for qid, (dev, prompt, max_new, sampling) in enumerate(questions):
        ref = _reference(prompt, max_new, sampling, qid)
        toks = answers.get(qid, [])
        assert toks == ref[:len(toks)], qid  # whatever was emitted is the answer alone, never repeated
        if "waiting" in ended[qid]:  # refused by page 001's queue limits when asked
            assert not toks
        elif dev not in lost and not coordinator_alone:
            assert ended[qid] == "answered", (qid, ended[qid])
            assert toks == ref


def test_the_harness_model_depends_on_the_whole_prefix():
    # the reference is not position-only: two prompts of one length continue differently
    assert model_next([5, 6, 7]) != model_next([5, 6, 8])
    assert alone([5, 6, 7], 6) != alone([9, 6, 7], 6)


def test_two_questions_share_the_chain_each_in_its_own_slot():
    """By hand: N = 2, two stages, one decode token per lap. Both questions begin at
    once, in slots 0 and 1, and the host's stage runs the second question's prefill
    while the first's frame is at the worker."""
    deal = Deal(host="h", split="pinned", stages=(Stage("h", 0, 1), Stage("w", 1, 2)), guests=(), fits=True,
                notes=())
    h = KVHarness(deal, SchedulerConfig(hidden=4, prefill_chunk=8, questions_in_flight=2))
    h.ask_prompt(0, "a", [10, 11], 3)
    h.ask_prompt(1, "b", [20, 21, 22], 3)
    h.ask_prompt(2, "c", [30], 2)
    h.step()  # question 0 asked
    h.step()  # question 1 asked: begins at once
    begun = [x for x in h.log if isinstance(x, BeginAnswer)]
    assert [b.question_id for b in begun] == [0, 1]
    stages = [x for x in h.log if type(x).__name__ == "RunStage"]
    assert [(s.question_id, s.slot, s.first_pos, s.tokens) for s in stages] == [(0, 0, 0, 2), (1, 1, 0, 3)]
    h.run()
    assert h.answers() == {0: alone([10, 11], 3), 1: alone([20, 21, 22], 3), 2: alone([30], 2)}
    # question 2 waited for a free slot and took the one its predecessor freed
    begun = [x for x in h.log if isinstance(x, BeginAnswer)]
    assert [b.question_id for b in begun] == [0, 1, 2]
    first_of_2 = next(x for x in h.log if type(x).__name__ == "RunStage" and x.question_id == 2)
    done = [x.question_id for x in h.log if isinstance(x, AnswerDone)]
    assert first_of_2.slot == {0: 0, 1: 1}[done[0]]


def test_a_re_deal_that_holds_fewer_caches_refuses_the_questions_begun_last():
    """By hand: three stages, N = 2, both questions in flight when w1 is lost; the re-deal
    (w1's layers to the stage before) holds one KV cache per stage: question 0 (begun
    first) is replayed and answered as alone, question 1 refused with the reason."""
    from dataclasses import replace
    deal = Deal(host="h", split="pinned", stages=(Stage("h", 0, 1), Stage("w0", 1, 2), Stage("w1", 2, 3)),
                guests=(), fits=True, notes=())
    h = KVHarness(deal, SchedulerConfig(hidden=4, prefill_chunk=8, questions_in_flight=2),
                  redeal=lambda d, lost: replace(merge_lost(d, lost), kv_caches=1))
    h.ask_prompt(0, "a", [10, 11], 6)
    h.ask_prompt(1, "b", [20, 21, 22], 6)
    h.step()
    h.step()
    for _ in range(12):  # a few laps of each
        h.step()
    assert h.host.in_flight == 2
    h.lose("w1")
    h.run()
    ended = h.ended()
    assert ended[0] == "answered" and h.answers()[0] == alone([10, 11], 6)
    assert ended[1] == "refused: w1 left the room and the devices left hold the KV caches of 1 question at once"
    assert h.answers().get(1, []) == alone([20, 21, 22], 6)[:len(h.answers().get(1, []))]
    assert h.host.questions_in_flight == 1
