"""Security of the signalling relay (issue 11): only what ICE and DTLS need crosses
(SDP content checked, not only line names), silent sockets time out, clients are
capped per room and per address, the audit log is bounded, and a flood of bad clients
writes a bounded log without tracebacks. Loopback only."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.relay import MAX_CANDIDATES, Relay, RelayReject, check_sdp, relay_of, run_relay

FP256 = ":".join(["AB"] * 32)
GOOD = "\r\n".join([
    "v=0", "o=- 4005022537 4005022537 IN IP4 0.0.0.0", "s=-", "t=0 0", "a=group:BUNDLE 0",
    "a=msid-semantic:WMS *", "m=application 36726 UDP/DTLS/SCTP webrtc-datachannel", "c=IN IP4 192.0.2.2",
    "a=mid:0", "a=sctp-port:5000", "a=max-message-size:262144",
    "a=candidate:f957a2332b1715da3b0ef8ba684454eb 1 udp 2130706431 192.0.2.2 36726 typ host",
    "a=candidate:d0bcf3d9c29a2bc887618212a1623bfa 1 udp 2130706431 fd00::2 35260 typ host",
    "a=end-of-candidates", "a=ice-ufrag:IdK4", "a=ice-pwd:ti0cfhuodlxbceIR01Tf5V",
    f"a=fingerprint:sha-256 {FP256}", "a=setup:actpass", ""])
#: what Chrome writes for a data channel (its format; values made up)
CHROME = "\r\n".join([
    "v=0", "o=- 4611731400430051336 2 IN IP4 127.0.0.1", "s=-", "t=0 0", "a=group:BUNDLE 0",
    "a=extmap-allow-mixed", "a=msid-semantic: WMS", "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
    "c=IN IP4 0.0.0.0",
    "a=candidate:842163049 1 udp 1677729535 203.0.113.7 58889 typ srflx raddr 0.0.0.0 rport 0 generation 0 "
    "network-id 1 network-cost 10",
    "a=candidate:3061392735 1 udp 2122260223 9b36eaac-bb2e-49bb-bb78-21c41c499900.local 50000 typ host "
    "generation 0 network-id 1",
    "a=ice-ufrag:Kx0q", "a=ice-pwd:W9IfqU6dGC1YtdHEpDxF6+Zn", "a=ice-options:trickle",
    f"a=fingerprint:sha-256 {FP256}", "a=setup:actpass", "a=mid:0", "a=sctp-port:5000",
    "a=max-message-size:262144", ""])

PROMPT = "What is the secret capital of Atlantis"


def sdp(text: str) -> dict:
    return {"type": "offer", "sdp": text}


def test_real_offers_pass():
    assert check_sdp(sdp(GOOD)) == sdp(GOOD)
    assert check_sdp(sdp(CHROME)) == sdp(CHROME)


def test_an_aiortc_offer_and_answer_pass():
    from aiortc import RTCPeerConnection

    async def main():
        a, b = RTCPeerConnection(), RTCPeerConnection()
        a.createDataChannel("x")
        await a.setLocalDescription(await a.createOffer())
        await b.setRemoteDescription(a.localDescription)
        await b.setLocalDescription(await b.createAnswer())
        out = [a.localDescription, b.localDescription]
        await a.close()
        await b.close()
        return out
    for d in asyncio.run(main()):
        check_sdp({"type": d.type, "sdp": d.sdp})


@pytest.mark.parametrize("old, new, why", [
    ("s=-", f"s={PROMPT}", "s= line"),
    ("o=- 4005022537", f"o={PROMPT.replace(' ', '_')} 4005022537", "o= line"),
    ("s=-", f"s=-\r\ni={PROMPT}", "'i'"),
    ("typ host\r\na=candidate:d0", f"typ host {PROMPT}\r\na=candidate:d0", "'candidate'"),
    ("a=candidate:f957a2332b1715da3b0ef8ba684454eb", "a=candidate:What_is_the_secret_capital_of_Atlantis",
     "'candidate'"),
    ("192.0.2.2 36726 typ host", "Atlantis.example 36726 typ host", "'candidate'"),
    ("a=ice-pwd:ti0cfhuodlxbceIR01Tf5V", f"a=ice-pwd:{PROMPT}", "'ice-pwd'"),
    ("a=ice-pwd:ti0cfhuodlxbceIR01Tf5V", "a=ice-pwd:" + "QUJD" * 30, "'ice-pwd'"),  # 120 chars of base64
    ("a=mid:0", "a=mid:What-is-the-secret-capital-of-Atlantis", "'mid'"),
    (f"sha-256 {FP256}", f"sha-256 {FP256}:CD", "length"),
    ("a=setup:actpass", "a=setup:actpass\r\na=x-prompt:hi", "'x-prompt'"),
    ("a=end-of-candidates", "a=end-of-candidates:now", "no value"),
    ("c=IN IP4 192.0.2.2", f"c=IN IP4 {PROMPT}", "c= line"),
    ("t=0 0", "t=0 0\r\nb=AS:30 Atlantis", "b= line"),
    ("t=0 0", "t=0 0\r\nu=http://atlantis.example/", "'u'"),
])
def test_text_in_any_line_is_refused(old, new, why):
    assert old in GOOD
    bad = GOOD.replace(old, new, 1)
    with pytest.raises(RelayReject) as e:
        check_sdp(sdp(bad))
    assert why in e.value.reason
    assert "Atlantis" not in e.value.reason and "secret" not in e.value.reason


def test_too_many_candidates_or_lines_or_characters():
    cand = "a=candidate:1 1 udp 1 192.0.2.9 5000 typ host\r\n"
    with pytest.raises(RelayReject, match="candidates"):
        check_sdp(sdp(GOOD + cand * (MAX_CANDIDATES - 1)))
    check_sdp(sdp(GOOD + cand * (MAX_CANDIDATES - 2)))  # exactly the limit
    with pytest.raises(RelayReject, match="characters"):
        check_sdp(sdp(GOOD + "a=sendrecv\r\n" * 2000))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=100), st.none(), st.integers(),
                 st.dictionaries(st.text(max_size=5), st.text(max_size=50), max_size=3),
                 st.builds(lambda t, s: {"type": t, "sdp": s}, st.sampled_from(["offer", "answer", "x"]),
                           st.one_of(st.text(max_size=400), st.just(GOOD), st.builds(
                               lambda cut, extra: GOOD[:cut] + extra, st.integers(0, len(GOOD)),
                               st.text(max_size=80))))))
def test_check_sdp_only_accepts_or_refuses(data):
    """Any input: the SDP comes back unchanged or RelayReject is raised, nothing else;
    anything accepted has no line outside the allowed types."""
    try:
        out = check_sdp(data)
    except RelayReject:
        return
    assert out is data
    for line in filter(None, data["sdp"].replace("\r\n", "\n").split("\n")):
        assert line[:2] in ("v=", "o=", "s=", "t=", "c=", "b=", "m=", "a=")


# --------------------------------------------------------------------------- live relay limits


def run(coro, timeout_s: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def closed_within(ws, seconds: float):
    m = await asyncio.wait_for(ws.receive(), seconds)
    assert m.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), m
    return ws.close_code


def test_a_socket_that_never_says_hello_is_closed():
    """A socket silent for the hello timeout is closed (1008); one that said hello stays
    past it. By order, not a sleep: the silent socket opens after the other said hello,
    so when it is closed the other's timeout, begun earlier, has passed too."""
    async def main():
        relay = Relay(hello_timeout_s=1.0)
        runner, url = await run_relay("127.0.0.1", 0, relay)
        try:
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"{url}/room/r") as ok:
                    await ok.send_json({"type": "hello", "device": "a"})
                    assert (await ok.receive_json())["type"] == "peers"
                    async with s.ws_connect(f"{url}/room/r") as idle:
                        assert await closed_within(idle, 30) == 1008  # 1 s asked; 30 s: a hang guard
                    assert not ok.closed and "a" in relay.rooms["r"]
        finally:
            await runner.cleanup()
        assert [r["reason"] for r in relay.rejections] == ["no hello within 1 s"]
        assert relay.connections == {}
    run(main())


