"""One re-deal copy plan (planner.chain.copy_plan) on both sides: what a device that
gained layers copies from the host and what it reads from its disk, each range with the
bytes of that range. The case that split them: a worker that gains on both sides (host
1-10, w1 11-20, w2 21-30; w2 lost; the new chain host 1-5, w1 6-30)."""

from __future__ import annotations

import asyncio

from planner.chain import CopyPlan, copy_plan
from planner.deal import Deal
from planner.protocol import Redeal, WeightsCopied

BEFORE = [("h", 0, 10), ("w1", 10, 20), ("w2", 20, 30)]
AFTER = (("h", 0, 5), ("w1", 5, 30))


def test_the_plan_copies_the_lowest_gained_range_and_reads_the_rest_from_disk():
    # by hand: w1 held layers 11-20 and now holds 6-30: it gained 6-10 and 21-30
    assert copy_plan(BEFORE, AFTER, "h") == {"w1": CopyPlan("w1", (5, 10), ((20, 30),))}
    # the host never copies over the wire; a newcomer gets its whole range
    assert copy_plan([("h", 0, 10), ("w1", 10, 30)], [("h", 0, 30)], "h") == {"h": CopyPlan("h", None, ((10, 30),))}
    assert copy_plan([("h", 0, 10)], [("h", 0, 10), ("n", 10, 30)], "h") == {"n": CopyPlan("n", (10, 30), ())}
    assert copy_plan(BEFORE, BEFORE, "h") == {}


def test_the_simulator_records_each_gained_range_with_its_own_bytes():
    from sim.driver import Simulation
    from splitroom.scenario import load
    scn = load("scenarios/home.yaml", ["workload.questions=1", "host=desktop"])
    sim = Simulation(scn)
    names = {"h": "desktop", "w1": "laptop", "w2": "phone"}
    rows = lambda rs: [(names[d], a, b) for d, a, b in rs]  # noqa: E731
    sim.deal = Deal.pinned("desktop", rows(BEFORE))
    sim.chain.deal = Deal.pinned("desktop", rows(AFTER))
    sim.redeal(Redeal("phone", "desktop", tuple(rows(AFTER)), 0))
    sim.loop.run()
    got = [o for _, o in sim.raw if isinstance(o, WeightsCopied)]
    assert [(c.device, c.source, c.start, c.end) for c in got] == [("laptop", "desktop", 5, 10),
                                                                   ("laptop", "disk", 20, 30)]
    for c in got:  # every record's bytes are those of the range it names
        assert c.nbytes == scn.model.weight_bytes(c.start, c.end)


def test_the_real_host_asks_the_worker_to_copy_the_planned_range_only(tmp_path):
    from runtime.control import NodeConfig, Replan, parse_control
    from runtime.room import Node
    from runtime.weights import ensure_safetensors

    class Wire:
        def __init__(self):
            self.sent = []

        def set_handler(self, fn): ...

        async def send(self, dst, channel, data):
            self.sent.append((dst, channel, bytes(data)))

    cfg = NodeConfig(device="h", host="h", stages=[list(r) for r in BEFORE], scheduler={"hidden": 576},
                     model_dir=str(ensure_safetensors()), peers=["w1", "w2"], weights_from_peer=True)
    wire = Wire()

    async def go():
        node = Node(cfg, None, wire)
        await node._host_redeal(Redeal("w2", "h", AFTER, 7))  # not the latest re-deal: it loads nothing here
        await asyncio.sleep(0)
    asyncio.run(go())
    (replan,) = [parse_control(d) for dst, ch, d in wire.sent if dst == "w1" and ch == "reply"]
    assert isinstance(replan, Replan)
    assert replan.copy_ranges == {"w1": (5, 10)}  # layers 6-10 from the host; 21-30 from its own disk
