"""A device dealt back into a room of three or more makes new connections with its worker
neighbours through the relay before anyone says Ready (runtime.room.Node._relink), and
a meeting that fails is told to the host, which deals that device out again.

The chains are worked by hand from the links a lap crosses (planner.lapcost.lap_hops).
A stand-in transport records what is sent and each ``reconnect`` (peer, offer), in order;
no model is loaded (the nodes hold no stage, so a Replan loads nothing)."""

from __future__ import annotations

import asyncio

from planner.chain import relink_neighbours
from runtime.control import Ready, Replan, Unreachable, encode_control, parse_control
from runtime.room import REPLY, RELINK_WAIT_S, Node, NodeConfig

CHAIN3 = [["h", 0, 10], ["w1", 10, 20], ["w2", 20, 30]]
SCHED = dict(hidden=576, prefill_chunk=16, eos_token=2, phones=[])


def test_the_neighbours_of_a_device_dealt_back_are_the_other_ends_of_its_links_but_the_host():
    # h -> w1 -> w2 -> h: w2's links are w1 -> w2 and w2 -> h (the host met it already)
    assert relink_neighbours("h", ["h", "w1", "w2"], "w2") == ["w1"]
    assert relink_neighbours("h", ["h", "w1", "w2"], "w1") == ["w2"]
    # h -> w1 -> w2 -> w3 -> h: w2 between w1 and w3, in the order the lap crosses them
    assert relink_neighbours("h", ["h", "w1", "w2", "w3"], "w2") == ["w1", "w3"]
    # via_stages adds the way back (w3 -> w2 -> w1 -> h): the same two neighbours, once each
    assert relink_neighbours("h", ["h", "w1", "w2", "w3"], "w2", "via_stages") == ["w1", "w3"]
    # a coordinator host holding no layers: w1 is next to the host on both sides
    assert relink_neighbours("h", ["w1", "w2"], "w1") == ["w2"]
    assert relink_neighbours("h", ["h", "w1"], "w1") == []  # two devices: only the host, met already
    assert relink_neighbours("h", ["h", "w1"], "w9") == []  # not in the chain


class Relay:
    """What a worker's Node uses of a transport: ``events`` records, in order,
    ``("send", dst, message type)`` and ``("reconnect", peer, timeout, offer)``;
    ``reconnect`` raises for the peers in ``fail``."""

    def __init__(self, fail: tuple[str, ...] = ()):
        self.events: list[tuple] = []
        self.fail = fail
        self.handler = None
        self.revived: list[str] = []

    def set_handler(self, fn):
        self.handler = fn

    def set_lost_handler(self, fn):
        pass

    def revive(self, peer):
        self.revived.append(peer)

    async def send(self, dst, channel, data):
        if channel == REPLY:
            self.events.append(("send", dst, parse_control(data).type, data))

    async def reconnect(self, peer, timeout_s, offer=None):
        self.events.append(("reconnect", peer, timeout_s, offer))
        await asyncio.sleep(0)
        if peer in self.fail:
            raise OSError("the relay refused the connection")


def worker(device: str, transport, stages=CHAIN3) -> Node:
    cfg = NodeConfig(device=device, host="h", stages=stages, scheduler=SCHED, model_dir="/nonexistent",
                     peers=[d for d, _, _ in stages if d != device], heartbeat_s=0.0)  # no timers
    node = Node(cfg, None, transport, keep_open=True)
    node.start()
    return node


def replan(stages, first_lap: int, back: str | None = None, lost: str | None = None) -> bytes:
    return encode_control(Replan(lost=lost, back=back, host="h", stages=[tuple(s) for s in stages],
                                 first_lap=first_lap))


def run(device: str, stages, msg: bytes, fail: tuple[str, ...] = ()) -> Relay:
    async def go():
        t = Relay(fail)
        node = worker(device, t, stages)
        t.handler("h", REPLY, msg)
        for _ in range(200):  # bounded: the Replan's task ends with a Ready or an Unreachable
            if any(e[0] == "send" and e[2] in ("ready", "unreachable") for e in t.events):
                break
            await asyncio.sleep(0.01)
        await node.stop()
        return t
    return asyncio.run(go())


def _order(t: Relay) -> list[tuple]:
    """What the worker did, in order: (reconnect, peer, offer) and (send, dst, type), Loading left out."""
    return [e[:2] + ((e[3],) if e[0] == "reconnect" else (e[2],))
            for e in t.events if e[:3] != ("send", "h", "loading")]


def test_the_device_dealt_back_offers_to_its_neighbour_before_it_says_ready():
    t = run("w2", CHAIN3, replan(CHAIN3, 40, back="w2"))
    assert _order(t) == [("reconnect", "w1", True), ("send", "h", "ready")]
    assert [e[2] for e in t.events if e[0] == "reconnect"] == [RELINK_WAIT_S]
    assert "w1" in t.revived