def test_the_sockets_state_is_judged_before_the_messages_shape():
    """A second hello is refused as such even when malformed, a signal before hello as
    such, a nonce after hello as a nonce; each closes that socket with 1008."""
    async def main():
        relay = Relay()
        runner, url = await run_relay("127.0.0.1", 0, relay)
        try:
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"{url}/room/r") as w:
                    await w.send_json({"type": "signal", "to": "x"})
                    assert await closed_within(w, 5) == 1008
                for late in ({"type": "hello", "device": "a b"}, {"type": "nonce"}):
                    async with s.ws_connect(f"{url}/room/r") as w:
                        await w.send_json({"type": "hello", "device": "a"})
                        await w.receive_json()
                        await w.send_json(late)
                        assert await closed_within(w, 5) == 1008
        finally:
            await runner.cleanup()
        reasons = [r["reason"] for r in relay.rejections]
        assert reasons == ["signal before hello", "second hello", "a nonce is asked for once, before hello, as {type}"]
    run(main())


def test_clients_are_capped_per_address_and_per_room():
    async def main():
        relay = Relay(max_clients_per_address=3, max_room_clients=2)
        runner, url = await run_relay("127.0.0.1", 0, relay)
        try:
            async with aiohttp.ClientSession() as s:
                a = await s.ws_connect(f"{url}/room/r")
                b = await s.ws_connect(f"{url}/room/r")
                c = await s.ws_connect(f"{url}/room/r")
                with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                    await s.ws_connect(f"{url}/room/r")
                assert e.value.status == 429
                await a.send_json({"type": "hello", "device": "a"})
                await b.send_json({"type": "hello", "device": "b"})
                await c.send_json({"type": "hello", "device": "c"})  # the room holds 2
                while True:
                    m = await asyncio.wait_for(c.receive(), 5)
                    if m.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                        break
                assert c.close_code == 1008
                assert "full" in relay.rejections[-1]["reason"]
                await c.close()
                for _ in range(50):  # the freed slot is given back
                    if relay.connections.get("127.0.0.1") == 2:
                        break
                    await asyncio.sleep(0.05)
                d = await s.ws_connect(f"{url}/room/other")
                await d.send_json({"type": "hello", "device": "d"})
                assert (await d.receive_json()) == {"type": "peers", "devices": ["d"]}
                for w in (a, b, d):
                    await w.close()
        finally:
            await runner.cleanup()
    run(main())


