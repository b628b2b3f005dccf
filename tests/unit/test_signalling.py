"""The relay's signalling messages as types (runtime/signalling.py): each one's wire
form written out by hand from the relay's protocol (runtime/relay.py's module doc), a
device's malformed messages refused with the relay's one-line reasons, and what a
device reads from the relay. No sockets."""

from __future__ import annotations

import json

import pytest

from runtime.signalling import (AskNonce, Forwarded, IceServers, Nonce, Peers, RelayHello, Sdp, Signal, SignalError,
                                encode, parse_client, parse_relay)

TAG, PROOF = "ab" * 32, "cd" * 64
OFFER = {"type": "offer", "sdp": "v=0\r\n"}


def test_each_message_is_sent_as_the_protocol_writes_it():
    assert json.loads(encode(AskNonce())) == {"type": "nonce"}
    assert json.loads(encode(RelayHello("w1"))) == {"type": "hello", "device": "w1"}
    assert json.loads(encode(RelayHello("w1", TAG, PROOF, asks_ice=True, ice_key="K"))) == {
        "type": "hello", "device": "w1", "room_tag": TAG, "proof": PROOF, "ice": "K"}
    assert json.loads(encode(Signal("h", Sdp("answer", "v=0").wire()))) == {
        "type": "signal", "to": "h", "data": {"type": "answer", "sdp": "v=0"}}
    assert json.loads(encode(Nonce("00" * 16))) == {"type": "nonce", "nonce": "00" * 16}
    assert json.loads(encode(IceServers([]))) == {"type": "ice", "servers": []}
    assert json.loads(encode(Peers(("a", "b")))) == {"type": "peers", "devices": ["a", "b"]}
    assert json.loads(encode(Forwarded("w1", OFFER))) == {"type": "signal", "from": "w1", "data": OFFER}


def test_a_devices_messages_are_read_back():
    assert parse_client({"type": "nonce"}) == AskNonce()
    assert parse_client({"type": "hello", "device": "w1"}) == RelayHello("w1")
    keyed = parse_client({"type": "hello", "device": "w1", "room_tag": TAG, "proof": PROOF, "ice": None})
    assert keyed == RelayHello("w1", TAG, PROOF, asks_ice=True, ice_key=None) and keyed.keyed
    assert parse_client({"type": "signal", "to": "h", "data": OFFER}) == Signal("h", OFFER)
    assert parse_client({"type": "signal", "to": 7, "data": OFFER}) == Signal(None, OFFER)  # dropped, not refused


@pytest.mark.parametrize("obj, why", [
    ({"type": "nonce", "x": 1}, "a nonce is asked for once"),
    ({"type": "hello"}, "hello must be {type, device"),
    ({"type": "hello", "device": "a b"}, "hello must be {type, device"),
    ({"type": "hello", "device": "w", "room_tag": TAG}, "hello must be {type, device"),
    ({"type": "hello", "device": "w", "extra": 1}, "hello must be {type, device"),
    ({"type": "hello", "device": "w", "room_tag": TAG.upper(), "proof": PROOF}, "proof of the room key"),
    ({"type": "hello", "device": "w", "room_tag": TAG, "proof": 5}, "proof of the room key"),
    ({"type": "signal", "to": "h"}, "signal must be {type, to, data}"),
    ({"type": "ping"}, "message type 'ping' is not allowed"),
    ({}, "message type 'None' is not allowed"),
])
def test_a_malformed_message_from_a_device_is_one_line_naming_what(obj, why):
    with pytest.raises(SignalError) as e:
        parse_client(obj)
    assert why in e.value.reason and "\n" not in e.value.reason


def test_what_a_device_reads_from_the_relay():
    assert parse_relay('{"type": "nonce", "nonce": "ff"}') == Nonce("ff")
    assert parse_relay('{"type": "peers", "devices": ["h", "w1"]}') == Peers(("h", "w1"))
    assert parse_relay(json.dumps({"type": "signal", "from": "h", "data": OFFER})) == Forwarded("h", OFFER)
    assert parse_relay('{"type": "ice"}') == IceServers(None)  # servers_from_relay says what is wrong
    for text in ("not json", "[1]", '{"type": "peers", "devices": [1]}', '{"type": "signal", "data": {}}',
                 '{"type": "hello", "device": "x"}'):
        with pytest.raises(SignalError):
            parse_relay(text)


def test_an_sdp_is_taken_only_as_the_kind_awaited():
    assert Sdp.parse(OFFER, "offer") == Sdp("offer", "v=0\r\n")
    assert Sdp.parse(OFFER, "answer") is None
    assert Sdp.parse({"type": "offer", "sdp": 3}, "offer") is None
    assert Sdp.parse("v=0", "offer") is None
