"""``splitroom join``'s options, checked: every option is read, and a bad one refused in
one line (:class:`JoinError`, exit status 2), before anything connects.

:func:`check_options` takes the parsed :class:`JoinOptions` to a :class:`JoinSetup`
(the relay, the room and its key, the peers, the ICE servers, the model on disk, this
device's range and what it lends, the host's decoding and question queue).
Layers are written 1-based and inclusive (:func:`parse_layers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence
from urllib.parse import urlsplit

from planner.deal import LayerRangeError, parse_layers as parse_range
from planner.model import BUNDLED_MODEL_ID
from planner.room import RUNTIME_DRAFTERS


class JoinError(RuntimeError):
    """The device cannot take part: bad arguments (status 2), no room (3), a timeout (4),
    the model host lost (5)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status



def parse_room_url(url: str) -> tuple[str, str]:
    """``ws://HOST:PORT/room/NAME`` -> (``ws://HOST:PORT``, ``NAME``).

    Raises JoinError (status 2) for any other form.
    """
    u = urlsplit(url)
    parts = [p for p in u.path.split("/") if p]
    if u.scheme not in ("ws", "wss") or not u.netloc or len(parts) != 2 or parts[0] != "room":
        raise JoinError(f"room URL {url!r} must look like ws://HOST:PORT/room/NAME "
                        "(the address `splitroom relay` prints)")
    return f"{u.scheme}://{u.netloc}", parts[1]


def parse_room_key(url: str) -> Optional[str]:
    """The room key of a room URL ``ws://HOST:PORT/room/NAME?key=KEY`` (None without
    one). The key never reaches the relay: it keys the devices' proofs of identity, and the
    relay seats them by a tag and signature made from it (:func:`runtime.relay.relay_hello`).

    Raises JoinError (status 2) for a key that is not 16-128 letters, digits, ``-`` or ``_``."""
    from urllib.parse import parse_qs
    keys = parse_qs(urlsplit(url).query).get("key")
    if not keys:
        return None
    key = keys[-1]
    if not (16 <= len(key) <= 128) or not all(c.isascii() and (c.isalnum() or c in "-_") for c in key):
        raise JoinError("the room URL's key must be 16-128 letters, digits, '-' or '_' "
                        "(as `splitroom relay` prints it)")
    return key


def parse_layers(text: Optional[str], n_layers: int) -> Optional[tuple[int, int]]:
    """``--layers`` as people write it, 1-based inclusive ``A-B`` (``1-15`` is the first
    fifteen layers), -> 0-based half-open ``(A - 1, B)``; ``auto`` (or None) -> None.

    Raises JoinError (status 2) when malformed or outside ``1-n_layers``.
    """
    if text is None or text.strip().lower() == "auto":
        return None
    try:
        return parse_range(text, n_layers)
    except LayerRangeError as e:
        if e.malformed:
            raise JoinError(f"--layers {text!r}: write A-B, 1-based and inclusive (e.g. 1-15), or auto") from None
        raise JoinError(f"--layers {text!r}: need 1 <= A <= B <= {n_layers} (1-based, inclusive)") from None


def parse_lends(text: Optional[str]) -> int:
    """``--lends`` (``4 GiB``, ``512MB``) -> bytes; None -> 0 (unknown).

    Raises JoinError (status 2) when it is not a size.
    """
    if text is None:
        return 0
    from splitroom.units import QuantityError, parse
    t = text.strip()
    if t and t[-1:].isalpha() and not any(c == " " for c in t):  # "4GiB" -> "4 GiB"
        i = next(i for i, c in enumerate(t) if c.isalpha())
        t = f"{t[:i]} {t[i:]}"
    try:
        return int(parse(t, "size"))
    except QuantityError as e:
        raise JoinError(f"--lends {text!r}: {e}") from None



