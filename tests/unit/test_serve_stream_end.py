"""A streamed answer that the room cannot finish ends with an SSE error chunk (what
OpenAI's clients read as an error), not a cut stream; a client that closes its stream
leaves no traceback in the log.

RoomServer runs on aiohttp's test server over a stand-in node that takes questions and
lets the test feed the answer's events by hand (no room, no model).
"""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

from aiohttp.test_utils import TestClient, TestServer

from planner.deal import Deal, Stage
from runtime.serve.server import RoomServer


class Decoder:
    def push(self, tok: int) -> str:
        return f"<{tok}>"

    def flush(self) -> str:
        return ""


class Node:
    """What RoomServer uses of runtime.room.Node; ``asked`` holds each question id."""

    def __init__(self):
        host = SimpleNamespace(stopped=None, recovering=None, queue=[], busy=False, in_flight=0, questions_in_flight=1)
        self.chain = SimpleNamespace(host=host, deal=Deal(host="a", split="pinned", stages=(Stage("a", 0, 30),),
                                                          guests=(), fits=True, notes=()))
        self.tokenizer = SimpleNamespace(encode_chat=lambda messages: [1, 2, 3], stream_decoder=Decoder,
                                         stop_ids=frozenset())
        self.observers, self.cfg = [], SimpleNamespace(host="a")
        self.sched_cfg = SimpleNamespace(context=2048)
        self.asked: list[int] = []
        self.withdrawn: list[int] = []

    def ask(self, ids, cap, client, sampling=None) -> int:
        self.asked.append(len(self.asked) + 1)
        return self.asked[-1]

    def withdraw(self, qid: int) -> None:
        self.withdrawn.append(qid)

    def forget(self, qid: int) -> None:
        pass


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def events(raw: str) -> list:
    return [json.loads(x[6:]) if x[6:] != "[DONE]" else "[DONE]"
            for x in raw.split("\n\n") if x.startswith("data: ")]


def test_a_room_that_stops_mid_answer_sends_an_sse_error_chunk():
    srv, node = RoomServer("m"), Node()
    srv.attach(node)

    async def main():
        async with TestClient(TestServer(srv.app)) as c:
            req = asyncio.ensure_future(c.post("/v1/chat/completions", json=BODY))
            while not srv.tickets:
                await asyncio.sleep(0.01)
            t = srv.tickets[node.asked[0]]
            for item in (("asked", None), ("begin", None), ("token", 7), ("token", 8)):
                t.items.put_nowait(item)
            while t.items.qsize():
                await asyncio.sleep(0.01)
            srv.set_phase("stopping", "the room is shutting down")
            r = await req
            return r.status, await r.text()

    status, raw = asyncio.run(main())
    ev = events(raw)
    assert status == 200
    assert [e["choices"][0]["delta"].get("content") for e in ev[1:3]] == ["<7>", "<8>"]
    assert "error" in ev[-1] and "mid-answer" in ev[-1]["error"]["message"]
    assert "shutting down" in ev[-1]["error"]["message"] and "[DONE]" not in ev
    assert node.withdrawn == [1]


def _close_after(srv: RoomServer, node: Node, read_lines: int, tokens: int) -> list:
    """Stream one answer of ``tokens`` tokens; the client reads ``read_lines`` lines and
    closes. Returns the withdrawn question ids once the server is done with it."""
    async def run():
        async with TestClient(TestServer(srv.app)) as c:
            req = asyncio.ensure_future(c.post("/v1/chat/completions", json=BODY))
            while not srv.tickets:
                await asyncio.sleep(0.01)
            t = srv.tickets[node.asked[0]]
            t.items.put_nowait(("asked", None))
            r = await req
            for i in range(tokens):
                t.items.put_nowait(("token", i))
            t.items.put_nowait(("done", "stop"))
            for _ in range(read_lines):
                await r.content.readline()
            r.close()  # the client goes away
            for _ in range(200):
                if not srv.tickets:
                    break
                await asyncio.sleep(0.01)
            return list(node.withdrawn)
    return asyncio.run(run())


def test_a_client_that_closes_its_stream_leaves_no_traceback(caplog):
    for read_lines, tokens in ((2, 50), (2 * 5, 3)):  # mid-answer; right after [DONE] (role, 3, finish, DONE)
        srv, node = RoomServer("m"), Node()
        srv.attach(node)
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            _close_after(srv, node, read_lines, tokens)
        assert not srv.tickets
        assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()], \
            [r.getMessage() for r in caplog.records]
