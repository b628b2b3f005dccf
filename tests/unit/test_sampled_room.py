"""Sampling through the real scheduler path: the shared Chain (host scheduler and worker
machines), real numpy stages of a tiny random-weight model, real frames, the ngram
drafter. Thousands of sampled answers, with and without speculation and split, follow
the model's distribution computed directly (chi-square), and a seed gives one answer
whatever the room; a judge that keeps every draft fails the same test. Numerical
faults (a NaN in a residual) fail the question, naming the device, and the room goes on.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from scipy.special import softmax

from planner.sampling import Sampling
from planner.scheduler import HostScheduler, SchedulerConfig
from runtime.backends.base import StageSpec
from runtime.backends.numpy_backend import NumpyStage
from runtime.config import ModelConfig
from tests.local_room import LocalRoom, chain_deal
from runtime.weights import EMBED, FINAL_NORM

TINY = ModelConfig(n_layers=4, hidden=16, n_heads=2, n_kv_heads=1, ffn=32, vocab=6, rope_theta=1e4, rms_eps=1e-5)
PROMPT = (1, 4, 2, 4, 1)
TEMP = 1.5


def tiny_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights of :data:`TINY` (tied head), scaled so next-token
    distributions are neither flat nor one-hot."""
    rng = np.random.default_rng(seed)
    h, f = TINY.hidden, TINY.ffn
    kv = TINY.n_kv_heads * h // TINY.n_heads
    w = {EMBED: rng.standard_normal((TINY.vocab, h)) * 0.6, FINAL_NORM: np.ones(h)}
    for i in range(TINY.n_layers):
        p = f"model.layers.{i}."
        for n, shape in [("input_layernorm.weight", (h,)), ("post_attention_layernorm.weight", (h,)),
                         ("self_attn.q_proj.weight", (h, h)), ("self_attn.k_proj.weight", (kv, h)),
                         ("self_attn.v_proj.weight", (kv, h)), ("self_attn.o_proj.weight", (h, h)),
                         ("mlp.gate_proj.weight", (f, h)), ("mlp.up_proj.weight", (f, h)),
                         ("mlp.down_proj.weight", (h, f))]:
            w[p + n] = np.ones(shape) if n.endswith("norm.weight") else rng.standard_normal(shape) * 0.3
    return {k: v.astype(np.float32) for k, v in w.items()}


W = tiny_weights()


def make_room(cuts=(), draft_tokens: int = 0, async_laps: int = 1, sampling: Sampling | None = None) -> LocalRoom:
    bounds = (0, *cuts, TINY.n_layers)
    names = ["host"] + [f"w{i}" for i in range(1, len(bounds) - 1)]
    ranges = [(n, a, b) for n, a, b in zip(names, bounds, bounds[1:])]
    stages = {n: NumpyStage(TINY, StageSpec(a, b, host=(n == "host")), dict(W), max_ctx=64) for n, a, b in ranges}
    cfg = SchedulerConfig(hidden=TINY.hidden, draft_tokens=draft_tokens, async_laps=async_laps, eos_token=None,
                          sampling=sampling or Sampling())
    return LocalRoom(stages, chain_deal("host", ranges), cfg)


def next_probs(whole: NumpyStage, ids) -> np.ndarray:
    """The tiny model's next-token distribution at temperature TEMP, computed directly
    (one stage, no scheduler, scipy's softmax)."""
    whole.rollback(0)
    logits = whole.head(whole.forward(whole.embed(list(ids)), 0)[-1:])[0].astype(np.float64)
    return softmax(logits / TEMP)


@pytest.fixture(scope="module")
def exact() -> tuple[np.ndarray, np.ndarray]:
    """P(t0, t1) [V, V] and P(t2) [V] of a 3-token answer to PROMPT."""
    whole = NumpyStage(TINY, StageSpec(0, TINY.n_layers, host=True), dict(W), max_ctx=64)
    v = TINY.vocab
    p0 = next_probs(whole, PROMPT)
    joint = np.zeros((v, v))
    p2 = np.zeros(v)
    for a in range(v):
        p1 = next_probs(whole, PROMPT + (a,))
        joint[a] = p0[a] * p1
        for b in range(v):
            p2 += joint[a, b] * next_probs(whole, PROMPT + (a, b))
    return joint, p2


