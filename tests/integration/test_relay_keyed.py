"""The relay and a room with a key: devices are seated by a tag and a signature made
from the key (runtime.relay.relay_hello), so a client without the key can neither take
a keyed device's id first nor fill its room, a proof seen on the wire does not work on
another socket, the key never reaches the relay, and one socket cannot flood it with
offers. Loopback websockets only."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from runtime.relay import Relay, check_relay_hello, relay_hello, room_tag, run_relay
from tests.integration.test_relay_security import GOOD, closed_within, sdp

KEY = "test-room-key-0123456789"


async def keyed(s, url: str, room: str, device: str, key: str = KEY):
    """A websocket seated as ``device`` in the keyed ``room``; returns (ws, first message)."""
    ws = await s.ws_connect(f"{url}/room/{room}")
    await ws.send_json({"type": "nonce"})
    nonce = (await ws.receive_json())["nonce"]
    await ws.send_json(relay_hello(key, room, device, nonce))
    return ws, await ws.receive_json()


def test_the_tag_and_proof_are_made_from_the_key_and_check_only_with_it():
    tag = room_tag(KEY, "home")
    assert len(tag) == 64 and tag != room_tag(KEY, "other") and tag != room_tag("another-key-0123456789", "home")
    h = relay_hello(KEY, "home", "w", "ab" * 16)
    assert h["room_tag"] == tag and KEY not in json.dumps(h)
    assert check_relay_hello("home", "w", "ab" * 16, tag, h["proof"])
    assert not check_relay_hello("home", "w", "cd" * 16, tag, h["proof"])  # another socket's nonce
    assert not check_relay_hello("home", "h", "ab" * 16, tag, h["proof"])  # another device id
    assert not check_relay_hello("home", "w", "ab" * 16, room_tag("another-key-0123456789", "home"), h["proof"])


def test_a_client_without_the_key_cannot_squat_an_id_or_fill_a_keyed_room():
    async def main():
        relay = Relay(max_clients_per_address=200)
        runner, url = await run_relay("127.0.0.1", 0, relay)
        try:
            async with aiohttp.ClientSession() as s:
                squat = await s.ws_connect(f"{url}/room/home")  # takes the id w first, without the key
                await squat.send_json({"type": "hello", "device": "w"})
                assert (await squat.receive_json())["type"] == "peers"
                junk = []
                for i in range(64):  # and fills the room of that name
                    j = await s.ws_connect(f"{url}/room/home")
                    await j.send_json({"type": "hello", "device": f"junk{i}"})
                    junk.append(j)
                wrong, first = await keyed(s, url, "home", "h", key="another-key-0123456789")
                assert first == {"type": "peers", "devices": ["h"]}  # a room of its own tag
                h, first = await keyed(s, url, "home", "h")
                assert first == {"type": "peers", "devices": ["h"]}
                w, first = await keyed(s, url, "home", "w")  # the real w is seated
                assert first == {"type": "peers", "devices": ["h", "w"]}
                assert (await h.receive_json()) == {"type": "peers", "devices": ["h", "w"]}
                await w.send_json({"type": "signal", "to": "h", "data": sdp(GOOD)})
                assert (await h.receive_json())["from"] == "w"
                # a proof seen on the wire does not seat anyone on another socket
                replay = await s.ws_connect(f"{url}/room/home")
                await replay.send_json({"type": "nonce"})
                await replay.receive_json()
                await replay.send_json(relay_hello(KEY, "home", "x", "00" * 16))
                assert await closed_within(replay, 5) == 1008
                assert "proof" in relay.rejections[-1]["reason"]
                nonceless = await s.ws_connect(f"{url}/room/home")
                await nonceless.send_json(relay_hello(KEY, "home", "y", "00" * 16))
                assert await closed_within(nonceless, 5) == 1008
                for x in (squat, wrong, h, w, *junk):
                    await x.close()
        finally:
            await runner.cleanup()
        crossed = json.dumps(relay.audit) + json.dumps(relay.rejections)
        assert KEY not in crossed
    asyncio.run(main())


def test_one_socket_cannot_flood_the_relay_with_offers():
    now = [0.0]

    async def main():
        relay = Relay(signal_burst=10, signals_per_s=2.0, clock=lambda: now[0])
        runner, url = await run_relay("127.0.0.1", 0, relay)
        try:
            async with aiohttp.ClientSession() as s:
                a = await s.ws_connect(f"{url}/room/r")
                b = await s.ws_connect(f"{url}/room/r")
                await a.send_json({"type": "hello", "device": "a"})
                assert (await a.receive_json())["type"] == "peers"
                await b.send_json({"type": "hello", "device": "b"})
                for ws in (a, b):
                    assert (await ws.receive_json()) == {"type": "peers", "devices": ["a", "b"]}
                async def signals_to_b(n: int) -> int:
                    """Signals b receives before a leaves the room (or ``n`` of them)."""
                    got = 0
                    while got < n:
                        m = await asyncio.wait_for(b.receive(), 5)
                        obj = json.loads(m.data)
                        if obj["type"] == "peers":
                            break  # a was closed
                        got += 1
                    return got
                for _ in range(10):  # the burst passes
                    await a.send_json({"type": "signal", "to": "b", "data": sdp(GOOD)})
                assert await signals_to_b(10) == 10
                now[0] = 1.0  # a second later: 2 more
                for _ in range(2):
                    await a.send_json({"type": "signal", "to": "b", "data": sdp(GOOD)})
                assert await signals_to_b(2) == 2
                for _ in range(1000):  # then a flood: closed at the first over the rate
                    if a.closed:
                        break
                    try:
                        await a.send_json({"type": "signal", "to": "b", "data": sdp(GOOD)})
                    except ConnectionError:
                        break
                assert await closed_within(a, 5) == 1008
                assert await signals_to_b(1000) == 0
                await b.close()
        finally:
            await runner.cleanup()
        assert "signals" in relay.rejections[-1]["reason"]
    asyncio.run(main())


@pytest.mark.slow
def test_devices_with_the_key_connect_through_the_relay_and_the_key_never_crosses_it():
    from runtime.relay import relay_of
    from runtime.transport import connect_room

    async def main():
        runner, url = await run_relay("127.0.0.1", 0)
        sess = aiohttp.ClientSession()
        try:
            squat = await sess.ws_connect(f"{url}/room/k")
            await squat.send_json({"type": "hello", "device": "b"})  # b's id, taken without the key
            ta, tb = await asyncio.gather(
                connect_room(url, "k", "a", ["b"], host_addresses=["127.0.0.1"], room_key=KEY),
                connect_room(url, "k", "b", ["a"], host_addresses=["127.0.0.1"], room_key=KEY))
            got = asyncio.get_running_loop().create_future()
            tb.set_handler(lambda src, ch, data: got.done() or got.set_result((src, ch, data)))
            await ta.send("b", "reply", b"hello b")
            assert await asyncio.wait_for(got, 10) == ("a", "reply", b"hello b")
            await ta.close()
            await tb.close()
            await squat.close()
        finally:
            await sess.close()
            crossed = json.dumps(relay_of(runner).audit)
            await runner.cleanup()
        assert KEY not in crossed and room_tag(KEY, "k") in crossed
    asyncio.run(main())
