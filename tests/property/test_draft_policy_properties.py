"""draft_tokens: auto in the scheduler, under random rooms, lap costs, priors,
acceptance sequences and delivery orders (hypothesis, the zero-time harness): the text
is the greedy reference's, every question ends once, and no lap drafts a negative
number of tokens, more than max_draft_tokens (plus the bonus guess of an async
continuation lap), or past the context."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.deal import Deal, Stage
from planner.draft_policy import DraftPolicy
from planner.protocol import Draft, LapEnded, LapKind, RunStage
from planner.scheduler import SchedulerConfig
from tests.harness import Harness, truth


@st.composite
def adaptive_rooms(draw):
    n_stages = draw(st.integers(1, 3))
    names = [f"s{i}" for i in range(n_stages)]
    at, stages = 0, []
    for n in names:
        s = draw(st.integers(1, 3))
        stages.append(Stage(n, at, at + s))
        at += s
    deal = Deal(host=names[0], split="pinned", stages=tuple(stages), guests=(), fits=True, notes=())
    kmax = draw(st.integers(1, 6))
    lap_s = tuple(draw(st.lists(st.floats(0.01, 1.0), min_size=kmax + 1, max_size=kmax + 1)))
    prior = tuple(draw(st.lists(st.floats(0.0, 1.0), min_size=kmax, max_size=kmax)))
    by_k = tuple(tuple(draw(st.lists(st.floats(0.0, 1.0), min_size=k, max_size=k))) for k in range(1, kmax + 1)) \
        if draw(st.booleans()) else ()
    policy = DraftPolicy(lap_s, prior, prior_weight=draw(st.floats(0.5, 8.0)), probe_every=draw(st.integers(1, 5)),
                         by_k=by_k)
    config = SchedulerConfig(hidden=4, prefill_chunk=draw(st.integers(1, 5)), draft_tokens=kmax,
                             async_laps=draw(st.integers(1, 3)), return_path=draw(st.sampled_from(["direct",
                                                                                                 "via_stages"])),
                             eos_token=draw(st.sampled_from([None, None, truth(7)])),
                             context=draw(st.sampled_from([None, None, 24, 40])), draft_policy=policy)
    return deal, config


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(room=adaptive_rooms(), data=st.data())
def test_adaptive_drafts_keep_the_greedy_text_and_stay_in_bounds(room, data):
    deal, config = room
    kmax = config.draft_tokens
    accepts = data.draw(st.lists(st.integers(0, kmax + 1), min_size=1, max_size=30))
    counter = iter(range(10**9))
    h = Harness(deal, config, accept=lambda k: accepts[next(counter) % len(accepts)])
    questions = data.draw(st.lists(st.tuples(st.integers(1, 8), st.integers(1, 20)), min_size=1, max_size=5))
    for qid, (plen, max_new) in enumerate(questions):
        h.ask(qid, f"guest{qid}", plen, max_new)  # one each: the per-device queue limit never refuses
    choices = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=64))
    steps = 0
    while h.pending():
        h.step(choices[steps % len(choices)])
        steps += 1
        assert steps < 200_000
    ended = h.ended()
    assert set(ended) == set(range(len(questions)))
    answers = h.answers()
    for qid, (plen, max_new) in enumerate(questions):
        if ended[qid] != "answered":
            assert "context" in ended[qid]  # the only refusal this room can give
            continue
        ref = [truth(plen + i) for i in range(max_new)]
        if config.eos_token is not None and config.eos_token in ref:
            ref = ref[:ref.index(config.eos_token)]
        assert answers.get(qid, []) == ref
    drafts = [x for x in h.log if isinstance(x, Draft)]
    assert all(1 <= d.k <= kmax + 1 for d in drafts)  # k + 1 only for a continuation's bonus guess
    assert all(d.k <= kmax for d in drafts if not d.assumed)
    for e in (x for x in h.log if isinstance(x, LapEnded)):
        assert 0 <= e.drafted <= kmax + 1
        if e.kind == LapKind.DECODE:
            assert e.drafted == 0
    if config.context is not None:  # no lap reaches past the cache's last position
        assert all(r.first_pos + r.tokens <= config.context for r in h.log if isinstance(r, RunStage))


def test_a_question_whose_drafts_are_always_wrong_goes_plain_and_probes():
    """Hand-made: lap costs make k=1 worth it only above 60% acceptance; every draft
    is wrong, so after the prior is outweighed the laps are plain, with one probe lap
    of 1 draft after every 3 plain laps."""
    deal = Deal(host="s0", split="pinned", stages=(Stage("s0", 0, 1), Stage("s1", 1, 2)), guests=(), fits=True,
                notes=())
    policy = DraftPolicy((0.10, 0.16), (0.9,), prior_weight=1.0, probe_every=3)
    config = SchedulerConfig(hidden=4, draft_tokens=1, draft_policy=policy)
    h = Harness(deal, config, accept=lambda k: 0)
    h.ask(0, "s0", 4, 30)
    h.run()
    kinds = [("D" if e.kind == LapKind.DECODE else "V") for e in h.log if isinstance(e, LapEnded)
             and e.kind in (LapKind.DECODE, LapKind.VERIFY)]
    # rate(1) = (1 + c) / 0.16 > 10 = rate(0) while c > 0.6: c = 0.9 / (1 + tries)
    # 1st lap c = 0.9: V; then c = 0.45: D D D, probe V, c = 0.3: D D D V ...
    assert "".join(kinds[:9]) == "VDDDVDDDV"
    assert h.answers()[0] == [truth(4 + i) for i in range(30)]