N = 2000


def answers(room: LocalRoom, n: int = N, first_seed: int = 0) -> np.ndarray:
    """``n`` sampled 3-token answers to PROMPT, question i seeded ``first_seed + i``."""
    for i in range(n):  # one at a time: the scheduler's queue holds 10
        room.ask(i, PROMPT, 3, sampling=Sampling(temperature=TEMP, seed=first_seed + i))
        room.run()
    return np.array([room.answers[i] for i in range(n)])


def fit(counts: np.ndarray, expect_p: np.ndarray) -> float:
    """Chi-square goodness-of-fit p-value; cells expected below 5 are pooled."""
    e = expect_p.ravel() * counts.sum()
    c = counts.ravel()
    small = e < 5
    if small.any():
        e = np.append(e[~small], e[small].sum())
        c = np.append(c[~small], c[small].sum())
    return stats.chisquare(c, f_exp=e * c.sum() / e.sum()).pvalue


def pair_counts(a: np.ndarray) -> np.ndarray:
    return np.bincount(a[:, 0] * TINY.vocab + a[:, 1], minlength=TINY.vocab ** 2).reshape(TINY.vocab, TINY.vocab)


@pytest.mark.slow
def test_sampled_answers_follow_the_model_with_and_without_speculation(exact, monkeypatch):
    joint, p2 = exact
    assert joint.max() < 0.5 and (joint > 0.01).sum() >= 10  # a distribution worth testing
    plain = answers(make_room())
    spec = answers(make_room(cuts=(2,), draft_tokens=3))
    for a in (plain, spec):
        assert fit(pair_counts(a), joint) > 0.01
        assert fit(np.bincount(a[:, 2], minlength=TINY.vocab), p2) > 0.01
    # one seed, one answer: speculation and the split change nothing
    assert (plain == spec).all()
    spec_room = make_room(cuts=(2,), draft_tokens=3)
    answers(spec_room, 50)
    drafted = sum(1 for _, o in spec_room.trace if type(o).__name__ == "LapEnded" and o.drafted)
    assert drafted > 0  # verify laps ran

    # a judge that keeps every draft: the same test rejects it
    judge = HostScheduler._judge

    def keep_all(self, q, lap):
        lap.predictions = tuple(lap.inputs[1:]) + tuple(lap.predictions[len(lap.inputs) - 1:])
        return judge(self, q, lap)
    monkeypatch.setattr(HostScheduler, "_judge", keep_all)
    wrong = answers(make_room(cuts=(2,), draft_tokens=3), 600)
    assert min(fit(pair_counts(wrong), joint), fit(np.bincount(wrong[:, 2], minlength=TINY.vocab), p2)) < 1e-6


@pytest.mark.parametrize("cuts,k,laps", [((), 0, 1), ((2,), 0, 1), ((1, 3), 2, 1), ((2,), 4, 3), ((1, 2), 3, 2)])
def test_one_seed_one_answer_whatever_the_room(cuts, k, laps):
    prompt = (3, 1, 4, 1, 5, 1, 4)
    want = []
    ref = make_room()
    for s in range(8):
        ref.ask(s, prompt, 12, sampling=Sampling(temperature=1.0, top_p=0.9, top_k=4, seed=1000 + s))
    want = ref.run()
    room = make_room(cuts, k, laps)
    for s in range(8):
        room.ask(s, prompt, 12, sampling=Sampling(temperature=1.0, top_p=0.9, top_k=4, seed=1000 + s))
    assert room.run() == want
    assert len({tuple(a) for a in want.values()}) > 1  # different seeds, different answers