def room_decoding(opts: "JoinOptions"):
    """The host's decoding settings: the ``decoding:`` section of ``opts.scenario`` (the
    default one without), then ``--draft-tokens`` / ``--drafter`` and the sampling flags
    over it. A sampled room without a seed (flag, ``decoding.sampling.seed``) takes the
    scenario's ``seed``, or a fresh one without a scenario. Returns
    ``(planner.room.Decoding, seed)``.

    Raises JoinError (status 2): an unreadable scenario, a drafter real rooms do not
    have, a value out of range (naming the flag)."""
    from dataclasses import replace

    from planner.room import Decoding, Speculative
    from planner.sampling import MAX_SEED, Sampling
    dec, seed = Decoding(), None
    if opts.scenario:
        from splitroom.scenario import ScenarioError, load
        try:
            scn = load(opts.scenario)
        except (ScenarioError, OSError) as e:
            raise JoinError(f"--scenario: {e}") from None
        dec, seed = scn.decoding, scn.seed
    spec = dec.speculative
    if opts.draft_tokens is not None:
        if not 0 <= opts.draft_tokens <= 64:
            raise JoinError(f"--draft-tokens {opts.draft_tokens}: expected 0 (off) to 64")
        spec = None if opts.draft_tokens == 0 else replace(spec or Speculative(drafter="ngram"),
                                                           draft_tokens=opts.draft_tokens)
    if opts.drafter is not None and spec is not None:
        spec = replace(spec, drafter=opts.drafter)
    if spec is not None and spec.drafter not in RUNTIME_DRAFTERS:
        raise JoinError(f"drafter {spec.drafter!r} is not available in real rooms; use ngram, early_exit or model")
    s = dec.sampling
    given = {k: v for k, v in (("temperature", opts.temperature), ("top_p", opts.top_p), ("top_k", opts.top_k),
                               ("seed", opts.seed)) if v is not None}
    try:
        s = Sampling(**(s.to_json() | given))
    except ValueError as e:
        raise JoinError(f"--{str(e).split(' ', 1)[0].replace('_', '-')}: {e}") from None
    if not s.greedy and s.seed is None:
        import secrets
        s = s.with_seed(seed if seed is not None else secrets.randbelow(MAX_SEED + 1))
    return replace(dec, speculative=spec, sampling=s), seed or 0



@dataclass
class JoinOptions:
    """``splitroom join``'s arguments, parsed (the CLI's; :func:`check_options` checks them)."""

    room_url: str
    device: str
    layers: Optional[str] = None
    lends: Optional[str] = None
    host: bool = False
    peers: Sequence[str] = ()
    asks: Sequence[str] = ()
    max_new_tokens: int = 128
    backend: str = "numpy"
    addresses: Sequence[str] = ()
    #: STUN/TURN server URLs (runtime/transport/ice.py; none: no server is contacted)
    ice_servers: Sequence[str] = ()
    #: offer and accept only TURN relay candidates
    ice_relay_only: bool = False
    #: ask the relay for its STUN/TURN servers (``splitroom relay --turn-url``)
    ice_from_relay: bool = False
    #: a peer silent this long is lost, seconds (the room's heartbeat rule)
    heartbeat_timeout_s: float = 1.0
    timeout_s: float = 600.0
    split: str = "memory"
    answers_json: Optional[str] = None
    model_dir: Optional[str] = None
    #: a GGUF file or safetensors directory (None: the bundled SmolLM2); every device of
    #: the room must give the same model
    model: Optional[str] = None
    answers: list = field(default_factory=list)
    #: the host serves the OpenAI-compatible API on this TCP port (runtime/serve/) and
    #: takes questions from it until Ctrl-C instead of asking ``asks``
    serve_port: Optional[int] = None
    serve_bind: str = "127.0.0.1"
    #: a worker that loses the model host waits this long for it to come back, seconds
    host_wait_s: float = 60.0
    #: seconds a lost peer is waited for on the live connection before a new one is
    #: made through the relay (runtime.control.REJOIN_LIVE_S; 0: at once)
    rejoin_live_s: float = 10.0
    #: this device's compute padded to this many times its time (runtime.node's
    #: ``slowdown``, a scenario's ``emulate: {slowdown}``): one machine playing a slower one
    slowdown: float = 1.0
    #: the host's question queue on disk (splitroom/host_queue.py): questions a host
    #: that died never ended are asked first when it comes back with the same file
    queue_file: Optional[str] = None
    #: the host's decoding (:func:`room_decoding`): a scenario's ``decoding:`` section,
    #: speculation and sampling flags over it (None: as the scenario, or the default)
    scenario: Optional[str] = None
    draft_tokens: Optional[int] = None
    drafter: Optional[str] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None


@dataclass
class JoinSetup:
    """What :func:`check_options` read from a :class:`JoinOptions`, every value checked."""

    #: the relay's address (``ws://HOST:PORT``) and the room's name
    relay_url: str
    room: str
    #: the room key of the URL (None without one)
    key: Optional[str]
    #: the STUN/TURN servers (runtime.transport.ice.IceServer)
    ice_servers: list
    #: the other devices' ids, in the order given, without repeats
    peers: list[str]
    #: the host's question queue (splitroom.host_queue.HostQueue; None without ``--queue``),
    #: the queue's number of each question asked, and the numbers resumed from it
    queue: Any
    numbers: list[int]
    pending: list[int]
    #: the host's decoding (planner.room.Decoding; None on a worker) and the scenario's seed
    decoding: Any
    scn_seed: int
    #: the model's directory, its runtime ModelConfig and the id the room calls it by
    model_dir: Any
    mcfg: Any
    model_id: str
    #: this device's layers, 0-based half-open (None: ``auto``), and what it lends, bytes
    mine: Optional[tuple[int, int]]
    lends: int


