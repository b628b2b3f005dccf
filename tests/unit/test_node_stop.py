"""A stopped model host leaves nothing behind on its transport: the weights server it
starts for re-deal copies (runtime.weights_share.serve_weights) is closed by Node.stop,
so a later request on the weights channel is no longer its to answer and its weight
files are closed."""

from __future__ import annotations

import asyncio

from runtime.control import NodeConfig
from runtime.room import Node
from runtime.transport.base import Transport
from runtime.weights import ensure_safetensors
from runtime.weights_share.wire import CHANNEL


class _Wire(Transport):
    """The room transport's receiving side; sends are kept, not delivered."""

    def __init__(self):
        super().__init__("h", ("w1",), 0)
        self.sent = []

    async def send(self, dst, channel, data):
        self.sent.append((dst, channel, bytes(data)))


def test_stop_closes_the_hosts_weights_server():
    cfg = NodeConfig(device="h", host="h", stages=[["h", 0, 10], ["w1", 10, 30]], scheduler={"hidden": 576},
                     model_dir=str(ensure_safetensors()), peers=["w1"], weights_from_peer=True,
                     recover=True, heartbeat_s=0)
    wire = _Wire()

    async def go():
        node = Node(cfg, None, wire)
        node.start()
        server = node._weights_server
        live = [s for s in wire._subs[CHANNEL] if s.active]
        await node.stop()
        return server, live, [s for s in wire._subs[CHANNEL] if s.active]

    server, live_before, live_after = asyncio.run(go())
    assert server is not None and len(live_before) == 1  # the host serves copies while it runs
    assert live_after == []  # and nothing after stop
    assert server.tf.mm.closed  # its weight file is unmapped