def test_greedy_room_is_argmax_decoding():
    """Temperature 0 (the default): each token is the argmax of the model's logits."""
    whole = NumpyStage(TINY, StageSpec(0, TINY.n_layers, host=True), dict(W), max_ctx=64)
    ids = list(PROMPT)
    for _ in range(6):
        ids.append(int(np.argmax(next_probs(whole, ids))))
    room = make_room((2,), 3)
    room.ask(0, PROMPT, 6)
    assert room.run()[0] == ids[len(PROMPT):]


def test_nan_in_a_worker_frame_fails_that_question_naming_the_device_and_the_room_goes_on():
    room = make_room(cuts=(1, 3), draft_tokens=2)
    st = room.stages["w1"]
    forward = st.forward
    calls = []

    def poisoned(x, first_pos):
        out = forward(x, first_pos)
        calls.append(first_pos)
        if len(calls) == 3:  # the third frame w1 computes (an answer lap of question 0)
            out = out.copy()
            out[-1, 5] = np.nan
        return out
    st.forward = poisoned
    room.ask(0, PROMPT, 8)
    room.ask(1, PROMPT, 8)
    out = room.run()
    assert room.ended[0].startswith("refused: numerical fault on w1: ")
    assert "NaN/inf" in room.ended[0]
    assert 0 not in out[0]  # no token 0 slipped in
    ref = make_room()
    ref.ask(1, PROMPT, 8)
    assert out[1] == ref.run()[1] and room.ended[1] == "length"


def test_nan_arriving_in_a_frame_names_its_sender(monkeypatch):
    """A frame whose payload holds an inf (corrupted after its sender's check) fails
    the question, naming the sender; the next question is answered."""
    import tests.local_room as lr
    room = make_room(cuts=(2,))
    decode = lr.decode_frame
    n = []

    def corrupt(data):
        h, x = decode(data)
        n.append(1)
        if len(n) == 2 and x is not None:
            x = x.copy()
            x[0, 0] = np.inf
        return h, x
    monkeypatch.setattr(lr, "decode_frame", corrupt)
    room.ask(0, PROMPT, 4)
    room.ask(1, PROMPT, 4)
    room.run()
    assert room.ended[0].startswith("refused: numerical fault on ")
    assert room.ended[1] == "length" and len(room.answers[1]) == 4


def test_device_processes_a_nan_frame_fails_the_question_naming_its_sender_and_sampling_goes_on():
    """Room nodes (runtime/room.py, one per device, frames as bytes through an in-process
    hub): one NaN put into the first answer frame the host sends w1 is caught by w1 on
    arrival; w1 tells the host (a Fault control message); the host refuses that question
    naming itself as the sender, and answers the next, sampled, equal to the local room's
    answer for the same seed."""
    import asyncio
    import struct

    from runtime.room import Node, NodeConfig

    chain = [["host", 0, 2], ["w1", 2, 4]]
    handlers, poisoned = {}, []

    def transport(device):
        class T:
            def set_handler(self, fn):
                handlers[device] = fn

            async def send(self, dst, channel, data):
                data = bytes(data)
                kind, first = data[5], struct.unpack_from("<I", data, 16)[0]
                if channel == "residual" and device == "host" and kind == 2 and first >= len(PROMPT) \
                        and not poisoned:  # the first decode/verify frame of question 0
                    poisoned.append(1)
                    data = data[:32] + struct.pack("<f", float("nan")) + data[36:]
                asyncio.get_running_loop().call_soon(handlers[dst], device, channel, data)
        return T()

    smp = Sampling(temperature=TEMP, top_k=5, seed=99)
    nodes = []
    for n, a, b in chain:
        cfg = NodeConfig(device=n, host="host", stages=chain, model_dir="/unused", heartbeat_s=0,
                         scheduler={"hidden": TINY.hidden, "eos_token": None, "draft_tokens": 2},
                         peers=[m for m, _, _ in chain if m != n])
        st = NumpyStage(TINY, StageSpec(a, b, host=(n == "host")), dict(W), max_ctx=64)
        nodes.append(Node(cfg, st, transport(n), keep_open=True))
    host, w1 = nodes

    async def go():
        for node in nodes:
            node.start()
        q0 = host.ask(PROMPT, 6, "asker")
        q1 = host.ask(PROMPT, 6, "asker", sampling=smp)
        for _ in range(2000):
            if q1 in host.ended:
                break
            await asyncio.sleep(0.005)
        for node in nodes:
            await node.stop()
        return q0, q1
    q0, q1 = asyncio.run(go())
    assert poisoned and w1.rejected_frames == 1
    assert host.ended[q0].startswith("refused: numerical fault on host: the residual it sent for lap ")
    assert host.ended[q1] == "answered"
    ref = make_room()
    ref.ask(0, PROMPT, 6, sampling=smp)
    assert host.answers[q1] == ref.run()[0]