def test_its_neighbour_waits_for_the_offer_before_it_says_ready():
    t = run("w1", CHAIN3, replan(CHAIN3, 40, back="w2"))
    assert _order(t) == [("reconnect", "w2", False), ("send", "h", "ready")]


def test_in_four_the_device_dealt_back_meets_both_neighbours_in_chain_order_and_a_third_does_nothing():
    chain = [["h", 0, 8], ["w1", 8, 16], ["w2", 16, 24], ["w3", 24, 30]]
    t = run("w2", chain, replan(chain, 7, back="w2"))
    assert _order(t) == [("reconnect", "w1", True), ("reconnect", "w3", True), ("send", "h", "ready")]
    t = run("w3", chain, replan(chain, 7, back="w2"))
    assert _order(t) == [("reconnect", "w2", False), ("send", "h", "ready")]
    t = run("w3", chain, replan(chain, 7, back="w1"))  # w1's neighbour is w2 only
    assert _order(t) == [("send", "h", "ready")]


def test_a_replan_after_a_loss_makes_no_new_connection():
    two = [["h", 0, 10], ["w1", 10, 30]]
    t = run("w1", two, replan(two, 12, lost="w2"))
    assert _order(t) == [("send", "h", "ready")]


def test_a_failed_meeting_is_told_to_the_host_and_no_ready_is_sent():
    t = run("w1", CHAIN3, replan(CHAIN3, 40, back="w2"), fail=("w2",))
    sent = [e for e in t.events if e[0] == "send" and e[2] != "loading"]
    assert [(e[1], e[2]) for e in sent] == [("h", "unreachable")]
    msg = parse_control(sent[0][3])
    assert (msg.first_lap, msg.device) == (40, "w2") and "refused" in msg.reason


def host(transport) -> Node:
    cfg = NodeConfig(device="h", host="h", stages=CHAIN3, scheduler=SCHED, model_dir="/nonexistent",
                     peers=["w1", "w2"], heartbeat_s=0.0, rejoin_live_s=600.0)
    node = Node(cfg, None, transport, keep_open=True)
    node.start()
    return node


def _unreachable_at_host(reporter: str, about: str, stale: bool = False):
    """The host loses w2 (re-dealt to h 1-10, w1 11-30), w1 says Ready, then w2 is back
    and dealt back (the host's rejoin rule stands in for "measured faster", tested in
    test_rejoin); then ``reporter`` says it could not reach ``about`` after that re-deal
    (``stale``: after the one before). Returns the host's lost peers and the stages of
    the Replan it sent next (None when it sent none)."""
    from runtime.control import chain_deal

    async def go():
        t = Relay()
        node = host(t)
        node._on_lost("w2", "no heartbeat for 1.1 s")
        await asyncio.sleep(0.05)
        first = [parse_control(e[3]) for e in t.events if e[0] == "send" and e[2] == "replan"][-1]
        assert first.stages == (("h", 0, 10), ("w1", 10, 30))
        t.handler("w1", REPLY, encode_control(Ready(first_lap=first.first_lap)))
        await asyncio.sleep(0.05)
        assert not node.awaiting  # the chain without w2 is ready
        node.chain.host.rejoin = lambda current, lost, measured: chain_deal("h", CHAIN3)
        node._back("w2")  # heard for its rejoin hold (no timers here)
        await asyncio.sleep(0.05)
        again = [parse_control(e[3]) for e in t.events if e[0] == "send" and e[2] == "replan"][-1]
        assert (again.back, again.stages) == ("w2", tuple(tuple(s) for s in CHAIN3))
        t.events.clear()
        lap = first.first_lap if stale else again.first_lap
        t.handler(reporter, REPLY, encode_control(Unreachable(first_lap=lap, device=about, reason="timed out")))
        await asyncio.sleep(0.05)
        replans = [parse_control(e[3]) for e in t.events if e[0] == "send" and e[2] == "replan"]
        await node.stop()
        return set(node.lost_peers), (replans[-1].stages if replans else None)
    return asyncio.run(go())


def test_the_host_deals_out_the_device_it_took_back_whichever_side_reports():
    for reporter, about in (("w1", "w2"), ("w2", "w1")):
        lost, stages = _unreachable_at_host(reporter, about)
        assert "w2" in lost and "w1" not in lost, (reporter, lost)
        assert stages == (("h", 0, 10), ("w1", 10, 30)), (reporter, stages)  # w2's layers to the stage before


def test_the_host_ignores_an_unreachable_about_an_older_re_deal():
    lost, stages = _unreachable_at_host("w1", "w2", stale=True)
    assert lost == set() and stages is None
