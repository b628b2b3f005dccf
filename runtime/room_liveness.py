"""A room device's liveness: the heartbeats it sends and reads, what they carry (each peer's
clock offset, the frame stamps the model host pairs into hop times), a peer lost by
silence or by its connection, and a lost peer coming back (its hello, a new connection
through the relay).

:class:`NodeLiveness` is mixed into :class:`runtime.room.Node`, whose ``__init__`` sets
the state these methods use (``liveness``: the sans-IO timers of planner.liveness;
``clocks``, ``lost_peers``, the heartbeat and stamp records). The timers' rules and
durations are planner.liveness's; this is their IO.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from planner.hops import PeerClock
from planner.liveness import LOADING, LOADING_SILENT, READY, STALLED, UNANSWERED
from planner.protocol import DeviceBack, DeviceLost

from .control import ControlError, Heartbeat, Hello, Stamps, encode_control, parse_control

log = logging.getLogger("splitroom.room")

#: the control channel: heartbeats, hellos, re-deal messages, crashes (runtime.control)
REPLY = "reply"
#: After a Replan, seconds during which no device is declared lost by silence: every
#: device of the new chain may be loading weights then, its event loop starved of the
#: CPU (the transport still reports a connection that fails).
REDEAL_GRACE_S = 10.0
#: After a Replan, seconds during which a device still loading its re-dealt range (not
#: Ready yet) is not declared lost by silence; after that a silent one is lost like any
#: other (a device that died during a re-deal must not stall the room for good).
REDEAL_LOAD_TIMEOUT_S = 30.0
#: a peer's heartbeat is echoed (planner/hops.py's exchange) only within this many seconds of its arrival
ECHO_HELD_MAX_S = 60.0


class NodeLiveness:
    """The heartbeats and losses of :class:`runtime.room.Node` (see module doc)."""

    def _from_lost(self, src: str, channel: str, data: bytes) -> None:
        """A message from ``src``, lost and out of the chain: on the model host its Hello
        starts its rejoin (planner.liveness: heard steadily for the rejoin hold, it is
        back: :meth:`_back`), and while it comes back what it sends keeps it heard;
        anything else from it is ignored."""
        if not self.is_host:
            return
        now = time.monotonic()
        if channel == REPLY and not self.liveness.coming_back(src):
            try:
                msg = parse_control(data)
            except ControlError:
                return
            if isinstance(msg, Hello) and msg.device == src:
                log.warning("%s: %s said hello again; taking it back once heard for the rejoin hold",
                            self.cfg.device, src)
                self.liveness.returned(src, now)
            return
        if self.liveness.coming_back(src):
            self.liveness.heard(src, now)

    def _back(self, peer: str) -> None:
        """``peer``, lost, has been heard for its rejoin hold: it is a member again
        (DeviceBack; the host's rejoin rule may re-deal it back into the chain)."""
        self.lost_peers.discard(peer)
        if hasattr(self.transport, "revive"):
            self.transport.revive(peer)
        log.warning("%s: %s is back", self.cfg.device, peer)
        self.handle(DeviceBack(peer, "said hello again"))

    def _heartbeat(self, src: str, msg: Heartbeat) -> None:
        """Being heard is what a heartbeat says; its times (when it has them) are one
        leg of NTP's exchange: ``src``'s clock offset (planner/hops.py), taken only when
        its echo is the time of one of the latest heartbeats this device sent it."""
        if msg.sent_s is None or src not in self.cfg.peers:
            return
        now = self.stamp_clock()
        self._beat_in[src] = (msg.sent_s, now)
        if msg.echo_s is not None and msg.held_s is not None and msg.echo_s in self._beat_out.get(src, ()):
            self.clocks.setdefault(src, PeerClock()).heard(msg.sent_s, msg.echo_s, msg.held_s, now)

    def _stamps(self, src: str, msg: Stamps) -> None:
        """The model host pairs a worker's stamps with the other ends' (planner/hops.py);
        a stamp naming a device not in the chain, or ``src`` itself, is not kept."""
        chain = {s.device for s in self.deal.stages} | {self.cfg.host}
        if src not in chain:
            return
        for lap, peer, t in msg.arrived:
            if peer in chain and peer != src:
                self._hop(self.hops.arrived(peer, src, lap, t))
        for lap, peer, t in msg.sent:
            if peer in chain and peer != src:
                self._hop(self.hops.sent(src, peer, lap, t))

    def _hop(self, hop) -> None:
        """A hop and the workers' lap times the host's meter paired: to the room's
        measured speeds (planner.hops.StageSpeeds: the rejoin rule's) and the observers."""
        speeds = self.chain.speeds
        if hop is not None:
            speeds.hop(hop)
            self._notify(hop)
        for st in self.hops.take_stages():  # a worker's stamps of one lap: its time with it
            speeds.timed(st)
            self._notify(st)

    def _stamp(self, src: str, dst: str, lap_id: int) -> None:
        """This device sent (``src`` is this device) or had (``dst`` is) lap ``lap_id``'s
        frame now: the model host pairs it at once, a worker sends it with its next
        heartbeat (:class:`runtime.control.Stamps`)."""
        t = self.stamp_clock()
        me = self.cfg.device
        if self.hops is not None:
            self._hop(self.hops.sent(src, dst, lap_id, t) if src == me else self.hops.arrived(src, dst, lap_id, t))
        elif src == me:
            self._stamps_sent.append((lap_id, dst, t))
        else:
            self._stamps_arrived.append((lap_id, src, t))

    def _on_lost(self, peer: str, reason: str, silent_since_s: float | None = None) -> None:
        """A peer is gone (its connection failed or it fell silent): the scheduler hears
        DeviceLost once (the host re-deals and replays, or refuses what it cannot answer
        and stops); a worker that lost the model host sets :attr:`lost_host` (its device
        loop then ends with a clear status)."""
        if peer in self.lost_peers:
            return
        if self._stopped:  # the room is ending: peers closing their connections are no loss
            log.info("%s: %s closed after the room ended: %s", self.cfg.device, peer, reason)
            return
        self.lost_peers.add(peer)
        self.liveness.forget(peer, time.monotonic())
        log.warning("%s: lost %s: %s", self.cfg.device, peer, reason)
        if peer == self.cfg.host and not self.is_host:
            self.lost_host.set()
        self.handle(DeviceLost(peer, reason, silent_since_s))
        for first in list(self.awaiting):  # a device that was to load a re-dealt range is not coming
            self._ready(peer, first)
        if self.is_host and self.cfg.recover and hasattr(self.transport, "reconnect"):
            self._tasks.append(asyncio.ensure_future(self._meet_again(peer)))

    async def _meet_again(self, peer: str) -> None:
        """The model host lost worker ``peer``: after ``rejoin_live_s`` (a worker whose
        connection still carries messages says hello over it first), meet it at the relay
        for a new connection (``transport.reconnect``: it asks the relay too, having lost
        this host), one lost worker at a time (the relay seats one connection per device),
        for at most ``host_wait_s`` (as long as the worker waits for this host). Over the
        new connection the worker says hello again (:meth:`_from_lost`); nothing more
        here. Gives up quietly when the room stops, the worker is back, or the wait ends."""
        from .transport import TransportError
        await asyncio.sleep(self.cfg.rejoin_live_s)
        end = time.monotonic() + self.cfg.host_wait_s

        def waiting() -> bool:
            return not self._stopped and peer in self.lost_peers and not self.liveness.coming_back(peer)
        while waiting():
            left = end - time.monotonic()
            if left <= 0:
                log.info("%s: %s did not come back through the relay within %g s", self.cfg.device, peer,
                         self.cfg.host_wait_s)
                return
            async with self._meet_lock:
                if not waiting():
                    return
                try:
                    await self.transport.reconnect(peer, left)
                except (TransportError, OSError, ValueError) as e:
                    log.info("%s: meeting %s at the relay: %s", self.cfg.device, peer, e)
                    failed = True
                else:
                    failed = False
            if not failed:
                log.warning("%s: a new connection to %s through the relay: waiting for its hello", self.cfg.device,
                            peer)
                return
            await asyncio.sleep(1.0)

    async def _heartbeats(self) -> None:
        """Run the liveness timers (:class:`planner.liveness.Liveness`): at each deadline,
        declare lost a peer silent too long and tell every other peer this device is here
        (with the times of NTP's exchange; a worker sends the host its stamps after it)."""
        live = self.liveness
        while True:
            deadline = live.next_deadline_s()
            if deadline is None:
                return
            await asyncio.sleep(max(deadline - time.monotonic(), 0.0))
            now = time.monotonic()
            tick = live.handle_timer(now, {d for waiting in self.awaiting.values() for d in waiting})
            for p, silent_s, rule in tick.lost:
                self._on_lost(p, lost_reason(silent_s, rule, live.stall_s), self.clock() - silent_s)
            for p in tick.back:
                self._back(p)
            for p in tick.beat:
                for msg in self._beat_for(p):
                    asyncio.ensure_future(self._send(p, REPLY, msg))

    def _beat_for(self, peer: str) -> list[bytes]:
        """The heartbeat to ``peer`` now (sent_s, and the echo of ``peer``'s last one
        with the time it was held: planner/hops.py), then, to the model host, the
        stamps gathered since the last one."""
        now = self.stamp_clock()
        last = self._beat_in.get(peer)
        if last is not None and not 0 <= now - last[1] <= ECHO_HELD_MAX_S:
            last = None  # held too long to time a round trip by: no echo
        beat = Heartbeat(sent_s=now, echo_s=last[0] if last else None, held_s=now - last[1] if last else None)
        self._beat_out.setdefault(peer, collections.deque(maxlen=16)).append(now)
        out = [encode_control(beat)]
        if peer == self.cfg.host and not self.is_host and (self._stamps_arrived or self._stamps_sent):
            out.append(encode_control(Stamps(arrived=tuple(self._stamps_arrived), sent=tuple(self._stamps_sent))))
            self._stamps_arrived.clear()
            self._stamps_sent.clear()
        return out


def lost_reason(silent_s: float, rule: str, stall_s: float | None = None) -> str:
    """The DeviceLost reason for a peer silent ``silent_s`` seconds, lost by ``rule``
    (planner.liveness: SILENT, UNANSWERED, READY, LOADING_SILENT, LOADING, STALLED): the rule is
    named, so a reader (and a test) tells a loss folded into a re-deal from one at the
    load window's end. ``stall_s``: the seconds without progress of rule STALLED
    (named in its reason when given)."""
    why = f"no heartbeat for {silent_s:.1f} s"
    if rule == UNANSWERED:
        return f"{why}, and no answer to the re-deal under way"
    if rule == READY:
        return f"{why}, after it had loaded its re-dealt range"
    if rule == LOADING_SILENT:
        return f"{why} while loading its re-dealt range (a device that loads still sends heartbeats)"
    if rule == LOADING:
        return f"{why}, still loading its re-dealt range after {REDEAL_LOAD_TIMEOUT_S:g} s"
    if rule == STALLED:
        quiet = f" for {stall_s:g} s" if stall_s is not None else ""
        return f"{why}, past the load window, and its copy of the re-dealt layers made no progress{quiet}"
    return why