def test_run_real_takes_the_scenarios_sampling_seeded_by_the_scenario(tmp_path):
    """``run --real``: every device's scheduler settings carry decoding.sampling; without
    a seed of its own the scenario's ``seed`` is used."""
    from planner.deal import deal
    from runtime.weights import ensure_safetensors
    from splitroom.real_configs import node_configs
    from splitroom.scenario import load
    md = str(ensure_safetensors())
    scn = load("scenarios/home.yaml", ["decoding.sampling={temperature: 0.7, top_p: 0.9}", "seed=77"])
    cfgs = node_configs(scn, deal(scn.devices, scn.model, scn.options), md, tmp_path, "numpy")
    for c in cfgs:
        assert c.scheduler_config().sampling == Sampling(0.7, 0.9, 0, 77)
    scn = load("scenarios/home.yaml", ["decoding.sampling.seed=5"])
    assert node_configs(scn, deal(scn.devices, scn.model, scn.options), md, tmp_path,
                        "numpy")[0].scheduler_config().sampling == Sampling(0.0, 1.0, 0, 5)


def test_single_process_generation_raises_on_a_nan_instead_of_answering_token_0():
    from runtime.generate import generate_greedy, generate_sampled
    from runtime.work import NumericalFault
    for sampled in (False, True):
        host = NumpyStage(TINY, StageSpec(0, 2, host=True), dict(W), max_ctx=64)
        worker = NumpyStage(TINY, StageSpec(2, 4), dict(W), max_ctx=64)
        forward, calls = worker.forward, []

        def bad(x, pos, forward=forward, calls=calls):
            calls.append(pos)
            return forward(x, pos) * (np.nan if len(calls) == 3 else 1.0)  # the second decode lap
        worker.forward = bad
        with pytest.raises(NumericalFault, match="NaN/inf"):
            if sampled:
                generate_sampled([host, worker], PROMPT, Sampling(1.0, seed=1), 8, stop_ids=frozenset())
            else:
                generate_greedy([host, worker], PROMPT, 8, stop_ids=frozenset())
        assert len(calls) == 3


def test_a_sampled_answer_survives_a_lost_worker_token_for_token():
    """A worker lost mid-answer: its layers are re-dealt, the answer so far replayed, and
    the sampled answer is the one the seed gives without the loss (pair j decides token
    j whatever lap, replay or not, it lands in)."""
    from planner.chain import merge_lost
    smp = Sampling(temperature=1.2, top_p=0.95, seed=2024)
    ref = make_room()
    ref.ask(0, PROMPT, 16, sampling=smp)
    want = ref.run()[0]

    def load(device, a, b, is_host):
        return NumpyStage(TINY, StageSpec(a, b, host=is_host), dict(W), max_ctx=64)
    bounds = ((0, 1), (1, 3), (3, 4))
    ranges = [(n, a, b) for n, (a, b) in zip(("host", "w1", "w2"), bounds)]
    room = LocalRoom({n: load(n, a, b, n == "host") for n, a, b in ranges}, chain_deal("host", ranges),
                     SchedulerConfig(hidden=TINY.hidden, draft_tokens=3, eos_token=None),
                     redeal=merge_lost, make_stage=load)
    room.lose_after("w1", 6)
    room.ask(0, PROMPT, 16, sampling=smp)
    assert room.run()[0] == want and room.redeals and room.ended[0] == "length"
