"""planner.sampling: the warpers against transformers', the inverse CDF by hand, the
seeded stream, and the speculative sampling rule (Leviathan et al. 2023 / Chen et al.
2023) against the target distribution by a chi-square test over many draws, which a
wrong rule fails."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from planner.sampling import (GREEDY, Sampling, Uniforms, head_tokens, inverse_cdf, probabilities,
                              verify_row)


def _hf_probs(logits: np.ndarray, t: float, top_k: int, top_p: float) -> np.ndarray:
    """transformers' own warpers, in generate()'s order, then softmax."""
    import torch
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    x = torch.tensor(logits, dtype=torch.float64)
    x = TemperatureLogitsWarper(t)(None, x)
    if top_k:
        x = TopKLogitsWarper(top_k)(None, x)
    if top_p < 1:
        x = TopPLogitsWarper(top_p)(None, x)
    return torch.softmax(x, dim=-1).numpy()


@pytest.mark.parametrize("t,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (0.8, 0, 0.9),
                                           (0.6, 20, 0.5), (2.0, 3, 0.99), (1.0, 0, 0.05)])
@pytest.mark.parametrize("vocab", [50, 3000])
def test_probabilities_match_transformers_warpers(t, top_k, top_p, vocab):
    """Small vocabularies sort every token; large ones only the likeliest candidates."""
    logits = np.random.default_rng(3).standard_normal((4, vocab)) * (3 if vocab < 100 else 6)
    ours = probabilities(logits, Sampling(temperature=t, top_k=top_k, top_p=top_p))
    np.testing.assert_allclose(ours, _hf_probs(logits, t, top_k, top_p), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ours.sum(axis=1), 1.0)


def test_top_k_keeps_ties_with_the_kth_and_top_p_keeps_the_best():
    p = probabilities(np.array([3.0, 1.0, 3.0, 2.0, 2.0]), Sampling(temperature=1.0, top_k=2))
    assert p[1] == 0 and p[3] == 0 and p[4] == 0 and p[0] == p[2] == 0.5
    p = probabilities(np.array([5.0, 0.0, 0.0]), Sampling(temperature=1.0, top_p=0.01))
    assert p.tolist() == [1.0, 0.0, 0.0]


def test_inverse_cdf_by_hand():
    p = np.array([0.2, 0.0, 0.5, 0.3])  # intervals [0, .2) [.2, .7) [.7, 1)
    assert [inverse_cdf(p, v) for v in (0.0, 0.19, 0.2, 0.69, 0.7, 0.999999)] == [0, 0, 2, 2, 3, 3]
    assert inverse_cdf(np.array([0.0, 2.0, 0.0]), 0.9999999) == 1  # unnormalised; never a zero token
    assert inverse_cdf(np.array([0.5, 0.5, 0.0]), 1.0 - 1e-17) == 1


def test_greedy_is_argmax_lowest_id_on_ties():
    logits = np.array([[1.0, 3.0, 3.0], [0.0, -1.0, 0.0]], np.float32)
    assert head_tokens(logits, None) == head_tokens(logits, GREEDY) == (1, 0)
    with pytest.raises(ValueError):
        probabilities(logits, GREEDY)


@pytest.mark.parametrize("kw", [{"temperature": -0.1}, {"temperature": float("nan")}, {"temperature": True},
                                {"top_p": 0}, {"top_p": 1.5}, {"top_k": -1}, {"top_k": 2.5}, {"seed": -1},
                                {"seed": 2**64}, {"seed": "7"}])
def test_sampling_settings_out_of_range_raise(kw):
    with pytest.raises(ValueError):
        Sampling(**kw)


def test_uniform_pairs_are_the_seeded_stream_in_answer_order_whatever_the_asking_order():
    expect = np.random.Generator(np.random.PCG64(12345)).random((200, 2))
    u = Uniforms(12345)
    got = dict(enumerate(u.pairs(130, 70)))
    got = {i + 130: v for i, v in got.items()} | {i + 3: v for i, v in enumerate(u.pairs(3, 10))}
    got |= dict(enumerate(u.pairs(0, 3)))
    for i, pair in got.items():
        assert pair == tuple(expect[i])
    assert Uniforms(1).pairs(0, 4) != Uniforms(2).pairs(0, 4)


# --------------------------------------------------------------------- the rule, by draws

V = 6
P = np.array([0.30, 0.05, 0.25, 0.10, 0.20, 0.10])  # the target
Q = np.array([0.05, 0.40, 0.10, 0.25, 0.10, 0.10])  # a drafter far from it
N = 20_000


def _draw_speculative(rule, n: int, seed: int) -> np.ndarray:
    """``n`` tokens: a draft from Q, then ``rule(p, pair, draft, q)`` keeps it or not."""
    rng = np.random.default_rng(seed)
    drafts = rng.choice(V, size=n, p=Q)
    pairs = rng.random((n, 2))
    return np.array([rule(P, tuple(pairs[i]), int(drafts[i]), Q) for i in range(n)])


def _always_accept(p, pair, draft, q):
    return draft


def _resample_from_p(p, pair, draft, q):
    """A tempting mistake: on rejection, draw from p instead of the residual."""
    u, v = pair
    return draft if u < min(1.0, p[draft] / q[draft]) else inverse_cdf(p, v)


def _fit(tokens: np.ndarray, p: np.ndarray = P) -> float:
    counts = np.bincount(tokens, minlength=len(p))
    return stats.chisquare(counts, f_exp=p * len(tokens)).pvalue


def test_speculative_rule_keeps_the_target_distribution_and_wrong_rules_are_caught():
    ok = _draw_speculative(verify_row, N, 1)
    plain = np.array([inverse_cdf(P, v) for v in np.random.default_rng(2).random(N)])
    assert _fit(ok) > 0.01 and _fit(plain) > 0.01
    # homogeneity: speculative and plain draws are one distribution
    table = np.stack([np.bincount(ok, minlength=V), np.bincount(plain, minlength=V)])
    assert stats.chi2_contingency(table).pvalue > 0.01
    # the same test rejects rules that do not keep the distribution
    for wrong in (_always_accept, _resample_from_p):
        bad = _draw_speculative(wrong, N, 1)
        assert _fit(bad) < 1e-6, wrong.__name__
        table = np.stack([np.bincount(bad, minlength=V), np.bincount(plain, minlength=V)])
        assert stats.chi2_contingency(table).pvalue < 1e-6, wrong.__name__


def test_acceptance_rate_is_one_minus_total_variation():
    """Leviathan et al. 2023, section 3.1: a draft is kept with probability
    sum(min(p, q)) = 1 - TV(p, q)."""
    rng = np.random.default_rng(5)
    drafts = rng.choice(V, size=N, p=Q)
    pairs = rng.random((N, 2))
    kept = np.mean([verify_row(P, tuple(pairs[i]), int(drafts[i]), Q) == drafts[i] for i in range(N)])
    beta = np.minimum(P, Q).sum()
    assert abs(kept - beta) < 4 * np.sqrt(beta * (1 - beta) / N)


def test_rejection_never_gives_the_draft_back():
    """norm(max(0, p - q)) is 0 at a rejected draft (p(x) < q(x) there)."""
    rng = np.random.default_rng(6)
    for _ in range(2000):
        d = int(rng.choice(V, p=Q))
        u, v = rng.random(2)
        t = verify_row(P, (u, v), d, Q)
        if u >= min(1.0, P[d] / Q[d]):
            assert t != d


def test_deterministic_drafter_is_draw_and_compare():
    """q one-hot at x: kept with probability p(x); rejected tokens follow p without x."""
    x = 2
    onehot = np.eye(V)[x]
    rng = np.random.default_rng(7)
    pairs = rng.random((N, 2))
    general = np.array([verify_row(P, tuple(pr), x, onehot) for pr in pairs])
    compact = np.array([verify_row(P, tuple(pr), x, None) for pr in pairs])
    for toks in (general, compact):
        assert _fit(toks) > 0.01
    # the compact form ignores the draft: the token is the draw from p with v
    assert all(compact[i] == inverse_cdf(P, pairs[i][1]) for i in range(100))


def test_trace_records_keep_sampling_uniforms_and_lap_failures():
    import json

    from planner.protocol import LapFailed, QuestionAsked, RunHead
    from planner.trace import TraceError, from_record, to_record
    objs = [QuestionAsked(3, "api:x", (1, 2), 5, Sampling(0.7, 0.9, 40, 2**64 - 1)), QuestionAsked(4, "h", (1,), 2),
            RunHead(9, 3, 2, Sampling(0.7, seed=1), ((0.25, 0.5), (0.125, 0.75))),
            LapFailed(9, "w1", "the residual it sent for lap 9 has 1 NaN/inf value")]
    for o in objs:
        rec = json.loads(json.dumps(to_record(1.5, o)))
        assert from_record(rec) == (1.5, o)
    rec = to_record(0.0, objs[0])
    rec["sampling"]["temperature"] = -1
    with pytest.raises(TraceError):
        from_record(rec)


def test_float32_logits_give_the_float64_distribution_to_float32_precision():
    logits = (np.random.default_rng(9).standard_normal((3, 5000)) * 6).astype(np.float32)
    for s in (Sampling(0.7), Sampling(1.1, top_k=50), Sampling(0.9, top_p=0.8)):
        p32 = probabilities(logits, s)
        assert p32.dtype == np.float64
        np.testing.assert_allclose(p32, probabilities(logits.astype(np.float64), s), rtol=2e-6, atol=1e-12)


# Worked by hand: two rows of three tokens whose probabilities are exact binary fractions
# (logits ln 1, ln 3, ln 4: p = 1/8, 3/8, 4/8; and the reverse, p = 4/8, 3/8, 1/8), at
# temperature 1. Cumulative: row 0 [.125, .5, 1], row 1 [.5, .875, 1].
_ROWS = np.log(np.array([[1.0, 3.0, 4.0], [4.0, 3.0, 1.0]]))
_T1 = Sampling(temperature=1.0)


def test_head_tokens_by_hand_without_a_drafter():
    # row 0, v = .2: first cumulative above .2 is .5 (token 1); row 1, v = .9: 1 (token 2)
    assert head_tokens(_ROWS, _T1, ((0.5, 0.2), (0.5, 0.9))) == (1, 2)


def test_head_tokens_by_hand_with_a_drafter_kept_and_rejected():
    q = np.array([[0.2, 0.2, 0.6]])  # the drafter's row for the draft after row 0
    # draft 2 after row 0: keep when u < min(1, p/q) = (4/8) / 0.6 = 0.8333; u = 0.5 keeps it.
    # Row 1 has no draft (drafts has one entry): v = .9 draws token 2.
    assert head_tokens(_ROWS, _T1, ((0.5, 0.2), (0.5, 0.9)), drafts=(2,), q=q) == (2, 2)
    # the same with u = 0.9 > 0.8333: rejected, drawn from max(p - q, 0) = [0, 0.175, 0]: token 1
    assert head_tokens(_ROWS, _T1, ((0.9, 0.2), (0.5, 0.9)), drafts=(2,), q=q) == (1, 2)
    # a one-hot drafter at token 2: keep when u < 0.5; u = 0.7 rejects, the residual is
    # [1/8, 3/8, 0] (sum 1/2) and v = .2 falls in token 0's interval [0, .25) of it
    one_hot = np.array([[0.0, 0.0, 1.0]])
    assert head_tokens(_ROWS, _T1, ((0.7, 0.2), (0.7, 0.9)), drafts=(2,), q=one_hot) == (0, 2)


def test_head_tokens_wants_a_pair_for_every_row():
    with pytest.raises(ValueError) as e:
        head_tokens(_ROWS, _T1, ((0.5, 0.2),))
    assert str(e.value) == "2 rows need as many uniform pairs, got 1"


def test_verify_row_edges_by_hand():
    p = np.array([0.25, 0.25, 0.5])
    # u equal to p/q (0.25 / 0.5) is not below it: rejected, drawn from the residual [0, 0, 0.25]
    assert verify_row(p, (0.5, 0.0), draft=0, q=np.array([0.5, 0.25, 0.25])) == 2
    # a draft the drafter gave probability 0: p/q is unbounded, so it is kept whatever u is
    assert verify_row(p, (0.99, 0.0), draft=1, q=np.array([0.5, 0.0, 0.5])) == 1
    # a drafter at least as likely as the target everywhere leaves no residual: drawn from p,
    # v = .6 falls in token 2's interval [.5, 1)
    assert verify_row(p, (0.9, 0.6), draft=0, q=np.array([0.5, 0.25, 0.5])) == 2


def test_inverse_cdf_at_the_top_end_takes_the_last_possible_token():
    # v * sum reaching the sum (1 - 1e-17 is 1.0 in float64): the last token of probability > 0
    assert inverse_cdf(np.array([0.2, 0.3, 0.5, 0.0]), 1.0 - 1e-17) == 2


def test_probabilities_by_hand_top_k_1_shift_per_row_and_greedy_message():
    # top_k = 1 keeps the argmax alone
    assert probabilities(np.array([0.0, 1.0, 2.0]), Sampling(temperature=1.0, top_k=1)).tolist() == [0.0, 0.0, 1.0]
    # each row is shifted by its own maximum: rows 1000 apart both give [1, e^-1] / (1 + e^-1)
    a = 1.0 / (1.0 + np.exp(-1.0))
    got = probabilities(np.array([[0.0, -1.0], [1000.0, 999.0]]), _T1)
    np.testing.assert_allclose(got, [[a, 1 - a], [a, 1 - a]], rtol=1e-14)
    with pytest.raises(ValueError) as e:
        probabilities(_ROWS, GREEDY)
    assert str(e.value) == "greedy decoding has no sampling distribution; take the argmax"


def test_float16_logits_are_computed_in_float64():
    # logits [0, 1] at temperature 0.5: [1, e^2] / (1 + e^2); float16 arithmetic would be ~1e-4 off
    b = np.exp(2.0) / (1.0 + np.exp(2.0))
    got = probabilities(np.array([0.0, 1.0], np.float16), Sampling(temperature=0.5))
    np.testing.assert_allclose(got, [1 - b, b], rtol=1e-14)


def test_top_p_drops_a_token_whose_ascending_mass_equals_one_minus_top_p():
    # four equal logits: p = 1/4 each (exact); ascending cumulative [.25, .5, .75, 1] and
    # 1 - top_p = .5, so two tokens go (<=, as transformers' TopPLogitsWarper) and two stay at 1/2
    p = probabilities(np.zeros(4), Sampling(temperature=1.0, top_p=0.5))
    assert sorted(p.tolist()) == [0.0, 0.0, 0.5, 0.5]


def test_uniform_pairs_edges():
    u = Uniforms(5)
    assert u.pairs(3, 0) == ()
    for first, n in ((-1, 1), (0, -1)):
        with pytest.raises(ValueError) as e:
            u.pairs(first, n)
        assert str(e.value) == f"answer-token indices start at 0, got {first} (+{n})"


def test_with_seed_keeps_every_other_setting():
    s = Sampling(temperature=0.7, top_p=0.9, top_k=5, seed=1)
    assert s.with_seed(42) == Sampling(temperature=0.7, top_p=0.9, top_k=5, seed=42)