def check_options(opts: JoinOptions) -> JoinSetup:
    """Read and check every option of ``opts`` (reads the model's config from disk and
    opens ``--queue``; connects to nothing). With a queue, ``opts.asks`` becomes the
    queue's questions: those resumed first, then the new ones.

    Raises JoinError (status 2) naming the option that is wrong, in the order the
    options are checked here."""
    from runtime.backends import BACKENDS
    from runtime.config import ModelConfig
    from runtime.transport.ice import parse_ice_servers
    from splitroom.models import ModelError
    from splitroom.models import model_dir as resolve_model

    relay_url, room = parse_room_url(opts.room_url)
    key = parse_room_key(opts.room_url)
    try:
        ice_servers = parse_ice_servers(opts.ice_servers)
    except ValueError as e:
        raise JoinError(f"--ice-server: {e}") from None
    if opts.ice_relay_only and not opts.ice_from_relay and not any(s.kind == "turn" for s in ice_servers):
        raise JoinError("--ice-relay-only needs a TURN server: --ice-server turn:USER:PASS@HOST:PORT, "
                        "or --ice-from-relay")
    peers = [p for p in dict.fromkeys(p.strip() for p in opts.peers) if p]
    if not peers:
        raise JoinError("--peers must name the other devices of the room (comma-separated ids)")
    if opts.device in peers:
        raise JoinError(f"--peers must not contain this device ({opts.device!r})")
    if opts.serve_port is not None and not opts.host:
        raise JoinError("only the model host (--host) serves the API (--serve PORT)")
    for i, ask in enumerate(opts.asks):
        try:
            ask.encode("utf-8")
        except UnicodeEncodeError:
            raise JoinError(f"--ask number {i + 1} is not valid Unicode text (bytes that are not UTF-8?)") from None
    if opts.queue_file is not None and (not opts.host or opts.serve_port is not None):
        raise JoinError("--queue keeps the questions of a host that asks them (--host with --ask), "
                        "not of a worker or of --serve")
    queue, numbers, pending = None, [], []
    if opts.queue_file is not None:
        from splitroom.host_queue import HostQueue, QueueError
        try:
            queue = HostQueue.open(opts.queue_file)
            pending = queue.pending()
            numbers = pending + [queue.take(p) for p in opts.asks]
        except QueueError as e:
            raise JoinError(str(e)) from None
        opts.asks = [queue.prompts[n] for n in numbers]
    if opts.host and not opts.asks and opts.serve_port is None:
        raise JoinError("the host needs at least one --ask \"QUESTION\" (or --serve PORT, or a --queue "
                        "with questions not yet ended)")
    if opts.asks and not opts.host:
        raise JoinError("only the host (--host) asks questions")
    if opts.backend not in BACKENDS:
        raise JoinError(f"unknown backend {opts.backend!r}; choose one of {', '.join(BACKENDS)}")
    if opts.max_new_tokens < 1:
        raise JoinError("--max-tokens must be at least 1")
    decoding_flags = [f for f, v in (("--scenario", opts.scenario), ("--draft-tokens", opts.draft_tokens),
                                     ("--drafter", opts.drafter), ("--temperature", opts.temperature),
                                     ("--top-p", opts.top_p), ("--top-k", opts.top_k), ("--seed", opts.seed))
                      if v is not None]
    if decoding_flags and not opts.host:
        raise JoinError(f"only the host (--host) decides how the room decodes: {', '.join(decoding_flags)}")
    decoding, scn_seed = room_decoding(opts) if opts.host else (None, 0)
    try:
        model_dir = opts.model_dir or str(resolve_model(opts.model))
        mcfg = ModelConfig.load(model_dir)
    except ModelError as e:
        raise JoinError(f"--model: {e}" if opts.model else f"no model here: {e}") from None
    except (ValueError, OSError) as e:
        raise JoinError(f"no model here: {e}") from None
    bundled = opts.model is None and opts.model_dir is None
    model_id = BUNDLED_MODEL_ID if bundled else (mcfg.name or BUNDLED_MODEL_ID)
    mine = parse_layers(opts.layers, mcfg.n_layers)
    lends = parse_lends(opts.lends)
    if mine is not None and opts.host and mine[0] != 0:
        raise JoinError(f"the host holds the first layers: --layers 1-B, not {opts.layers}")
    return JoinSetup(relay_url=relay_url, room=room, key=key, ice_servers=ice_servers, peers=peers, queue=queue,
                     numbers=numbers, pending=pending, decoding=decoding, scn_seed=scn_seed, model_dir=model_dir,
                     mcfg=mcfg, model_id=model_id, mine=mine, lends=lends)
