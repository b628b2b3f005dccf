"""A room device's re-deal: loading a re-dealt range (from the model directory, or copied
from a peer as runtime.weights_share's copy plan says), the model host's Replan to the
new chain and its wait for every device's Ready, and a worker's answer to a Replan.

:class:`NodeRedeal` is mixed into :class:`runtime.room.Node`, whose ``__init__`` sets
the state these methods use (``awaiting``, ``_redeal_lock``, ``_deal_before``, the work
queue, the liveness timers). The chain's re-deal rule and copy plan are planner.chain's;
this is their IO.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from planner.chain import CopyPlan, copy_plan, relink_neighbours
from planner.deal import Stage as DealStage, shown_layers
from planner.protocol import ChainReady, DeviceLost, Redeal, RollbackKV, WeightsCopied

from .backends.base import Stage
from .control import Loading, Progress, Ready, Replan, Unreachable, encode_control
from .room_liveness import REPLY

log = logging.getLogger("splitroom.room")

#: Seconds one meeting at the relay may take when a device dealt back and a neighbour of
#: it make a new connection (:meth:`Node._relink`): both sides go to the relay as the
#: Replan arrives, so this bounds a neighbour that never comes (chosen, not measured; it
#: stays under REDEAL_LOAD_TIMEOUT_S, during which the host spares a device re-dealing).
RELINK_WAIT_S = 20.0


class NodeRedeal:
    """The re-deal of :class:`runtime.room.Node` (see module doc)."""

    def _unreachable(self, src: str, msg: Unreachable) -> None:
        """Worker ``src`` could not make a new connection to ``msg.device`` after the
        re-deal of ``msg.first_lap``, which took a device back: the host loses that device
        (the one it took back; ``msg.device`` when the latest re-deal took back neither)
        and re-deals without it. A report about an older re-deal is ignored."""
        if msg.first_lap != self._latest_redeal:
            return
        back = self._latest_back
        who = back if back in (src, msg.device) else msg.device
        self._on_lost(who, f"dealt back, but {src} could not connect to {msg.device} through the relay: {msg.reason}")

    def _load(self, start: int, end: int, model_dir: str | None = None) -> Stage:
        from .backends import StageSpec, make_stage
        return make_stage(self.cfg.backend, model_dir or self.cfg.model_dir, StageSpec(start, end, host=self.is_host),
                          max_ctx=getattr(self.stage, "max_ctx", 2048), precision=self.cfg.precision())

    def _manifest_sha(self, start: int, end: int) -> str:
        from .weights_share import make_manifest, manifest_sha256
        return manifest_sha256(make_manifest(self.cfg.model_dir, start, end, False, False, blocks=self._blocks))

    @property
    def _blocks(self) -> bool:
        """Whether this room holds the GGUF's blocks as stored (``weights: gguf``): then peer
        copies carry those blocks (runtime.weights_share, ``blocks``), not float32."""
        return self.cfg.weights == "gguf"

    async def _take_range(self, stages, first_lap: int, manifest_sha: str | None = None,
                          copy_range: tuple[int, int] | None = None) -> None:
        """Forget the old chain's work and residuals; load this device's new range (from
        the model directory, in the compute thread, after the compute already queued;
        or, with ``manifest_sha``, the layers ``copy_range`` (default: the whole new
        range) copied from the host over the weights channel first, every byte checked
        against that manifest hash, the rest read from this device's disk)."""
        keep = [c for c in _drain(self.work) if getattr(c, "lap_id", first_lap) >= first_lap
                and type(c) is not RollbackKV]
        for c in keep:
            self.work.put_nowait(c)
        self.residual = {lap: x for lap, x in self.residual.items() if lap >= first_lap}
        mine = [(a, b) for d, a, b in stages if d == self.cfg.device]
        a, b = mine[0] if mine else (0, 0)
        if (mine or self.is_host) and self.stage is not None and (self.stage.start, self.stage.end) != (a, b):
            self.loading = True  # quiet is expected now: no peer is declared lost by silence
            try:
                await self._load_range(a, b, manifest_sha, copy_range or (a, b), first_lap)
            finally:
                self.loading = False
                self.liveness.refresh_all(time.monotonic())  # a fresh start for every peer's silence

    def _progress(self, what: str) -> Callable[[int, int], None]:
        """A fetch_range progress callback logging ``what`` at every quarter and telling
        the model host each whole percent (:class:`runtime.control.Progress`)."""
        t0 = time.perf_counter()
        shown = [0]
        told = [-1]

        def report(done: int, total: int) -> None:
            percent = min(100, 100 * done // max(total, 1))
            if percent > told[0] and not self.is_host:
                told[0] = percent
                asyncio.ensure_future(self._send(self.cfg.host, REPLY, encode_control(Progress(percent=percent))))
            quarter = 4 * done // max(total, 1)
            if quarter > shown[0]:
                shown[0] = quarter
                dt = max(time.perf_counter() - t0, 1e-9)
                log.warning("%s: %s: %d%% (%.1f of %.1f MB, %.1f MB/s)", self.cfg.device, what,
                            100 * done // max(total, 1), done / 1e6, total / 1e6, done / 1e6 / dt)
        return report

    async def _load_range(self, a: int, b: int, manifest_sha: str | None, copy_range: tuple[int, int],
                          first_lap: int) -> None:
        """Load layers ``[a, b)`` as this device's stage: from the model directory, or
        with ``manifest_sha`` the layers ``copy_range`` copied from the host first (the
        copy's progress logged by quarters) and the rest from the model directory; a
        copy that fails (a sha256 check, the connection) is logged and the whole range
        read from the model directory. Records WeightsCopied in the trace. Raises
        OSError/WeightsError when the model directory cannot give the range."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        planned = self._planned(a, b)  # from the range held before this load
        src = None
        ga, gb = copy_range
        if manifest_sha is not None:
            import tempfile

            from .weights_share import fetch_range
            src = tempfile.mkdtemp(prefix=f"splitroom-{self.cfg.device}-layers-")
            what = f"copying {shown_layers(ga, gb, words=True)} from {self.cfg.host}"
            log.warning("%s: %s", self.cfg.device, what)
            try:
                await fetch_range(self.transport, self.cfg.host, ga, gb, False, False, src, manifest_sha,
                                  progress=self._progress(what))
                log.warning("%s: %s copied and verified in %.2f s", self.cfg.device,
                            shown_layers(ga, gb, words=True), time.perf_counter() - t0)
            except Exception as e:  # WeightsError (a check failed), TransportError: this device's disk then
                log.warning("%s: the copy from %s failed (%s: %s); reading %s from this device's disk",
                            self.cfg.device, self.cfg.host, type(e).__name__, e, shown_layers(ga, gb, words=True))
                import shutil
                shutil.rmtree(src, ignore_errors=True)
                src = None
        try:
            self.stage = await loop.run_in_executor(self._pool, self._build_stage, a, b, src, ga, gb)
        finally:
            if src is not None:  # the stage holds the tensors in memory now
                import shutil
                shutil.rmtree(src, ignore_errors=True)
        from .weights_share import range_nbytes
        seconds = time.perf_counter() - t0
        if src is not None:  # the copied range, then what the plan reads from this device's disk
            got = [(self.cfg.host, ga, gb)] + [("disk", da, db) for da, db in planned.disk]
        else:  # its whole new range rebuilt from this device's disk
            got = [("disk", a, b)]
        md = self.cfg.model_dir
        for source, ra, rb in got:  # bytes as stored, the sizes the manifest gives them
            self.trace.append((self.clock(), WeightsCopied(self.cfg.device, first_lap, source, ra, rb,
                                                           range_nbytes(md, ra, rb, self._blocks), seconds)))

    def _planned(self, a: int, b: int) -> CopyPlan:
        """This device's part of the re-deal's copy plan (planner.chain.copy_plan) for its
        new range ``[a, b)``, from the range its stage holds now."""
        held = [(self.cfg.device, self.stage.start, self.stage.end)] if self.stage is not None else []
        me = self.cfg.device
        return copy_plan(held, [(me, a, b)], self.cfg.host).get(me, CopyPlan(me, None, ()))

    def _build_stage(self, a: int, b: int, copied: str | None, ga: int, gb: int) -> Stage:
        """This device's stage for ``[a, b)``: layers ``[ga, gb)`` from the directory
        ``copied`` (a peer's verified copy) when given, every other layer from the model
        directory."""
        if copied is None:
            return self._load(a, b)
        from .backends import StageSpec, make_stage
        from .weights import load_range, load_range_native
        # weights gguf: the GGUF's blocks, from the copy's blocks file and this device's GGUF
        read = load_range_native if self._blocks else load_range
        md, host = self.cfg.model_dir, self.is_host
        w: dict = read(md, 0, 0, host, host)  # the host's embedding and head (none for a worker)
        if a < ga:
            w.update(read(md, a, ga, False, False))
        w.update(read(copied, ga, gb, False, False))
        if gb < b:
            w.update(read(md, gb, b, False, False))
        return make_stage(self.cfg.backend, md, StageSpec(a, b, host=host),
                          max_ctx=getattr(self.stage, "max_ctx", 2048), precision=self.cfg.precision(), weights=w)

    def _start_grace(self) -> None:
        """A re-deal began: silence is no loss for REDEAL_GRACE_S, and a device loading
        its new range is spared for REDEAL_LOAD_TIMEOUT_S; on the model host, only the
        devices that answered the Replan (Loading) are spared, so a second device lost
        meanwhile folds into the re-deal under way (planner.liveness)."""
        self.liveness.replanned(time.monotonic(), answers=self.is_host)

    async def _host_redeal(self, r: Redeal) -> None:
        """Carry out the host's Redeal ``r``: tell the new chain (Replan, sent without
        waiting: a send to a peer that is gone may block), load this device's new range,
        then count itself Ready. Re-deals load one after another, and one superseded by a
        later Redeal (a second device lost meanwhile) loads nothing: only the latest
        chain's range may end up in this device's stage."""
        self._start_grace()
        self.deal = self.chain.deal
        others = [d for d, _, _ in r.stages if d != self.cfg.device]
        plan = copy_plan([(s.device, s.start, s.end) for s in self._deal_before], r.stages, self.cfg.host)
        self._deal_before = tuple(DealStage(d, a, b) for d, a, b in r.stages)
        manifests, copies = {}, {}
        if self.cfg.weights_from_peer:  # the workers that gained layers copy them from here, as planned
            loop = asyncio.get_running_loop()
            for d, p in plan.items():
                if p.wire is not None:
                    copies[d] = p.wire
                    manifests[d] = await loop.run_in_executor(None, self._manifest_sha, *p.wire)
        sigs = {}
        if self.cfg.room_key:
            from .control import manifest_signature
            sigs = {d: manifest_signature(self.cfg.room_key, d, *copies[d], sha) for d, sha in manifests.items()}
        msg = encode_control(Replan(lost=r.lost or None, back=r.back, host=r.host, stages=r.stages, first_lap=r.first_lap,
                                    manifests=manifests, copy_ranges=copies, signatures=sigs))
        for d in others:
            self._tasks.append(asyncio.ensure_future(self._send(d, REPLY, msg)))
        async with self._redeal_lock:
            if r.first_lap != self._latest_redeal:
                return  # superseded: the later re-deal loads its own range
            try:
                await self._take_range(r.stages, r.first_lap)
            except Exception as e:  # the weights cannot be loaded here: nothing can be answered
                log.error("%s: cannot load the re-dealt range: %s", self.cfg.device, e)
                self.handle(DeviceLost(self.cfg.device, f"the model host cannot load its re-dealt range: {e}"))
                return
        self._ready(self.cfg.device, r.first_lap)

    async def _replan(self, msg: Replan) -> None:
        if msg.first_lap < self._latest_redeal:
            return  # an older plan than one already taken
        self._latest_redeal = msg.first_lap
        self._start_grace()
        for d, _, _ in msg.stages:  # a device the host took back: a peer of this one again
            if d in self.lost_peers:
                self.lost_peers.discard(d)
                self.liveness.revive(d, time.monotonic())
                if hasattr(self.transport, "revive"):
                    self.transport.revive(d)
        if any(d == self.cfg.device for d, _, _ in msg.stages):  # before loading: the host spares it then
            self._tasks.append(asyncio.ensure_future(
                self._send(self.cfg.host, REPLY, encode_control(Loading(first_lap=msg.first_lap)))))
        deal = msg.deal()
        self.chain.adopt(deal, msg.first_lap)
        self.deal = deal
        relink = asyncio.ensure_future(self._relink(msg))  # at the relay while this device loads
        self._tasks.append(relink)
        async with self._redeal_lock:  # one load at a time; a later Replan supersedes this one
            if msg.first_lap != self._latest_redeal:
                return
            sha = msg.manifests.get(self.cfg.device)
            if sha is not None and self.cfg.room_key:
                from .control import check_manifest_signature
                rng = msg.copy_ranges.get(self.cfg.device)  # the host signs a manifest with its copy range
                if rng is None or not check_manifest_signature(self.cfg.room_key, self.cfg.device, *rng, sha,
                                                               msg.signatures.get(self.cfg.device, "")):
                    log.warning("%s: the manifest hash in the Replan is not signed with the room key; "
                                "reading the layers from this device's disk instead", self.cfg.device)
                    sha = None
            try:
                await self._take_range(msg.stages, msg.first_lap, sha, msg.copy_ranges.get(self.cfg.device))
            except Exception as e:  # say nothing: the host notices this device is missing
                log.error("%s: cannot load the re-dealt range: %s", self.cfg.device, e)
                return
        if not await relink:  # told the host it cannot reach a neighbour: no Ready
            return
        if msg.first_lap == self._latest_redeal and any(d == self.cfg.device for d, _, _ in msg.stages):
            await self._send(self.cfg.host, REPLY, encode_control(Ready(first_lap=msg.first_lap)))

    async def _relink(self, msg: Replan) -> bool:
        """After a Replan that dealt ``msg.back`` back, while the range loads and before
        Ready: that device and each worker neighbour of it in the new chain
        (:func:`planner.chain.relink_neighbours`) make a new connection through the relay
        (``transport.reconnect``), one meeting at a time per device (``_meet_lock``), the
        device dealt back offering to each neighbour in chain order and each neighbour
        waiting for its offer (so no offer reaches a relay socket of the device that is
        meeting someone else). Its old link may be dead while both sides still read it
        "connected". A meeting that fails within :data:`RELINK_WAIT_S` is reported to
        the host (Unreachable); returns whether this device may say Ready (True when it
        has no one to meet). Re-dealt weights come from the host, never over these links."""
        from .transport import TransportError
        back, me = msg.back, self.cfg.device
        if back is None or self.is_host or not hasattr(self.transport, "reconnect"):
            return True
        near = relink_neighbours(msg.host, [d for d, _, _ in msg.stages], back, self.sched_cfg.return_path)
        meet = [(p, True) for p in near] if me == back else [(back, False)] if me in near else []
        for peer, offer in meet:
            try:
                async with self._meet_lock:
                    await self.transport.reconnect(peer, RELINK_WAIT_S, offer=offer)
            except (TransportError, OSError, ValueError) as e:
                log.warning("%s: no new connection to %s through the relay after %s was dealt back: %s",
                            me, peer, back, e)
                await self._send(self.cfg.host, REPLY, encode_control(
                    Unreachable(first_lap=msg.first_lap, device=peer, reason=str(e)[:300])))
                return False
            if peer in self.lost_peers:  # a send on the old connection may have failed meanwhile
                self.lost_peers.discard(peer)
                self.liveness.revive(peer, time.monotonic())
            if hasattr(self.transport, "revive"):
                self.transport.revive(peer)
            log.warning("%s: a new connection to %s through the relay (%s was dealt back)", me, peer, back)
        return True

    def _ready(self, device: str, first_lap: int) -> None:
        waiting = self.awaiting.get(first_lap)
        if waiting is None:
            return
        waiting.discard(device)
        self.liveness.refresh(device, time.monotonic())  # its silence is counted again from now
        if not waiting:
            del self.awaiting[first_lap]
            self.handle(ChainReady(first_lap))

    @property
    def loading(self) -> bool:
        """True while this device loads a re-dealt range (silence is no loss then)."""
        return self.liveness.loading

    @loading.setter
    def loading(self, value: bool) -> None:
        self.liveness.loading = value


def _drain(q: asyncio.Queue) -> list:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out