def test_audit_and_rejections_are_bounded():
    async def main():
        relay = Relay(max_audit=5)
        runner, url = await run_relay("127.0.0.1", 0, relay)
        try:
            async with aiohttp.ClientSession() as s:
                for i in range(12):
                    async with s.ws_connect(f"{url}/room/r") as w:
                        await w.send_json({"type": "hello", "device": f"d{i}"})
                        await w.receive_json()
                        await w.send_json({"type": "chat"})  # rejected
                        await closed_within(w, 5)
        finally:
            await runner.cleanup()
        assert len(relay.audit) == 5 and len(relay.rejections) == 5
        assert relay.dropped == (24 - 5) + (12 - 5)  # 12 hellos + 12 peers messages; 12 rejections
        assert relay.rejections[-1]["device"] == "d11"
    run(main())


def test_a_flood_of_bad_clients_writes_a_bounded_log_without_tracebacks(caplog):
    # The relay's clock is passed in and held still while the 40 bad clients come: one
    # one-second window, so by hand exactly 5 lines (the first 5 rejections) and 35
    # suppressed. Moved on one second, the next line (the good client joining) first
    # reports the 35, then itself; the good client leaving is one more: 8 lines in all.
    now = [1000.25]

    async def main():
        relay = Relay(log_lines_per_s=5, clock=lambda: now[0])
        runner, url = await run_relay("127.0.0.1", 0, relay)
        try:
            async with aiohttp.ClientSession() as s:
                for i in range(40):
                    async with s.ws_connect(f"{url}/room/r") as w:
                        await w.send_str("not json" if i % 2 else "\x00" * 10)
                        await closed_within(w, 5)
                now[0] += 1.0
                async with s.ws_connect(f"{url}/room/r") as w:  # still serving
                    await w.send_json({"type": "hello", "device": "ok"})
                    assert (await w.receive_json())["devices"] == ["ok"]
                for _ in range(200):  # the good client's "left" line is written after its close
                    if "ok" not in relay.rooms.get("r", {}):
                        break
                    await asyncio.sleep(0.01)
        finally:
            await runner.cleanup()
        return relay
    with caplog.at_level(logging.INFO, logger="splitroom.relay"):
        relay = run(main())
    assert len(relay.rejections) == 40
    msgs = [r.getMessage() for r in caplog.records if r.name == "splitroom.relay"]
    assert len(msgs) == 8, msgs
    assert all("rejected (no hello yet)" in m for m in msgs[:5]), msgs
    assert msgs[5] == "relay: 35 log lines suppressed (over 5 a second)", msgs
    assert msgs[6] == "relay: room r: ok joined (1 devices)" and msgs[7] == "relay: room r: ok left", msgs
    assert not any(r.exc_info for r in caplog.records if r.name == "splitroom.relay")
    assert all("\n" not in m for m in msgs)


