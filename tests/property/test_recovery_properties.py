"""Recovery after lost workers, under random rooms, loss points and delivery orders
(hypothesis, zero-time harness): every question ends answered or refused exactly once;
every question not asked by a lost device is answered with exactly the greedy tokens;
the replay after a re-deal covers exactly the positions so far on every stage of the
new chain; nothing is sent to or run on a lost device after its re-deal."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.chain import merge_lost
from planner.deal import Deal, Stage
from planner.protocol import EmitToken, Redeal, RunStage, SendFrame
from planner.scheduler import SchedulerConfig
from tests.harness import Harness, truth


@st.composite
def rooms(draw):
    n_stages = draw(st.integers(2, 4))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n_stages, max_size=n_stages))
    coordinator = draw(st.booleans())
    names = [f"s{i}" for i in range(n_stages)]
    host = "c" if coordinator else names[0]
    at, stages = 0, []
    for n, s in zip(names, sizes):
        stages.append(Stage(n, at, at + s))
        at += s
    deal = Deal(host=host, split="pinned", stages=tuple(stages), guests=(), fits=True, notes=())
    k = draw(st.sampled_from([0, 0, 1, 3]))
    config = SchedulerConfig(
        hidden=4, prefill_chunk=draw(st.integers(1, 6)), draft_tokens=k,
        async_laps=draw(st.integers(1, 3)) if k else 1,
        return_path=draw(st.sampled_from(["direct", "via_stages"])),
        eos_token=draw(st.sampled_from([None, None, truth(9)])))
    workers = [n for n in names if n != host]
    return deal, config, workers


def reference(plen, max_new, eos):
    ref = [truth(plen + i) for i in range(max_new)]
    return ref[:ref.index(eos)] if eos is not None and eos in ref else ref


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(room=rooms(), data=st.data())
def test_lost_workers_mid_answer_leave_every_answer_token_for_token(room, data):
    deal, config, workers = room
    accepts = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=10))
    counter = iter(range(10**9))
    h = Harness(deal, config, accept=lambda k: accepts[next(counter) % len(accepts)],
                redeal=lambda d, lost: merge_lost(d, lost))
    askers = ["g", "h2", deal.host] + workers
    questions = data.draw(st.lists(st.tuples(st.sampled_from(askers), st.integers(1, 8), st.integers(1, 10)),
                                   min_size=1, max_size=6))
    for qid, (dev, plen, max_new) in enumerate(questions):
        h.ask(qid, dev, plen, max_new)
    n_losses = data.draw(st.integers(1, len(workers)))
    lost = data.draw(st.permutations(workers))[:n_losses]
    loss_steps = sorted(data.draw(st.lists(st.integers(0, 150), min_size=n_losses, max_size=n_losses)))
    deliver_sent = data.draw(st.lists(st.booleans(), min_size=n_losses, max_size=n_losses))
    choices = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=64))
    steps, done = 0, 0
    while True:
        while done < n_losses and steps >= loss_steps[done]:
            h.lose(lost[done], deliver_sent[done])
            done += 1
        if not h.step(choices[steps % len(choices)]):
            if done == n_losses:
                break
            steps = loss_steps[done]  # idle before the loss point: lose it now
            continue
        steps += 1
        assert steps < 100_000

    ended = h.ended()
    ends = [x for x in h.log if type(x).__name__ in ("AnswerDone", "Refuse")]
    assert set(ended) == set(range(len(questions))) and len(ends) == len(questions)
    answers = h.answers()
    coordinator_alone = deal.host == "c" and set(lost) == set(workers)  # no stage left to hold a layer
    for qid, (dev, plen, max_new) in enumerate(questions):
        ref = reference(plen, max_new, config.eos_token)
        toks = answers.get(qid, [])
        assert toks == ref[:len(toks)]
        if dev in lost or coordinator_alone:
            continue  # a lost asker's question may be refused; so may all when nothing is left
        if ended[qid].startswith("refused") and "waiting" in ended[qid]:
            continue  # refused when asked by the queue limits (2 per device), not by the loss
        assert ended[qid] == "answered", (qid, ended[qid])
        assert toks == ref
    emits = [x for x in h.log if isinstance(x, EmitToken)]
    for qid, toks in answers.items():
        assert [x.index for x in emits if x.question_id == qid] == list(range(len(toks)))
    assert not [x for x in h.ignored if x.reason == "bug"]  # no driver mistake among what was ignored

    # the replay covers exactly the positions so far, on every stage of the new chain
    redeals = [(i, x) for i, x in enumerate(h.log) if isinstance(x, Redeal)]
    for n, (i, r) in enumerate(redeals):
        end = redeals[n + 1][0] if n + 1 < len(redeals) else len(h.log)
        window = h.log[i:end]
        dead = set(lost[:n + 1])
        for c in window:  # nothing for a device that left
            if isinstance(c, RunStage):
                assert c.device not in dead
            if isinstance(c, SendFrame):
                assert c.dst not in dead and c.src not in dead
        if r.question_id is None:
            continue
        resumed = any(isinstance(c, EmitToken) and c.question_id == r.question_id for c in window)
        if not resumed:
            continue
        for dev in {r.host} | {d for d, _, _ in r.stages}:
            spans = sorted((c.first_pos, c.tokens) for c in window
                           if isinstance(c, RunStage) and c.device == dev and c.question_id == r.question_id
                           and c.lap_id >= r.first_lap and c.first_pos + c.tokens <= r.replay_tokens)
            covered = [p for a, t in spans for p in range(a, a + t)]
            assert covered == list(range(r.replay_tokens)), (dev, spans, r)
