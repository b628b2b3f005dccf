"""``splitroom join``'s handshake, with no IO, no clock and no event loop.

The IO (splitroom/join_cmd.py) hands each control message it receives to one of these
and carries out what they return:

- :class:`Wait` judges the messages a device waits on (the other devices' hellos, the
  host's plan, its bye): only the model host's plan, abort and bye count
  (:func:`from_host`); the host's Abort ends the room (status 2); a needed device lost
  or refused first ends it (status 3); the timeout's error has status 4.
- :class:`HostRound` is the model host's side: it collects every peer's hello, then
  gives one :class:`~runtime.control.Plan` or one :class:`~runtime.control.Abort` for
  all (a second host, or a room that cannot be planned: :func:`plan_room`).

Layer ranges are 0-based half-open here (``[[device, start, end], ...]``); people's
1-based inclusive form is only in the messages (planner.deal.shown_layers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

from planner.deal import shown_layers as shown
from planner.model import BUNDLED_MODEL_ID, lookup
from runtime.control import Abort, Bye, Hello, Plan
from splitroom.join_options import JoinError

log = logging.getLogger("splitroom.join")


def plan_room(hellos: dict[str, dict], host: str, n_layers: int, split: str = "memory", spec=None) -> list[list]:
    """The chain ``[[device, start, end], ...]`` (0-based half-open, host first) from
    every device's hello (the host's own included).

    Explicit ranges must be given by every device and tile ``[0, n_layers)`` with the
    host's first. ``auto`` (every device) deals with :func:`planner.deal.deal` over
    what each lends, the host forced (``DealOptions(host=..., split=split)``); devices
    dealt no layers are left out of the chain; a deal predicted more than 1.2x slower
    than ``split: optimal``'s is logged as one warning line
    (:func:`planner.optimal.slower_than_optimal`). ``spec``: the model's
    :class:`planner.model.ModelSpec` (default: the bundled smollm2-135m from the catalog).

    Raises JoinError (status 2) naming what is wrong.
    """
    autos = sorted(d for d, h in hellos.items() if h.get("layers") is None)
    if autos and len(autos) != len(hellos):
        raise JoinError(f"{', '.join(autos)} said --layers auto and the others gave ranges: "
                        "give every device a range, or every device auto")
    if autos:
        from planner.deal import DealError, deal
        from planner.room import DealOptions, Device
        devices = [Device(id=d, lends_bytes=int(h.get("lends") or 0)) for d, h in sorted(hellos.items())]
        try:
            dl = deal(devices, spec if spec is not None else lookup(BUNDLED_MODEL_ID),
                      DealOptions(host=host, split=split))
        except (DealError, ValueError) as e:
            raise JoinError(f"cannot deal the layers: {e}") from None
        if not dl.fits:
            raise JoinError("the room cannot hold the model in what it lends (--lends): "
                            + "; ".join(dl.notes))
        from planner.optimal import slower_than_optimal
        warning = slower_than_optimal(dl, devices, spec if spec is not None else lookup(BUNDLED_MODEL_ID),
                                      DealOptions(host=host, split=split),
                                      how="join with those --layers ranges instead of auto")
        if warning:
            log.warning("%s", warning)
        chain = [[s.device, s.start, s.end] for s in dl.stages]
        if not chain or chain[0][0] != host:
            raise JoinError(f"the deal does not start at the host {host!r}: {chain}")
        return chain
    chain = sorted(([d, *h["layers"]] for d, h in hellos.items()), key=lambda s: (s[1], s[2]))
    if chain[0][0] != host:
        raise JoinError(f"the host {host!r} must hold the first layers; layer 1 is held by {chain[0][0]!r}")
    expect = 0
    for d, a, b in chain:
        if a != expect:
            what = "overlap" if a < expect else "leave a gap"
            raise JoinError(f"ranges {what} at layer {min(a, expect) + 1}: "
                            + ", ".join(f"{x} {shown(p, q)}" for x, p, q in chain))
        expect = b
    if expect != n_layers:
        raise JoinError(f"ranges end at layer {expect}, the model has {n_layers}: "
                        + ", ".join(f"{x} {shown(p, q)}" for x, p, q in chain))
    return chain



def model_spec(mcfg, model_id: str):
    """The planner's model of the model on disk (``mcfg``, a runtime ModelConfig), at the
    runtime's storage, named ``model_id``."""
    from planner.model import spec_from_architecture
    return spec_from_architecture(model_id, mcfg.name or model_id, mcfg.architecture())