@settings(max_examples=40, deadline=None)
@given(msgs=st.lists(st.one_of(
    st.text(max_size=200),
    st.builds(lambda d: '{"type": "hello", "device": %s}' % d, st.sampled_from(['"x"', '"a b"', "1", "null", '""'])),
    st.builds(lambda t, d: '{"type": "signal", "to": "y", "data": {"type": "%s", "sdp": %s}}' % (t, d),
              st.sampled_from(["offer", "answer", "pranswer"]),
              st.sampled_from(['"v=0"', '"v=0\\r\\ns=hello"', "1", "[]", '"%s"' % GOOD.replace("\r\n", "\\r\\n")])),
    st.just('{"type": "hello", "device": "z"}'), st.just("[" * 5000)), max_size=4))
def test_any_relay_messages_leave_the_relay_serving(msgs):
    async def main():
        relay = Relay(hello_timeout_s=2.0)
        runner, url = await run_relay("127.0.0.1", 0, relay)
        try:
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"{url}/room/r") as y:
                    await y.send_json({"type": "hello", "device": "y"})
                    await y.receive_json()
                    async with s.ws_connect(f"{url}/room/r") as w:
                        for m in msgs:
                            if w.closed:
                                break
                            await w.send_str(m)
                        await asyncio.sleep(0.02)
                    # whatever crossed to y is a peers list or a checked SDP signal
                    while True:
                        try:
                            m = await asyncio.wait_for(y.receive_json(), 0.1)
                        except asyncio.TimeoutError:
                            break
                        assert m["type"] in ("peers", "signal")
                        if m["type"] == "signal":
                            check_sdp(m["data"])
                    async with s.ws_connect(f"{url}/room/r") as ok:
                        await ok.send_json({"type": "hello", "device": "ok"})
                        assert "ok" in (await ok.receive_json())["devices"]
        finally:
            await runner.cleanup()
    run(main(), 30)


def test_relay_of_returns_the_relay_given():
    async def main():
        relay = Relay(max_audit=7)
        runner, _ = await run_relay("127.0.0.1", 0, relay)
        try:
            assert relay_of(runner) is relay
        finally:
            await runner.cleanup()
    run(main())
