"""runtime.transport.emulate_delay on real WebRTC connections (loopback, peers in this
process): every message arrives whole and in order, the packets went through the delay
line (counted), the delay comes off again and stays on across a reconnect, and a room
planned with ``in_process_delay`` gives each device process half the round trip.
Counted, never timed."""

from __future__ import annotations

import asyncio

import pytest

from runtime.relay import run_relay
from runtime.transport import connect_room, emulate_delay

from tests.integration.test_transport import LO, close_room, room, run, wait_for


def _payloads(n: int) -> list[bytes]:
    # sizes from 1 B to about 40 KB: one datagram up to many SCTP chunks per message
    return [bytes([i % 251]) * (1 + (i * 997) % 40_000) for i in range(n)]


async def send_and_receive(src, dst_t, dst: str, n: int) -> None:
    """Send ``n`` payloads from ``src`` to ``dst`` on the residual channel; check that
    ``dst_t`` receives them all, byte for byte and in order."""
    got: list[bytes] = []
    dst_t.set_handler(lambda s, ch, d: got.append(d))
    sent = _payloads(n)
    for p in sent:
        await src.send(dst, "residual", p)
    await wait_for(lambda: len(got) == len(sent), 20)
    assert got == sent


def test_delayed_messages_arrive_whole_and_in_order_and_every_packet_went_through_the_line():
    async def main():
        runner, _, ts = await room(["a", "b"])
        try:
            a, b = ts["a"], ts["b"]
            assert a.delay_stats() is None  # no delay set: no record
            for t in ts.values():
                emulate_delay(t, 0.005)
            await send_and_receive(a, b, "b", 40)
            sent = _payloads(40)
            sa, sb = a.delay_stats(), b.delay_stats()
            assert sa["one_way_s"] == 0.005 and sb["one_way_s"] == 0.005
            chunks = sum(-(-len(p) // 1200) for p in sent)  # at least one datagram per ~1.2 KB of data
            assert sa["packets"] >= chunks  # a's DATA chunks all left through its line
            assert sb["packets"] >= 1  # b's acknowledgements left through b's line
            assert sa["dropped"] == 0
            assert sa["lateness_p50_s"] is not None and sa["lateness_max_s"] >= sa["lateness_p50_s"] >= 0
        finally:
            await close_room(runner, ts)

    run(main())


def test_a_delay_of_zero_takes_the_line_off():
    async def main():
        runner, _, ts = await room(["a", "b"])
        try:
            a, b = ts["a"], ts["b"]
            lk = a._links["b"]
            ice = lk.pc.sctp.transport.transport
            own = ice._send
            emulate_delay(a, 0.005)
            assert ice._send != own
            got: list[bytes] = []
            b.set_handler(lambda src, ch, d: got.append(d))
            await a.send("b", "residual", b"x" * 5000)
            await wait_for(lambda: len(got) == 1)
            emulate_delay(a, 0)
            assert ice._send == own
            before = a.delay_stats()["packets"]
            for p in _payloads(10):
                await a.send("b", "residual", p)
            await wait_for(lambda: len(got) == 11)
            assert a.delay_stats()["packets"] == before  # nothing more went through the line
            assert a.delay_stats()["one_way_s"] == 0.0
            with pytest.raises(ValueError, match="one_way_s"):
                emulate_delay(a, -1.0)
            with pytest.raises(ValueError, match="one_way_s"):
                emulate_delay(a, float("nan"))
        finally:
            await close_room(runner, ts)

    run(main())


def test_the_delay_stays_on_a_connection_made_again_by_reconnect():
    async def main():
        runner, url = await run_relay("127.0.0.1", 0)
        a, b = await asyncio.gather(*(connect_room(url, "t", d, [p], host_addresses=LO, open_timeout_s=15)
                                      for d, p in (("a", "b"), ("b", "a"))))
        b2 = None
        try:
            emulate_delay(a, 0.005)
            old = a._links["b"]
            await b.close()  # b's process "restarts": a new connection through the relay
            b2, _ = await asyncio.gather(connect_room(url, "t", "b", ["a"], host_addresses=LO, open_timeout_s=15),
                                         a.reconnect("b", 15))
            fresh = a._links["b"]
            assert fresh is not old and fresh.delay is not None
            assert fresh.pc.sctp.transport.transport._send == fresh.delay._delayed
            before = a.delay_stats()["packets"]
            await send_and_receive(a, b2, "b", 8)
            assert a.delay_stats()["packets"] > before
        finally:
            await a.close()
            if b2 is not None:
                await b2.close()
            await runner.cleanup()

    run(main())


def test_a_room_planned_with_in_process_delay_gives_each_device_half_the_round_trip(tmp_path):
    from splitroom.real_errors import RealRunError
    from splitroom.real_procs import plan_network
    from splitroom.scenario import load

    scn = load("scenarios/home.yaml", ["network.rtt=40 ms", "network.jitter={distribution: none}"])
    net, how, rtt = plan_network(scn, [d.id for d in scn.devices], netns=False, in_process_delay=True)
    assert net is None and rtt == pytest.approx(0.040)
    assert "40 ms RTT emulated in process" in how and "20 ms" in how
    # without the flag, or with no round trip, the room is plain loopback
    assert plan_network(scn, [d.id for d in scn.devices], netns=False)[1:] == ("loopback", 0.0)
    zero = load("scenarios/home.yaml", ["network.rtt=0 ms", "network.jitter={distribution: none}"])
    assert plan_network(zero, [d.id for d in zero.devices], netns=False, in_process_delay=True)[1:] == ("loopback", 0.0)
    jittery = load("scenarios/home.yaml", ["network.rtt=40 ms", "network.jitter={distribution: normal, scale: 5 ms}"])
    with pytest.raises(RealRunError, match="jitter"):
        plan_network(jittery, [d.id for d in jittery.devices], netns=False, in_process_delay=True)


def test_a_served_room_with_in_process_delay_gives_every_device_process_half_the_round_trip(tmp_path, monkeypatch):
    # serve_room writes each device's configuration (the model host's too) before it starts
    # the processes; kept here (SPLITROOM_KEEP_WORKDIR) and read back. Stopped at once: nothing
    # is timed and no question is asked.
    import json
    import tempfile

    from planner.deal import deal_for
    from splitroom.scenario import load
    from splitroom.serve_cmd import serve_room

    monkeypatch.setenv("SPLITROOM_KEEP_WORKDIR", "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sets = ["network.rtt=30 ms", "network.jitter={distribution: none}"]
    scn = load("scenarios/home.yaml", sets)
    d = deal_for(scn)
    lines: list[str] = []
    assert serve_room(scn, d, port=0, netns=False, in_process_delay=True, log=lines.append,
                      should_stop=lambda: True) == 0
    cfgs = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("splitroom-serve-*/*.json")
            if p.name != "room.json"}
    assert set(cfgs) == {"desktop", "laptop", "phone"} and d.host in cfgs
    assert {k: c["emulate_one_way_s"] for k, c in cfgs.items()} == pytest.approx(
        {"desktop": 0.015, "laptop": 0.015, "phone": 0.015})
    assert any("30 ms RTT emulated in process" in line for line in lines)
    # without the flag the same room is plain loopback: no device holds its packets
    lines.clear()
    for p in tmp_path.glob("splitroom-serve-*/*.json"):
        p.unlink()
    assert serve_room(scn, d, port=0, netns=False, log=lines.append, should_stop=lambda: True) == 0
    plain = [json.loads(p.read_text()) for p in tmp_path.glob("splitroom-serve-*/*.json") if p.name != "room.json"]
    assert len(plain) == 3 and {c["emulate_one_way_s"] for c in plain} == {0.0}