def scheduler_settings(room: str, hellos: dict[str, dict], mcfg, decoding=None, seed: int = 0,
                       model_id: str = BUNDLED_MODEL_ID) -> dict:
    """The room's scheduler settings as JSON, made as every room makes them
    (:meth:`SchedulerConfig.from_scenario` over a scenario of the joined devices with
    ``decoding``, :func:`splitroom.join_options.room_decoding`; the default decoding when None), stopping on
    the model's own eos id (``mcfg.eos_id``) and its other stop ids."""
    from planner.room import DealOptions, Decoding, Device, Scenario
    from planner.scheduler import SchedulerConfig
    from runtime.node import DEFAULT_MAX_CTX
    devices = tuple(Device(id=d, lends_bytes=int(h.get("lends") or 0)) for d, h in sorted(hellos.items()))
    # a joined room has no scenario context: every device holds DEFAULT_MAX_CTX (2,048) positions
    scn = Scenario(name=room, seed=seed, model=model_spec(mcfg, model_id), devices=devices,
                   decoding=decoding or Decoding(), options=DealOptions(context_tokens=DEFAULT_MAX_CTX))
    return SchedulerConfig.from_scenario(scn, eos_token=mcfg.eos_id if mcfg.eos_id >= 0 else None,
                                         stop_tokens=tuple(i for i in mcfg.stop_ids if i >= 0)).to_json()



def from_host(host: Optional[str], src: str, msg) -> bool:
    """Whether ``msg`` (a Plan, Abort or Bye) from ``src`` may be obeyed when ``host`` is
    the model host known so far (None: not known yet): it came from that host, and a
    plan names that host. Anything else is not."""
    if host is None or src != host:
        return False
    return getattr(msg, "host", src) == src


@dataclass(frozen=True)
class Wait:
    """One wait of the handshake: for a control message of a type in ``want``
    (runtime.control classes), described to people as ``what``; a device in ``needed``
    lost or refused first ends it."""

    want: tuple
    what: str
    needed: Sequence[str] = ()

    def check_peers(self, lost: Mapping[str, str], refused: Mapping[str, str]) -> None:
        """Raise JoinError (status 3) when a device in ``needed`` is in ``refused`` (peer ->
        why its hello was refused) or ``lost`` (peer -> why it was lost)."""
        for peer in self.needed:
            if peer in refused:
                raise JoinError(f"refused {peer}: {refused[peer]} (not the device it claims to be, "
                                "or a device given another room key)", 3)
            if peer in lost:
                raise JoinError(f"lost {peer} while waiting for {self.what}: {lost[peer]}", 3)

    def timed_out(self) -> JoinError:
        """The error (status 4) of a wait that reached its deadline."""
        return JoinError(f"timed out waiting for {self.what}", 4)

    def judge(self, src: str, msg, host: Optional[str]) -> bool:
        """Whether ``msg`` from ``src`` is the message waited for, ``host`` being the model
        host known now. A plan, abort or bye from a peer that is not the model host is
        logged and ignored (False); so is a message of a type not waited for (an abort
        received by the host itself among them). Raises JoinError (status 2) when the
        model host aborts the room."""
        if isinstance(msg, (Abort, Bye, Plan)) and not from_host(host, src, msg):
            log.warning("ignored a %s from %s: only the model host (%s) may send one", msg.type, src,
                        host or "not known yet")
            return False
        if isinstance(msg, Abort):
            raise JoinError(f"{src} stopped the room: {msg.reason}", 2)
        if isinstance(msg, self.want):
            return True
        log.info("control message %r from %s ignored while waiting for %s", msg.type, src, self.what)
        return False


class HostRound:
    """The model host's side of one handshake: every peer's hello, then one Plan or one
    Abort for all. ``mine``: the host's own range (0-based half-open; None: ``auto``);
    ``lends``: what it lends, bytes."""

    def __init__(self, device: str, peers: Sequence[str], mine: Optional[tuple[int, int]], lends: int):
        self.device = device
        self.peers = list(peers)
        #: device -> ``{"layers": [start, end] | None, "lends": bytes}``, the host's own first
        self.hellos: dict[str, dict] = {device: {"layers": list(mine) if mine else None, "lends": lends}}

    @property
    def complete(self) -> bool:
        """Whether every peer's hello is in."""
        return len(self.hellos) >= len(self.peers) + 1

    def hello(self, src: str, msg: Hello) -> Optional[Abort]:
        """Take ``src``'s hello; the Abort for every peer when it says ``--host`` too."""
        if msg.host:
            return Abort(reason=f"{src} and {self.device} both say --host")
        self.hellos[src] = {"layers": list(msg.layers) if msg.layers else None, "lends": msg.lends}
        return None

    def outcome(self, room: str, mcfg, split: str, decoding=None, seed: int = 0,
                model_id: str = BUNDLED_MODEL_ID, max_new_tokens: int = 128) -> Union[Plan, Abort]:
        """The Plan for every peer (the chain of :func:`plan_room` over the hellos, the
        :func:`scheduler_settings`), or the Abort naming why the room cannot be planned.
        ``mcfg``: the model's runtime ModelConfig."""
        try:
            chain = plan_room(self.hellos, self.device, mcfg.n_layers, split, model_spec(mcfg, model_id))
            return Plan(host=self.device, stages=chain,
                        scheduler=scheduler_settings(room, self.hellos, mcfg, decoding, seed, model_id),
                        max_new_tokens=max_new_tokens)
        except JoinError as e:
            return Abort(reason=str(e))
