"""Per-channel subscriptions of a room transport (runtime.transport.Transport.subscribe),
over the in-process LoopbackHub: a channel's subscribers are asked in the order they
subscribed and the first that accepts takes the message; what none takes goes to the
one handler; a cancelled subscription takes nothing more. The weights server and a copy
in flight (runtime.weights_share) are such subscribers, so a server closed while a copy
of its own device is under way stops answering at once and stays stopped."""

from __future__ import annotations

import asyncio

import pytest

from runtime.transport import LoopbackHub
from runtime.weights import ensure_safetensors
from runtime.weights_share import CHANNEL, encode, fetch_range, make_manifest, serve_weights

REQUEST = ord("Q")  # the weights channel's request kind (runtime.weights_share: 'Q' request, 'R' reply)


async def _settle(n: int = 20) -> None:
    """Let the loopback's call_soon deliveries run."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_first_subscriber_that_accepts_takes_a_message_and_the_rest_go_to_the_handler():
    async def go():
        hub = LoopbackHub()
        a, b = hub.transport("a"), hub.transport("b")
        handler, first, second = [], [], []
        b.set_handler(lambda src, ch, data: handler.append((ch, bytes(data))))
        sub1 = b.subscribe("weights", lambda src, data: first.append(bytes(data)),
                           accepts=lambda src, data: bytes(data).startswith(b"x"))
        sub2 = b.subscribe("weights", lambda src, data: second.append(bytes(data)))
        for ch, data in (("weights", b"x1"), ("weights", b"y1"), ("residual", b"x2")):
            await a.send("b", ch, data)
        await _settle()
        sub1.cancel()
        await a.send("b", "weights", b"x3")  # only the catch-all subscriber is left
        await _settle()
        sub2.cancel()
        sub2.cancel()  # idempotent
        await a.send("b", "weights", b"y4")
        await _settle()
        return handler, first, second, sub1.active, sub2.active

    handler, first, second, active1, active2 = asyncio.run(asyncio.wait_for(go(), 10))
    assert first == [b"x1"]
    assert second == [b"y1", b"x3"]
    assert handler == [("residual", b"x2"), ("weights", b"y4")]
    assert not active1 and not active2


def test_a_subscription_to_an_unknown_channel_is_refused():
    t = LoopbackHub().transport("a")
    with pytest.raises(ValueError, match="unknown channel 'video'"):
        t.subscribe("video", lambda src, data: None)


def test_a_server_closed_while_a_copy_of_its_device_is_under_way_answers_nothing_more(tmp_path):
    model_dir = ensure_safetensors()
    manifest = make_manifest(model_dir, 29, 30, False, False)
    request = encode(REQUEST, {"id": 1, "op": "manifest", "start": 29, "end": 30, "embedding": False,
                               "head": False})

    async def go():
        hub = LoopbackHub()
        a, b, c = hub.transport("a"), hub.transport("b"), hub.transport("c")
        below, answers = [], []
        a.set_handler(lambda src, ch, data: below.append((src, ch)))
        c.set_handler(lambda src, ch, data: answers.append(bytes(data)))
        other = serve_weights(b, model_dir)
        mine = serve_weights(a, model_dir)
        copy = asyncio.ensure_future(fetch_range(a, "b", 29, 30, False, False, tmp_path / "copy",
                                                 manifest["sha256"]))
        await asyncio.sleep(0)  # the copy has begun: it asks b and waits for replies on a
        mine.close()
        await copy
        await c.send("a", CHANNEL, request)
        for _ in range(50):
            await asyncio.sleep(0.01)
        other.close()
        return below, answers

    below, answers = asyncio.run(asyncio.wait_for(go(), 60))
    assert (tmp_path / "copy" / "model.safetensors").is_file()
    # the closed server took nothing: c's request went to a's handler and was never answered
    assert answers == []
    assert below == [("c", CHANNEL)]
