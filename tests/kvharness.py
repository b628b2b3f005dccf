"""The zero-time harness with KV caches that hold what they were given, for tests of
several questions in flight.

:class:`tests.harness.Harness` answers every question with the same token at each
position, so an answer computed over another question's cache would look right. Here
every device keeps each of its KV cache slots as the list of token ids it holds, a lap's
residual is the prefix its stage saw, and the target model's next token is a hash of
the whole prefix (:func:`model_next`): a stage that runs a lap over the wrong slot, a
position that was not rolled back, or a frame that skips a stage changes the tokens.

Commands are carried out as they are issued (each device's FIFO channel then delivers
their completions in that order):

* ``RunStage(device, lap, q, first_pos, n, inputs, slot)``: the slot's cache must hold at
  least ``first_pos`` positions (else the lap is corrupt, as a real stage raises); it is
  cut to ``first_pos`` and the lap's tokens appended. The residual it sends on is the
  cache's prefix through the lap's last position, or CORRUPT when the residual that came
  in (the previous stage's, for this lap) is not that same prefix.
* ``RollbackKV``: cuts the slot's cache. ``Redeal``: every cache of the new chain empty.
* ``RunHead``: row r's token is :func:`model_next` of the residual's prefix through its
  position; greedy, or under sampling :func:`sampled_next` with the row's uniform pair.
* ``Draft``: the first ``accept(k)`` drafts are what the question's answer alone would
  continue with (:func:`alone`), the rest are wrong.
"""

from __future__ import annotations

from typing import Sequence

from planner.protocol import Draft, DraftReady, EmitToken, HeadFinished, Redeal, RollbackKV, RunHead, RunStage
from planner.sampling import Sampling, Uniforms
from tests.harness import Harness

CORRUPT = ("corrupt",)
_P = (1 << 61) - 1


def _hash(prefix: Sequence[int]) -> int:
    h = 7
    for t in prefix:
        h = (h * 1_000_003 + (t if isinstance(t, int) else len(str(t)) * 7919) + 1) % _P
    return h


def model_next(prefix: Sequence[int]) -> int:
    """The target model's greedy next token after ``prefix`` (100..1096: never the tests' eos 2)."""
    return 100 + _hash(prefix) % 997


def sampled_next(prefix: Sequence[int], pair: tuple[float, float]) -> int:
    """The token a sampled head draws after ``prefix`` with uniform pair ``(u, v)``: one
    of four candidates by ``v`` (a deterministic function of prefix and pair)."""
    return 100 + (_hash(prefix) + int(pair[1] * 4) * 131) % 997


def alone(prompt: Sequence[int], n: int, sampling: Sampling | None = None, seed: int | None = None,
          stop: frozenset[int] = frozenset()) -> list[int]:
    """The answer of ``prompt`` alone: ``n`` tokens of the model (greedy, or sampled with
    the question's uniform stream, pair j for answer token j), cut before a stop token."""
    seq, out = list(prompt), []
    uni = Uniforms(seed) if sampling is not None and not sampling.greedy else None
    for j in range(n):
        t = model_next(seq) if uni is None else sampled_next(seq, uni.pairs(j, 1)[0])
        if t in stop:
            break
        out.append(t)
        seq.append(t)
    return out


class KVHarness(Harness):
    """:class:`Harness` whose devices keep real (token-id) KV caches per slot; see the
    module doc. ``kv[(device, slot)]`` is a cache; ``corrupt_laps`` the laps a stage ran
    over a cache that did not match the residual it got (none in a correct room)."""

    def __init__(self, deal, config, accept=lambda k: 0, redeal=None):
        super().__init__(deal, config, accept=accept, redeal=redeal)
        self.kv: dict[tuple[str, int], list[int]] = {}
        self.out: dict[tuple[int, str], tuple] = {}  # (lap, device) -> residual sent on
        self.lap_tokens: dict[int, tuple[int, ...]] = {}
        self.lap_first: dict[int, int] = {}
        self.seqs: dict[int, list[int]] = {}  # question -> prompt + answer so far
        self.corrupt_laps: set[int] = set()
        self.last_out: dict[int, tuple] = {}  # lap -> the residual its last stage sent on

    def ask_prompt(self, qid: int, device: str, prompt: Sequence[int], max_new: int,
                   sampling: Sampling | None = None) -> None:
        """Queue a question with its own prompt (and decoding) on the outside channel."""
        from collections import deque

        from planner.protocol import QuestionAsked
        self.seqs[qid] = list(prompt)
        self.channels.setdefault(("ask",), deque()).append(QuestionAsked(qid, device, tuple(prompt), max_new, sampling))

    def _prev(self, device: str) -> str:
        w = self.chain.workers.get(device)
        return w.prev if w is not None else self.host.host

    # -- the executor (planner.drive.Executor), carrying each command out as it is issued

    def run_stage(self, c: RunStage) -> None:
        host = self.host.host
        if c.inputs or c.device == host:
            self.lap_tokens[c.lap_id] = tuple(c.inputs)
            self.lap_first[c.lap_id] = c.first_pos
        cache = self.kv.setdefault((c.device, c.slot), [])
        toks = self.lap_tokens.get(c.lap_id, ())
        if len(cache) < c.first_pos or len(toks) != c.tokens:
            self.corrupt_laps.add(c.lap_id)
            res = CORRUPT
        else:
            del cache[c.first_pos:]
            cache.extend(toks)
            res = tuple(cache)
            if c.device != host and self.out.get((c.lap_id, self._prev(c.device))) != res:
                self.corrupt_laps.add(c.lap_id)
                res = CORRUPT
        self.out[(c.lap_id, c.device)] = res
        self.last_out[c.lap_id] = res
        super().run_stage(c)

    def rollback(self, c: RollbackKV) -> None:
        del self.kv.setdefault((c.device, c.slot), [])[c.to_pos:]

    def redeal(self, c: Redeal) -> None:
        chain = {d for d, _, _ in c.stages} | {c.host}
        for key in [k for k in self.kv if k[0] in chain]:  # every device of the new chain starts empty
            del self.kv[key]
        super().redeal(c)

    def run_head(self, c: RunHead) -> None:
        res = self.last_out.get(c.lap_id, CORRUPT)
        first, n = self.lap_first[c.lap_id], len(self.lap_tokens[c.lap_id])
        preds = []
        for r in range(c.rows):
            p = first + n - c.rows + r  # the row's position: it predicts p + 1
            if res is CORRUPT or len(res) < p + 1:
                preds.append(model_next(("corrupt", c.lap_id, p)))
            elif c.sampling is None or c.sampling.greedy:
                preds.append(model_next(res[:p + 1]))
            else:
                preds.append(sampled_next(res[:p + 1], c.uniforms[r]))
        self._put(("dev", self.host.host), HeadFinished(c.lap_id, tuple(preds)))

    def draft(self, c: Draft) -> None:
        seq = self.seqs[c.question_id][:c.base_len] + list(c.assumed)
        a = min(max(self.accept(c.k), 0), c.k)
        right = []
        for _ in range(c.k):
            t = model_next(seq)
            right.append(t)
            seq.append(t)
        self._put(("dev", self.host.host), DraftReady(c.draft_id, tuple(t if i < a else t + 1
                                                                        for i, t in enumerate(right))))

    def emit(self, c: EmitToken) -> None:
        self.seqs[c.question_id].append(c.token)
