"""What the nodes of a long-lived room keep does not grow with the questions answered:
no residual is left behind once its lap is over (on the worker too, where a prefill
chunk that does not return is sent nowhere), and a trace nobody writes is bounded.
A peer that is not the host cannot re-plan a worker.

A host and one worker as real :class:`runtime.room.Node` s over the in-process
:class:`runtime.transport.loopback.LoopbackHub`, with stages that compute nothing
(tests/servedroom.py ``StandIn``: every answer is the end-of-sequence token), so no
model is loaded. Counts, not timings."""

from __future__ import annotations

import asyncio

import pytest

from runtime import room as room_mod
from runtime.backends import StageSpec
from runtime.config import ModelConfig
from runtime.control import NodeConfig, Replan, encode_control
from runtime.room import BoundedTrace, Node
from runtime.transport.loopback import LoopbackHub
from tests.servedroom import StandIn

HIDDEN = 64
CHUNK = 16
#: a prompt of 40 ids: prefill chunks of 16, 16 and 8 positions; only the last returns
PROMPT = tuple(range(3, 43))
#: a small model's shape (only hidden, vocab and eos_id matter to a StandIn)
SHAPE = ModelConfig(n_layers=4, hidden=HIDDEN, n_heads=4, n_kv_heads=4, ffn=128, vocab=50, rope_theta=1e4,
                    rms_eps=1e-5, eos_id=2)


def _room(hub: LoopbackHub, trace_path: str = "", in_flight: int = 1) -> list[Node]:
    chain = [["host", 0, 2], ["w", 2, 4]]
    sched = dict(hidden=HIDDEN, prefill_chunk=CHUNK, eos_token=2, phones=[], context=2048,
                 questions_in_flight=in_flight)
    nodes = []
    for dev, a, b in chain:
        cfg = NodeConfig(device=dev, host="host", stages=chain, scheduler=sched, model_dir="/nonexistent", prompts=[],
                         max_new_tokens=1, peers=[d for d, _, _ in chain if d != dev], heartbeat_s=0.0,
                         trace_path=trace_path)
        nodes.append(Node(cfg, StandIn(SHAPE, StageSpec(a, b, dev == "host")), hub.transport(dev),
                          keep_open=(dev == "host")))
    return nodes


async def _answer(nodes: list[Node], questions: int) -> None:
    host = nodes[0]
    for n in nodes:
        n.start()
    try:
        for i in range(questions):
            qid = host.ask(PROMPT, 1, f"api:client-{i}")
            for _ in range(2000):  # a bound on the loop turns, not a time
                if qid in host.ended:
                    break
                await asyncio.sleep(0.001)
            assert host.ended.get(qid) == "answered", (i, host.ended.get(qid))
            host.forget(qid)
    finally:
        for n in nodes:
            await n.stop()


def test_no_residual_is_kept_after_the_answers():
    """40 answered questions of 3 prefill chunks each: the 2 chunks of every question that
    do not return are sent nowhere, and their outputs must not stay on the worker (a
    worker that kept them would hold 80 arrays here)."""
    nodes = _room(LoopbackHub())
    asyncio.run(_answer(nodes, 40))
    host, worker = nodes
    assert sum(1 for _, o in worker.trace if type(o).__name__ == "StageFinished") == 40 * 3  # every chunk ran there
    assert worker.residual == {}
    assert host.residual == {}


def test_with_questions_in_flight_every_one_is_answered_and_nothing_is_kept():
    """12 questions asked at once, 3 in flight: one question's end lets go of its own
    laps' residuals only. A host that let go of every residual whenever any question was
    answered would lose a returned residual still waiting for the head (another
    question's), and that question would never end."""
    nodes = _room(LoopbackHub(), in_flight=3)
    host, worker = nodes

    async def go():
        for n in nodes:
            n.start()
        try:
            qids = [host.ask(PROMPT, 1, f"api:client-{i}") for i in range(12)]
            for _ in range(5000):  # a bound on the loop turns, not a time
                if all(q in host.ended for q in qids):
                    break
                await asyncio.sleep(0.001)
            return {q: host.ended.get(q) for q in qids}
        finally:
            for n in nodes:
                await n.stop()
    ended = asyncio.run(go())
    assert list(ended.values()) == ["answered"] * 12
    assert host.residual == {} and worker.residual == {}


def test_a_worker_trace_nobody_writes_is_bounded(monkeypatch):
    """A worker of a served room writes no trace (``trace_path`` empty): it keeps the
    latest records only, within the records and bytes bounds of the host's trace."""
    monkeypatch.setattr(room_mod, "OPEN_TRACE_RECORDS", 300)
    monkeypatch.setattr(room_mod, "OPEN_TRACE_BYTES", 100 * room_mod.RECORD_BYTES)
    nodes = _room(LoopbackHub())
    asyncio.run(_answer(nodes, 30))
    host, worker = nodes
    assert isinstance(worker.trace, BoundedTrace)
    # per question the worker records 3 FrameArrived, 3 RunStage, 3 Computed, 3 StageFinished and
    # 1 SendFrame (at least 13 records), so 30 questions made 390 or more: only 100 (the bytes bound) stay
    assert len(worker.trace) == 100 and worker.trace.dropped >= 30 * 13 - 100
    assert worker.trace.bytes == 100 * room_mod.RECORD_BYTES  # none of its records carries token ids
    assert len(host.trace) <= 100


@pytest.mark.parametrize("keep_open", [False, True])
def test_a_trace_written_at_the_end_is_kept_whole_unless_the_room_stays_open(tmp_path, keep_open):
    cfg = NodeConfig(device="w", host="host", stages=[["host", 0, 2], ["w", 2, 4]], scheduler=dict(hidden=HIDDEN),
                     model_dir="/nonexistent", trace_path=str(tmp_path / "w.trace.jsonl"))
    node = Node(cfg, None, LoopbackHub().transport("w"), keep_open=keep_open)
    assert isinstance(node.trace, BoundedTrace) == keep_open


def test_a_worker_takes_a_re_plan_only_from_its_host():
    """A peer of the room that is not its host sends the worker a Replan naming itself
    host and cutting the host out: the worker keeps its chain and the room still answers
    through it. The same Replan's shape from the host is taken (the worker adopts it)."""
    async def go():
        hub = LoopbackHub()
        nodes = _room(hub)
        host, worker = nodes
        other = hub.transport("x")  # a device the relay seated in the room, not its host
        forged = Replan(host="x", lost="host", stages=(("x", 0, 2), ("w", 2, 4)), first_lap=7)
        for n in nodes:
            n.start()
        try:
            dealt = worker.deal
            await other.send("w", room_mod.REPLY, encode_control(forged))
            for _ in range(50):
                await asyncio.sleep(0)
            assert worker.deal is dealt and worker.chain.deal is dealt
            qid = host.ask(PROMPT, 1, "api:client")
            for _ in range(2000):  # a bound on the loop turns, not a time
                if qid in host.ended:
                    break
                await asyncio.sleep(0.001)
            assert host.ended.get(qid) == "answered"
            real = forged.model_copy(update={"host": "host", "lost": None, "stages": (("host", 0, 2), ("w", 2, 4))})
            await host.transport.send("w", room_mod.REPLY, encode_control(real))
            for _ in range(2000):
                if worker.deal is not dealt:
                    break
                await asyncio.sleep(0.001)
            assert worker.deal is not dealt and [(s.device, s.start, s.end) for s in worker.deal.stages] == \
                [("host", 0, 2), ("w", 2, 4)]
        finally:
            for n in nodes:
                await n.stop()
    asyncio.run(go())
