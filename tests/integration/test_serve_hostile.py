"""A served room against hostile and careless clients: bodies that used to get a 500 get
a 400 naming the field, a refused prompt is never kept, slow clients get 408, one
address cannot hold every connection (429), and bad requests log one line each
without what they carried. Every room here is real (tests/servedroom.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket

import aiohttp
import pytest

from planner.protocol import QuestionAsked
from runtime.serve.host import start_api
from runtime.serve.server import RoomServer
from tests.servedroom import FRANCE, MODEL, served_room

pytestmark = pytest.mark.slow


def chat(content, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8, **kw}


async def post(session, url, body: bytes | dict, **kw):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url + "/v1/chat/completions", data=data,
                            headers={"Content-Type": "application/json"}, **kw) as r:
        return r.status, await r.json(content_type=None)


def test_bad_bodies_with_a_room_attached_get_400_naming_the_field_and_the_room_still_answers(caplog):
    marker = secrets.token_hex(32)

    async def go():
        async with served_room() as (server, url), aiohttp.ClientSession() as s:
            deep = b'{"model": "smollm2-135m", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}"
            assert len(deep) < 2100  # the 2 KB body of the report
            cases = [
                (deep, "messages"),
                (b'{"model": "smollm2-135m", "max_tokens": 4, "messages": [{"role": "user", "content": "a\\ud800'
                 + marker.encode() + b'"}]}', "messages[0].content"),
                (chat([{"type": "text", "text": marker + "\udfff"}]), "messages[0].content[0].text"),
                (chat(marker, stop=["\ud800"]), "stop"),
                (chat(marker, temperature=5e-324), "temperature"),
                (chat(marker, temperature=9e-6), "temperature"),
            ]
            for body, param in cases:
                status, out = await post(s, url, body.encode("utf-8", "surrogatepass") if isinstance(body, str)
                                         else json.dumps(body).encode() if isinstance(body, dict) else body)
                assert status == 400, (param, out)
                assert out["error"]["param"] == param, out
            status, out = await post(s, url, chat("Hi", temperature=1e-5, seed=1, max_tokens=1))  # the smallest
            assert status == 200, out  # temperature honoured
            status, out = await post(s, url, chat(FRANCE))
            assert status == 200 and "Paris" in out["choices"][0]["message"]["content"], out
    with caplog.at_level(logging.DEBUG):
        asyncio.run(go())
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert marker not in logged  # no prompt text in the host's log


def test_a_prompt_that_cannot_fit_is_refused_before_anything_keeps_it():
    async def go():
        async with served_room() as (server, url), aiohttp.ClientSession() as s:
            node = server.node
            ctx = node.sched_cfg.context
            marker = secrets.token_hex(16)
            got = []
            for body, param in [(chat(marker + " hello" * 50, max_tokens=1_000_000_000), "max_tokens"),
                                (chat(marker + " hello" * 3000, max_tokens=4), "messages"),
                                (chat(marker + " hello" * 3000), "messages")]:
                got.append((param, *(await post(s, url, body))))
            asked = [o for _, o in node.trace if isinstance(o, QuestionAsked)]
            assert asked == [], f"{len(asked)} refused prompts kept, the longest {max(len(a.prompt) for a in asked)}"
            assert not node.context
            for param, status, out in got:
                assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
                assert out["error"]["param"] == param, out
            status, out = await post(s, url, chat("Hi", max_tokens=ctx - 40))  # fits: asked (and answered)
            assert status == 200, out
    asyncio.run(go())


async def _raw(port: int, data: bytes, wait_s: float = 5.0) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    await w.drain()
    try:
        return await asyncio.wait_for(r.read(), wait_s)
    finally:
        w.close()


def _api(**kw):
    sock = socket.create_server(("127.0.0.1", 0))
    return sock, sock.getsockname()[1], RoomServer(MODEL, **kw)


def test_slow_headers_and_slow_bodies_get_408_and_are_closed():
    async def go():
        sock, port, server = _api(header_timeout_s=0.3, body_timeout_s=0.3)
        server, runner = await start_api(sock, MODEL, server=server)
        try:
            slow_headers = await _raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n")
            no_body = await _raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                       b"application/json\r\nContent-Length: 500\r\n\r\n{\"model\"")
            for got in (slow_headers, no_body):
                assert got.startswith(b"HTTP/1.1 408 "), got[:200]
                assert b'"request_timeout"' in got
            assert server._per_address == {} and server._header_timers == {}  # both closed, nothing held
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_one_address_cannot_hold_more_than_its_connections():
    async def go():
        sock, port, server = _api(max_connections_per_address=4, header_timeout_s=30)
        server, runner = await start_api(sock, MODEL, server=server)
        try:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
            await asyncio.sleep(0.1)
            refused = await _raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert refused.startswith(b"HTTP/1.1 429 ") and b"Retry-After: " in refused, refused[:200]
            for _, w in held:
                w.close()
            await asyncio.sleep(0.2)
            ok = await _raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert ok.startswith(b"HTTP/1.1 200 "), ok[:200]  # the places are freed when they close
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_bad_requests_log_one_line_each_without_what_they_carried(caplog):
    marker = secrets.token_hex(32)

    async def go():
        sock, port, server = _api(header_timeout_s=5)
        server, runner = await start_api(sock, MODEL, server=server)
        try:
            await _raw(port, f"GET / HTTP/1.1\r\nHost: x\r\nBad {marker}\r\n\r\n".encode())
            await _raw(port, f"{marker * 2000} / HTTP/1.1\r\n\r\n".encode())
            await _raw(port, f"GET /{marker} HTTP/1.1\r\nHost: x\r\nContent-Length: -{marker}\r\n\r\n".encode())
        finally:
            await runner.cleanup()
    with caplog.at_level(logging.DEBUG):
        asyncio.run(go())
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.exc_info or ''}" for r in caplog.records)
    assert marker not in text and marker[:16] not in text
    http = [r for r in caplog.records if r.name == "splitroom.serve.http"]
    assert len(http) == 3, [r.getMessage() for r in http]  # one line per bad request
    assert all("\n" not in r.getMessage() and r.exc_info is None for r in http)


def test_hostile_stamps_heartbeats_and_progress_to_a_served_host_leave_its_hops_and_answers_right():
    """The worker's side of the wire, hostile (fixed seed): mutated heartbeats, stamps and
    progress and random bytes on its reply channel, delivered to the served host's Node as
    the transport delivers them. The room still answers (its stand-in stages give the
    end-of-sequence token at once: the prompt's prefill laps out, the last one back), the
    host's clocks and pending stamps stay within their bounds, and /metrics counts the
    second question's hops as it counted the first's."""
    import random

    from planner.hops import CLOCK_SAMPLES
    rng = random.Random(2026_12_01)
    valid = [{"type": "heartbeat", "sent_s": 5.0, "echo_s": 1.0, "held_s": 0.1},
             {"type": "stamps", "arrived": [[1, "host", 5.0]], "sent": [[1, "host", 5.01]]},
             {"type": "progress", "percent": 30}]
    odd = [None, -1, 0, 2 ** 32, 1e308, "w", "host", "", "x" * 70, [], {}, [[0, "host", 1.0]] * 200, True, "NaN"]

    async def hops(s, url) -> dict:
        async with s.get(url + "/metrics") as r:
            text = await r.text()
        return {ln.split("{")[1].split("}")[0]: float(ln.split()[-1]) for ln in text.splitlines()
                if ln.startswith("splitroom_hop_seconds_count{")}

    async def until(s, url, back: float) -> dict:  # /metrics once `back` hops w -> host are counted (bounded)
        for _ in range(400):
            got = await hops(s, url)
            if got.get('dst="host",src="w"', 0) >= back:
                return got
            await asyncio.sleep(0.05)
        return got

    async def go():
        async with served_room(stand_in=True) as (server, url), aiohttp.ClientSession() as s:
            node = server.node
            for _ in range(400):  # a heartbeat exchange or two: the worker's clock offset is known (bounded wait)
                if node.clocks.get("w") is not None and node.clocks["w"].best() is not None:
                    break
                await asyncio.sleep(0.05)
            status, out = await post(s, url, chat(FRANCE))
            assert status == 200, out
            before = await until(s, url, 1.0)  # the worker's stamps come with its next heartbeat
            chunks = -(-len(node.tokenizer.encode_chat(FRANCE)) // 16)  # prefill laps out; the last one returns
            assert before == {'dst="w",src="host"': chunks, 'dst="host",src="w"': 1.0}, before
            for _ in range(2000):
                m = json.loads(json.dumps(rng.choice(valid)))
                for _ in range(rng.randint(1, 3)):
                    m[rng.choice(list(m) + ["arrived", "sent", "percent"])] = rng.choice(odd)
                node._on_message("w", "reply", json.dumps(m).encode())
                node._on_message("w", "reply", bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 30))))
            assert len(node.clocks) == 1 and len(node.clocks["w"]._samples) <= CLOCK_SAMPLES
            assert node.hops.pending <= 2 * node.hops.max_pending
            node.progress.pop("w", None)  # a valid mutant's "Loading 30%": the worker's own next word would mend it
            status, out = await post(s, url, chat(FRANCE))
            assert status == 200, out
            after = await until(s, url, 2.0)
            assert after == {k: 2 * v for k, v in before.items()}, after
    asyncio.run(go())
