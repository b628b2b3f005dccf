"""A served room in one process for the API tests: the model host (SmolLM2-135M layers
1-15, numpy) and one worker (layers 16-30) as real :class:`runtime.room.Node` s over an
in-process :class:`runtime.transport.loopback.LoopbackHub`, the host's
:class:`runtime.serve.server.RoomServer` attached and listening on 127.0.0.1 (as
``splitroom serve`` runs it, without the processes and WebRTC)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import AsyncIterator

import numpy as np

from runtime.backends import StageSpec, make_stage
from runtime.backends.base import Stage
from runtime.config import ModelConfig
from runtime.control import NodeConfig
from runtime.room import Node
from runtime.serve.host import start_api
from runtime.serve.server import RoomServer
from runtime.tokenizer import ChatTokenizer
from runtime.transport.loopback import LoopbackHub
from runtime.weights import ensure_safetensors

MODEL = "smollm2-135m"
FRANCE = "What is the capital of France?"
_STAGES: dict = {}


class StandIn(Stage):
    """A stage that computes nothing (for soaking what the host keeps, not the model):
    its layers hand the residual on, the embedding is zeros, the head's logits put the
    model's end-of-sequence id first, so every answer is that one token."""

    def __init__(self, cfg: ModelConfig, spec: StageSpec, max_ctx: int = 2048):
        self.cfg, self.spec, self.max_ctx = cfg, spec, max_ctx
        self._logits = np.zeros((1, cfg.vocab), np.float32)
        self._logits[0, cfg.eos_id] = 1.0

    def forward(self, hidden, first_pos):
        self._check_pos(first_pos, len(hidden))
        self._pos = first_pos + len(hidden)
        return hidden.copy()

    def embed(self, ids):
        return np.zeros((len(ids), self.cfg.hidden), np.float32)

    def head(self, hidden):
        return np.repeat(self._logits, len(hidden), axis=0)

    def _swap_cache(self, old: int, new: int) -> None:
        pass  # its KV caches hold nothing: each slot is only its position (Stage.use_cache)


def _stage(model_dir: str, a: int, b: int, host: bool):
    """A loaded stage, made once per process and emptied for each room (loading takes seconds)."""
    key = (a, b, host)
    if key not in _STAGES:
        _STAGES[key] = make_stage("numpy", model_dir, StageSpec(a, b, host=host))
    st = _STAGES[key]
    st.rollback(0)
    return st


@contextlib.asynccontextmanager
async def served_room(stand_in: bool = False, **server_kw) -> AsyncIterator[tuple[RoomServer, str]]:
    """``(server, base URL)`` of a running two-device room; ``stand_in``: its stages are
    :class:`StandIn` s (no compute: for soaking); ``server_kw`` go to RoomServer."""
    md = str(ensure_safetensors())
    tok = ChatTokenizer.from_dir(md)
    cut, end = 15, 30
    chain = [["host", 0, cut], ["w", cut, end]]
    sched = dict(hidden=576, prefill_chunk=16, eos_token=2, phones=[])
    hub = LoopbackHub()
    nodes = []
    for dev, a, b in chain:
        cfg = NodeConfig(device=dev, host="host", stages=chain, scheduler=sched, model_dir=md, prompts=[],
                         max_new_tokens=8, peers=[d for d, _, _ in chain if d != dev], heartbeat_s=0.2,
                         heartbeat_timeout_s=60.0)
        stage = StandIn(ModelConfig.load(md), StageSpec(a, b, dev == "host")) if stand_in else \
            _stage(md, a, b, dev == "host")
        nodes.append(Node(cfg, stage, hub.transport(dev), tok if dev == "host" else None,
                          keep_open=(dev == "host")))
    server = RoomServer(MODEL, {"name": "test", "host": "host"}, **server_kw)
    sock = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server, runner = await start_api(sock, MODEL, server=server)
    for n in nodes:
        n.start()
    server.attach(nodes[0])
    try:
        # served once ready, as `splitroom serve` is: the host has heard the worker's node
        # (its heartbeats say it loaded); a bound on the wait, not on how long it takes
        for _ in range(600):
            if server.readiness()[0]:
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"the served room did not become ready: {server.readiness()[1]}")
        yield server, url
    finally:
        server.node = None
        for n in nodes:
            await n.stop()
        await runner.cleanup()
