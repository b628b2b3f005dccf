"""ICE server URLs, their redaction, time-limited TURN credentials (checked against
openssl's HMAC-SHA1), and the one-line reason given when ICE finds no path."""

from __future__ import annotations

import base64
import secrets
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.transport.ice import (IceServer, no_path_hint, parse_ice_server, parse_ice_servers, sdp_candidate_types,
                                   turn_rest_credentials)


def test_urls_people_type_parse_to_servers():
    assert parse_ice_server("stun:198.51.100.7") == IceServer("stun", "198.51.100.7", 3478)
    assert parse_ice_server("stun:stun.example.org:19302") == IceServer("stun", "stun.example.org", 19302)
    t = parse_ice_server("turn:alice:s%40cret@[2001:db8::1]:5349?transport=tcp")
    assert (t.kind, t.host, t.port, t.transport, t.username, t.credential) == (
        "turn", "2001:db8::1", 5349, "tcp", "alice", "s@cret")
    assert t.url == "turn:[2001:db8::1]:5349?transport=tcp"
    assert t.for_webrtc() == {"urls": "turn:[2001:db8::1]:5349?transport=tcp", "username": "alice",
                              "credential": "s@cret"}
    assert parse_ice_server("turn:u:p@h").transport == "udp"


@pytest.mark.parametrize("bad", ["", "http://x", "stun:", "stun:h:0", "stun:h:70000", "turn:h:3478",
                                 "turn:u:p@h?transport=sctp", "stun:h:1 x", "turns:u:p@h"])
def test_bad_urls_are_one_line_value_errors(bad):
    with pytest.raises(ValueError) as e:
        parse_ice_server(bad)
    assert "\n" not in str(e.value)


def test_more_than_one_stun_or_turn_server_is_refused_not_ignored():
    parse_ice_servers(["stun:a", "turn:u:p@b"])
    with pytest.raises(ValueError, match="one STUN and one TURN"):
        parse_ice_servers(["stun:a", "stun:b"])


def test_the_password_is_never_shown():
    pw = secrets.token_hex(32)
    s = parse_ice_server(f"turn:bob:{pw}@198.51.100.7:3478")
    assert pw not in s.redacted() and pw not in repr(s) and s.redacted() == "turn:bob:***@198.51.100.7:3478?transport=udp"
    with pytest.raises(ValueError) as e:  # a malformed URL's message drops everything before the @
        parse_ice_server(f"turn:bob:{pw}@host:99999999")
    assert pw not in str(e.value)


@given(st.text(max_size=120))
@settings(max_examples=200, deadline=None)
def test_any_text_parses_or_is_refused_with_a_value_error(text):
    try:
        parse_ice_server(text)
    except ValueError as e:
        assert "\n" not in str(e)


def test_turn_rest_credentials_match_an_independent_hmac():
    secret = "north-" + secrets.token_hex(8)
    user, password = turn_rest_credentials(secret, "room.dev", ttl_s=3600, now_s=1_700_000_000.7)
    assert user == "1700003600:room.dev"
    mac = subprocess.run(["openssl", "dgst", "-sha1", "-hmac", secret, "-binary"], input=user.encode(),
                         capture_output=True, check=True, timeout=10).stdout
    assert password == base64.b64encode(mac).decode()
    with pytest.raises(ValueError):
        turn_rest_credentials(secret, "a:b", 10, 0)
    with pytest.raises(ValueError):
        turn_rest_credentials("", "a", 10, 0)


OFFER = ("v=0\r\na=candidate:1 1 udp 2130706431 10.0.1.2 40000 typ host\r\n"
         "a=candidate:2 1 udp 1694498815 198.19.0.11 40000 typ srflx raddr 10.0.1.2 rport 40000\r\n")
ANSWER = "v=0\r\na=candidate:1 1 udp 2130706431 10.0.3.2 50000 typ host\r\n"


def test_candidates_are_read_from_sdp():
    assert sdp_candidate_types(OFFER) == {"host": ["10.0.1.2:40000"], "srflx": ["198.19.0.11:40000"]}


def test_the_no_path_reason_names_what_each_nat_needs():
    none = no_path_hint(ANSWER, ANSWER, [])
    assert "NAT" in none and "--ice-server" in none and "no STUN/TURN server" in none
    stun_only = no_path_hint(OFFER, ANSWER, [parse_ice_server("stun:198.19.0.2")])
    assert "symmetric NAT" in stun_only and "TURN" in stun_only and "srflx 198.19.0.11:40000" in stun_only
    turn = no_path_hint(OFFER, ANSWER, [parse_ice_server("turn:u:p@198.19.0.2")])
    assert "no relay candidate" in turn


