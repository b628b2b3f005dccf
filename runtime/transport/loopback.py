"""An in-process room (tests): the same Transport API, delivery by ``loop.call_soon``."""

from __future__ import annotations

import asyncio
from typing import Optional, Sequence

from .base import Transport, TransportError
from .framing import AIORTC_MAX_MESSAGE_SIZE, DEFAULT_MAX_MESSAGE_BYTES_IN, Reassembler


class LoopbackHub:
    """In-process room: ``hub.transport(device)`` gives a Transport that reaches every
    other device of the hub; messages are delivered with ``loop.call_soon`` (in order,
    never re-entrantly), through the same chunking code as WebRTC with pieces of
    ``max_message_bytes`` (default: aiortc's 256 KiB)."""

    def __init__(self, max_message_bytes: int = AIORTC_MAX_MESSAGE_SIZE,
                 max_message_bytes_in: int = DEFAULT_MAX_MESSAGE_BYTES_IN):
        self.max_message_bytes = max_message_bytes
        self.max_message_bytes_in = max_message_bytes_in
        self._members: dict[str, "LoopbackTransport"] = {}

    def transport(self, device: str, peers: Optional[Sequence[str]] = None) -> "LoopbackTransport":
        """A transport for ``device``; ``peers`` defaults to every device id ever asked
        of this hub (dynamic: later devices become peers too). Raises ValueError for a
        device id already in the hub."""
        if device in self._members:
            raise ValueError(f"device {device!r} already has a transport in this hub")
        t = LoopbackTransport(self, device, peers)
        self._members[device] = t
        return t


class LoopbackTransport(Transport):
    """A Transport inside a LoopbackHub (see there)."""

    def __init__(self, hub: LoopbackHub, device: str, peers: Optional[Sequence[str]]):
        self._hub = hub
        self._fixed_peers = peers is not None
        super().__init__(device, peers or (), hub.max_message_bytes_in)

    @property
    def peers(self) -> tuple[str, ...]:  # type: ignore[override]
        if self._fixed_peers:
            return self._peers
        return tuple(d for d in self._hub._members if d != self.device)

    @peers.setter
    def peers(self, value: tuple[str, ...]) -> None:
        self._peers = tuple(value)

    @property
    def max_message_bytes(self) -> int:
        return self._hub.max_message_bytes

    def _wire_limit(self, dst: str, channel: str) -> int:
        return self._hub.max_message_bytes

    def _on_wire(self, src: str, channel: str, wire: bytes | str) -> None:
        if (src, channel) not in self._reasm:
            self._reasm[(src, channel)] = Reassembler(self.max_message_bytes_in)
        super()._on_wire(src, channel, wire)

    async def _send_wires(self, dst: str, channel: str, wires: list[bytes]) -> None:
        peer = self._hub._members.get(dst)
        if peer is None or peer._closed:
            raise TransportError(f"{self.device}: peer {dst!r} is not connected")
        loop = asyncio.get_running_loop()
        for w in wires:
            loop.call_soon(peer._on_wire, self.device, channel, bytes(w))

    async def close(self) -> None:
        self._closed = True
        if self._hub._members.get(self.device) is self:
            del self._hub._members[self.device]

