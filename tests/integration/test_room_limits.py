"""A device's compute loop never dies on one bad question or frame (issue 11).

Real stages (numpy) with a small KV cache, over the in-process hub of
test_room_nodes: a question longer than the cache is refused by the host with its
lengths and the next is answered with the single-process greedy tokens; a worker drops
a well-formed prefill frame longer than its cache and a command its stage cannot run,
and then serves the room as before."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from planner.frames import FrameHeader, FrameKind
from planner.protocol import RunStage
from runtime.backends import StageSpec, make_stage
from runtime.codec import encode_frame
from runtime.generate import generate_greedy
from runtime.room import Node, NodeConfig
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors
from tests.integration.test_room_nodes import Hub

pytestmark = pytest.mark.slow

SHORT = "Hi"
LONG = "Tell me everything about " + "the history of every city in Europe, " * 12
MAX_NEW = 6
CHAIN = [["host", 0, 15], ["w1", 15, 30]]


@pytest.fixture(scope="module")
def model_dir():
    return ensure_safetensors()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return ChatTokenizer.from_dir(model_dir)


def build(model_dir, tokenizer, prompts, max_ctx):
    sc = dict(hidden=576, prefill_chunk=16, eos_token=2, phones=[])  # no context: the stages' cache decides
    hub = Hub()
    nodes = []
    for n, a, b in CHAIN:
        cfg = NodeConfig(device=n, host="host", stages=CHAIN, scheduler=sc, model_dir=str(model_dir),
                         prompts=prompts if n == "host" else [], max_new_tokens=MAX_NEW,
                         peers=[m for m, _, _ in CHAIN if m != n])
        stage = make_stage("numpy", model_dir, StageSpec(a, b, host=(n == "host")), max_ctx=max_ctx)
        nodes.append(Node(cfg, stage, hub.transport(n), tokenizer if n == "host" else None))
    return nodes, hub


def reference(model_dir, tokenizer, prompt):
    whole = make_stage("numpy", model_dir, StageSpec(0, 30, True))
    return [t for t in generate_greedy([whole], tokenizer.encode_chat(prompt), MAX_NEW).ids if t != 2]


def test_a_question_longer_than_the_cache_is_refused_and_the_next_answered(model_dir, tokenizer):
    short_len = len(tokenizer.encode_chat(SHORT))
    long_len = len(tokenizer.encode_chat(LONG))
    cache = short_len + MAX_NEW  # the short question just fits; the long one does not
    assert long_len + MAX_NEW > cache
    nodes, _ = build(model_dir, tokenizer, [LONG, SHORT], cache)

    async def go():
        for n in nodes:
            n.start()
        await asyncio.wait_for(nodes[0].done.wait(), 120)
        for n in nodes:
            await n.stop()
    asyncio.run(go())
    host, worker = nodes
    assert host.ended[0] == (f"refused: does not fit the context: a prompt of {long_len} tokens + {MAX_NEW} "
                             f"answer tokens > {cache} positions")
    assert host.ended[1] == "answered"
    assert host.answers[1] == reference(model_dir, tokenizer, SHORT)
    assert host.compute_errors == 0 and worker.compute_errors == 0


def test_a_worker_drops_a_frame_longer_than_its_cache_and_keeps_serving(model_dir, tokenizer):
    nodes, hub = build(model_dir, tokenizer, [SHORT], 48)
    host, worker = nodes

    async def go():
        for n in nodes:
            n.start()
        # a well-formed prefill frame of 60 tokens at position 0: longer than the 48-position cache
        h = FrameHeader(FrameKind.PREFILL, 77, 900, 0, 60, 576, returns=True)
        worker._on_message("host", "residual", encode_frame(h, np.zeros((60, 576), np.float32)))
        # a command the stage cannot run (a residual of the wrong width): dropped by the loop
        worker.residual[901] = np.zeros((3, 5), np.float32)
        worker.work.put_nowait(RunStage("w1", 901, 78, 0, 3))
        await asyncio.sleep(0.2)
        assert worker._task is not None and not worker._task.done()
        await asyncio.wait_for(host.done.wait(), 120)
        for n in nodes:
            await n.stop()
    asyncio.run(go())
    assert worker.rejected_frames == 1
    assert worker.compute_errors == 1
    assert host.ended == {0: "answered"}
    assert host.answers[0] == reference(model_dir, tokenizer, SHORT)


def test_the_in_process_room_refuses_what_its_caches_cannot_hold(model_dir, tokenizer):
    from planner.protocol import Refuse
    from planner.scheduler import SchedulerConfig
    from tests.local_room import LocalRoom, chain_deal
    short, long_ = tokenizer.encode_chat(SHORT), tokenizer.encode_chat(LONG)
    cache = len(short) + MAX_NEW
    stages = {n: make_stage("numpy", model_dir, StageSpec(a, b, host=(n == "host")), max_ctx=cache)
              for n, a, b in CHAIN}
    room = LocalRoom(stages, chain_deal("host", [tuple(c) for c in CHAIN]),
                     SchedulerConfig(hidden=576, eos_token=2))  # no context given: the caches decide
    room.ask(0, long_, MAX_NEW)
    room.ask(1, short, MAX_NEW)
    answers = room.run()
    refused = [c for _, c in room.trace if isinstance(c, Refuse)]
    assert [(r.question_id, r.reason) for r in refused] == [
        (0, f"does not fit the context: a prompt of {len(long_)} tokens + {MAX_NEW} answer tokens > {cache} positions")]
    assert answers[0] == [] and answers[1] == reference(model_dir, tokenizer, SHORT)