def test_the_scenario_key_network_ice_servers_is_checked_and_reaches_each_device():
    from runtime.control import NodeConfig
    from splitroom.scenario import ScenarioError, load

    pw = secrets.token_hex(32)
    urls = ["stun:198.51.100.1", f"turn:u:{pw}@198.51.100.2:3478"]
    scn = load("scenarios/home.yaml", [f"network.ice_servers=[{urls[0]}, '{urls[1]}']"])
    assert scn.network.ice_servers == tuple(urls)
    for bad, why in (("[ftp:x]", "network.ice_servers: ICE server"), ("[stun:a, stun:b]", "at most one of each")):
        with pytest.raises(ScenarioError, match=why):
            load("scenarios/home.yaml", [f"network.ice_servers={bad}"])
    with pytest.raises(ScenarioError) as e:
        load("scenarios/home.yaml", [f"network.ice_servers=['turn:u:{pw}@h:99999']"])
    assert pw not in str(e.value)
    cfg = NodeConfig(device="a", host="a", stages=[("a", 0, 30)], scheduler=dict(hidden=576), model_dir="/m",
                     ice_servers=urls)
    kw = cfg.ice()
    assert [s.kind for s in kw["ice_servers"]] == ["stun", "turn"] and kw["ice_servers"][1].credential == pw
    assert NodeConfig.from_json(cfg.to_json()).ice_servers == urls


def _openssl_turn_password(secret: str, user: str) -> str:
    mac = subprocess.run(["openssl", "dgst", "-sha1", "-hmac", secret, "-binary"], input=user.encode(),
                         capture_output=True, check=True, timeout=10).stdout
    return base64.b64encode(mac).decode()


def test_the_relay_hands_out_turn_credentials_sealed_never_in_clear(caplog):
    import asyncio
    import json
    import logging

    import aiohttp

    from runtime.relay import Relay, relay_of, run_relay
    from runtime.transport.ice import CredentialKey, TurnIssuer, servers_from_relay

    secret = secrets.token_hex(32)
    issuer = TurnIssuer(turn=parse_ice_server("turn:198.51.100.9:3478", credentials=False), secret=secret,
                        ttl_s=600, stun=parse_ice_server("stun:198.51.100.9"))
    want_user = "1700000600:r1.dev-a"
    want_pw = _openssl_turn_password(secret, want_user)

    async def main():
        runner, url = await run_relay("127.0.0.1", 0, Relay(turn=issuer, unix_clock=lambda: 1_700_000_000.0))
        try:
            async with aiohttp.ClientSession() as s:
                key = CredentialKey()
                async with s.ws_connect(f"{url}/room/r1") as ws:
                    await ws.send_json({"type": "hello", "device": "dev-a", "ice": key.public})
                    raw = (await ws.receive(timeout=5)).data
                    servers = servers_from_relay(json.loads(raw), key)
                    with pytest.raises(ValueError, match="does not open"):  # another key cannot open it
                        servers_from_relay(json.loads(raw), CredentialKey())
                async with s.ws_connect(f"{url}/room/r1") as ws:  # a key that is no P-256 point: refused
                    await ws.send_json({"type": "hello", "device": "dev-b", "ice": "AAAA"})
                    msg = await ws.receive(timeout=5)
                    assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1008
            audit = json.dumps(relay_of(runner).audit)
        finally:
            await runner.cleanup()
        return raw, servers, audit

    with caplog.at_level(logging.DEBUG):
        raw, servers, audit = asyncio.run(main())
    stun, turn = servers
    assert stun.url == "stun:198.51.100.9:3478" and turn.username == want_user and turn.credential == want_pw
    assert want_pw not in raw and want_pw not in audit and want_pw not in caplog.text and secret not in audit


def test_a_relay_without_turn_answers_an_ice_hello_with_no_servers():
    import asyncio

    import aiohttp

    from runtime.relay import run_relay
    from runtime.transport.ice import CredentialKey

    async def main():
        runner, url = await run_relay("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as s, s.ws_connect(f"{url}/room/r2") as ws:
                await ws.send_json({"type": "hello", "device": "d", "ice": CredentialKey().public})
                return await ws.receive_json(timeout=5)
        finally:
            await runner.cleanup()
    assert asyncio.run(main()) == {"type": "ice", "servers": []}
