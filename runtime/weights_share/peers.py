"""The IO of a copy: a server answering a peer's requests on one transport, and
:func:`fetch_range`, which asks a peer for a range, checks everything it receives
against the manifest and only then writes it (the protocol is in
:mod:`runtime.weights_share`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from .. import weights as _weights
from .. import weights_codec as _codec
from ..config import ModelConfig
from .manifest import (_NP_DTYPES, CONFIG_FILES, GGML_DTYPES, HOST_FILES, WeightsError, _canonical, _check_manifest, _is_int,
                       _manifest_from, _model_dir, _TensorFile, expected_sha256, is_blocks, open_store)
from .wire import _REP, _REQ, CHANNEL, MAX_PART_BYTES, _req_int, decode, encode

log = logging.getLogger("splitroom.weights_share")

#: Default slice a client asks for, bytes.
PART_BYTES = 1 << 20
#: Default number of slices a client keeps requested at once.
WINDOW = 4


@dataclass
class WeightsServer:
    """Answers weights requests on one transport (see :func:`serve_weights`).

    Attributes:
        model_dir: the directory served.
        held: tensor names this server gives out.
        grant: None (every peer may take all of ``held``), or ``peer -> (start, end,
            with_embedding, with_head)``: the range (0-based, half-open) that peer may
            take, or None for a peer this server does not answer (its requests go to the
            transport's next subscriber of the channel, e.g. another server, or its handler).
        stats: ``requests``, ``refused``, ``bytes`` (payload bytes sent).
        refusals: ``(peer, reason)`` of each refused request.
    """

    transport: Any
    model_dir: Path
    held: frozenset
    tf: _TensorFile
    grant: Optional[Callable[[str], Optional[tuple]]] = None
    stats: dict = field(default_factory=lambda: {"requests": 0, "refused": 0, "bytes": 0})
    refusals: list = field(default_factory=list)
    _tasks: set = field(default_factory=set)
    _packs: dict = field(default_factory=dict)  # tensor name -> packed bytes or None
    _granted: dict = field(default_factory=dict)  # a granted range -> the tensor names of it held
    _sub: Any = None  # the transport's Subscription of the weights channel

    def _accepts(self, src: str, data: bytes) -> bool:
        """A request (kind 'Q') from a peer this server answers."""
        return bool(data) and data[0] == _REQ and (self.grant is None or self.grant(src) is not None)

    def _on_request(self, src: str, data: bytes) -> None:
        t = asyncio.ensure_future(self._answer(src, data))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _refuse(self, src: str, rid: Any, why: str) -> bytes:
        self.stats["refused"] += 1
        self.refusals.append((src, why))
        if len(self.refusals) > 1000:  # keep the last 1000
            del self.refusals[:-1000]
        log.info("%s: refused a weights request from %s: %s", getattr(self.transport, "device", "?"), src, why)
        return encode(_REP, {"id": rid, "ok": False, "error": why})

    def _held_for(self, src: str) -> tuple[frozenset, str]:
        """The tensor names ``src`` may take, and how a refusal words their bound."""
        if self.grant is None:
            return self.held, ""
        g = self.grant(src)
        if g is None:  # the grant was withdrawn since the request came
            return frozenset(), f" (nothing is granted to {src})"
        g = tuple(g)
        if g not in self._granted:
            cfg = ModelConfig.load(self.model_dir)
            self._granted[g] = self.held & frozenset(_weights.range_tensor_names(cfg, *g))
        return self._granted[g], f" (granted to {src}: layers [{g[0]}, {g[1]}))"

    def _reply(self, src: str, data: bytes) -> bytes:
        self.stats["requests"] += 1
        try:
            _, req, _ = decode(data)
        except ValueError as e:
            return self._refuse(src, None, f"malformed request: {e}")
        rid = req.get("id")
        op = req.get("op")
        try:
            held, bound = self._held_for(src)
            if op == "manifest":
                start, end = _req_int(req, "start"), _req_int(req, "end")
                host = bool(req.get("host", False))
                emb = bool(req.get("embedding", host))
                head = bool(req.get("head", host))
                cfg = ModelConfig.load(self.model_dir)
                names = _weights.range_tensor_names(cfg, start, end, emb, head)
                lacking = [n for n in names if n not in held]
                if lacking:
                    return self._refuse(src, rid, f"does not hold layers [{start}, {end})"
                                        f"{' with embedding' if emb else ''}{' with head' if head else ''}: "
                                        f"{len(lacking)} tensors missing, e.g. {lacking[0]}{bound}")
                m = _manifest_from(self.tf, self.model_dir, start, end, emb, head)
                return encode(_REP, {"id": rid, "ok": True, "op": "manifest"}, _canonical(m))
            if op == "tensor":
                name = str(req["name"])
                off, length = _req_int(req, "offset"), _req_int(req, "length")
                if name not in held:
                    return self._refuse(src, rid, f"does not hold tensor {name[:100]}{bound}")
                packed = self._packed(name) if req.get("form") == "packed" else None
                if packed is not None:  # a slice of the packed form (runtime.weights_codec)
                    if off < 0 or length <= 0 or length > MAX_PART_BYTES or off >= len(packed):
                        return self._refuse(src, rid, f"bad slice {off}+{length} of packed {name} "
                                            f"({len(packed)} bytes)")
                    part = memoryview(packed)[off:off + length]
                    self.stats["bytes"] += len(part)
                    return encode(_REP, {"id": rid, "ok": True, "op": "tensor", "name": name, "offset": off,
                                         "form": "packed", "total": len(packed)}, part)
                _, _, a, b = self.tf.entries[name]
                length = min(length, b - a - off) if req.get("form") == "packed" else length
                if off < 0 or length <= 0 or length > MAX_PART_BYTES or off + length > b - a:
                    return self._refuse(src, rid, f"bad slice {off}+{length} of {name} ({b - a} bytes)")
                v = memoryview(self.tf.mm)[a + off:a + off + length]
                msg = encode(_REP, {"id": rid, "ok": True, "op": "tensor", "name": name, "offset": off,
                                    "form": "raw", "total": b - a}, v)
                v.release()
                self.stats["bytes"] += length
                return msg
            if op == "file":
                name = str(req["name"])
                if name not in CONFIG_FILES + HOST_FILES or not (self.model_dir / name).is_file():
                    return self._refuse(src, rid, f"does not serve file {name[:100]!r}")
                data = (self.model_dir / name).read_bytes()
                self.stats["bytes"] += len(data)
                return encode(_REP, {"id": rid, "ok": True, "op": "file", "name": name}, data)
            return self._refuse(src, rid, f"unknown op {str(op)[:20]!r}")
        except _weights.WeightsError as e:
            return self._refuse(src, rid, str(e))
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            return self._refuse(src, rid, f"malformed request: {type(e).__name__}: {str(e)[:100]}")

    def _packed(self, name: str) -> Optional[bytes]:
        """The packed form of a float32 tensor (runtime.weights_codec), made once and
        kept; None when it has none (another dtype, or too few blocks of that form)."""
        if name not in self._packs:
            dtype, shape, a, b = self.tf.entries[name]
            packed = None
            if dtype == "F32":
                v = memoryview(self.tf.mm)[a:b]
                try:
                    packed = _codec.pack(np.frombuffer(v, dtype="<f4"))
                finally:
                    v.release()
            self._packs[name] = packed
        return self._packs[name]

    def _safe_reply(self, src: str, data: bytes) -> bytes:
        """:meth:`_reply`, and a refusal for anything it did not foresee: a request never
        ends the serving task."""
        try:
            return self._reply(src, data)
        except Exception as e:
            return self._refuse(src, None, f"request failed: {type(e).__name__}")

    def _slow(self, data: bytes) -> bool:
        """Whether answering ``data`` hashes a range (a manifest: about 0.3 s per 100 MB
        the first time) or packs a tensor not packed yet (10-20 ms a layer matrix): work
        kept off the event loop, so this device's residuals keep moving meanwhile."""
        try:
            _, req, _ = decode(data)
        except ValueError:
            return False
        name = req.get("name")
        return req.get("op") == "manifest" or (req.get("op") == "tensor" and req.get("form") == "packed"
                                               and isinstance(name, str) and name not in self._packs)

    async def _answer(self, src: str, data: bytes) -> None:
        if self._slow(data):
            msg = await asyncio.get_running_loop().run_in_executor(None, self._safe_reply, src, data)
        else:
            msg = self._safe_reply(src, data)
        try:
            await self.transport.send(src, CHANNEL, msg)
        except Exception as e:  # the peer left: nothing to answer
            log.info("weights reply to %s not sent: %r", src, e)

    def close(self) -> None:
        """Stop answering: the subscription is cancelled (later requests go to the
        transport's next subscriber or its handler), and so are the answers under way."""
        for t in list(self._tasks):
            t.cancel()
        if self._sub is not None:
            self._sub.cancel()
        self.tf.close()


def serve_weights(transport, model_dir: Path | str,
                  holds: Optional[tuple[int, int, bool, bool]] = None,
                  grant: Optional[Callable[[str], Optional[tuple[int, int, bool, bool]]]] = None,
                  blocks: bool = False) -> WeightsServer:
    """Answer weights requests arriving on ``transport``'s ``weights`` channel.

    Serves the tensors of ``model_dir/model.safetensors`` (a full model directory or a
    range directory written by :func:`fetch_range`), or with ``blocks`` the blocks of the
    GGUF it was prepared from as stored (``weights: gguf``;
    :mod:`runtime.weights_share.manifest`), limited to ``holds = (start, end,
    with_embedding, with_head)`` (0-based, half-open) when given. Requests for anything
    else are refused with a reason. The server subscribes to the requests on the weights
    channel (``transport.subscribe``); replies, and messages on other channels, are not
    its own and go on to the transport's other subscribers or its handler.

    ``grant``, when given, bounds each peer: ``grant(peer)`` is the range ``(start, end,
    with_embedding, with_head)`` that peer may take (its requests for anything else are
    refused), or None for a peer this server leaves to the next subscriber (its requests
    are not taken). A browser tab's range is served so (runtime.serve.tab_stage.TabRoom).
    A channel's subscribers are asked in the order they subscribed, so a server with a
    grant made first is asked before one without.

    Returns a :class:`WeightsServer`; ``close()`` stops it. Raises WeightsError when the
    directory cannot be read, ValueError for a ``holds`` outside the model.
    """
    mdir = _model_dir(model_dir)
    tf = open_store(mdir, blocks)
    held = set(tf.entries)
    if holds is not None:
        cfg = ModelConfig.load(mdir)
        held &= set(_weights.range_tensor_names(cfg, *holds))
    srv = WeightsServer(transport, mdir, frozenset(held), tf, grant)
    srv._sub = transport.subscribe(CHANNEL, srv._on_request, srv._accepts)
    return srv


class _Client:
    """Request/reply matching for one fetch (replies carry the request id)."""

    def __init__(self, transport, peer: str, timeout_s: float):
        self.t = transport
        self.peer = peer
        self.timeout_s = timeout_s
        self.waiting: dict[int, asyncio.Future] = {}
        self.next_id = 1

    def accepts(self, src: str, data: bytes) -> bool:
        """A reply (kind 'R') from the peer this copy asks."""
        return src == self.peer and bool(data) and data[0] == _REP

    def on_reply(self, src: str, data: bytes) -> None:
        try:
            _, h, payload = decode(data)
        except ValueError as e:
            log.warning("malformed weights reply from %s: %s", src, e)
            for f in self.waiting.values():  # we cannot tell whose it was: fail them all
                if not f.done():
                    f.set_exception(WeightsError(f"malformed reply from {src}: {e}"))
            return
        rid = h.get("id")
        f = self.waiting.pop(rid, None) if _is_int(rid) else None
        if f is not None and not f.done():
            f.set_result((h, payload))

    async def ask(self, req: dict) -> tuple[dict, memoryview]:
        rid = self.next_id
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        try:
            await self.t.send(self.peer, CHANNEL, encode(_REQ, dict(req, id=rid)))
            h, payload = await asyncio.wait_for(fut, self.timeout_s)
        except asyncio.TimeoutError:
            raise WeightsError(f"{self.peer} did not answer a {req.get('op')} request within {self.timeout_s:g} s") from None
        except WeightsError:
            raise
        except Exception as e:  # TransportError and the like
            raise WeightsError(f"weights request to {self.peer} failed: {e}") from e
        finally:
            self.waiting.pop(rid, None)
        if not h.get("ok"):
            raise WeightsError(f"{self.peer} refused: {h.get('error', 'no reason given')}")
        return h, payload


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


#: the file of a blocks copy's tensors, as stored (:func:`fetch_range`)
BLOCKS_NAME = "blocks.gguf-data"


def _write_blocks(dest: Path, m: dict, tensors: dict[str, bytes]) -> Path:
    """Write a checked blocks manifest's tensors to ``dest/BLOCKS_NAME`` (each at a multiple
    of 32 bytes) and the table ``dest/gguf.json`` naming it (runtime.weights.GGUF_SOURCE,
    what :func:`runtime.weights.load_range_native` reads), the table last."""
    table, pos = {}, 0
    for n, e in m["tensors"].items():
        pos += -pos % 32
        table[e["gguf"]] = [GGML_DTYPES[e["dtype"]], list(e["shape"]), pos, e["nbytes"]]
        pos += e["nbytes"]
    out = dest / BLOCKS_NAME

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            for n, e in m["tensors"].items():
                f.seek(table[e["gguf"]][2])
                f.write(tensors[n])
            f.truncate(pos)
    _atomic_write(out, write)
    rec = {"path": str(out.resolve()), "identity": _weights.file_identity(out), "tensors": table}
    _atomic_write(dest / _weights.GGUF_SOURCE, lambda tmp: Path(tmp).write_text(json.dumps(rec)))
    return out


async def fetch_range(transport, peer: str, start: int, end: int, with_embedding: bool, with_head: bool,
                      dest_dir: Path | str, expected_manifest: Any, *, timeout_s: float = 30.0,
                      part_bytes: int = PART_BYTES, window: int = WINDOW,
                      progress: Optional[Callable[[int, int], None]] = None) -> Path:
    """Copy layers ``[start, end)`` (0-based, half-open; plus embedding/head when asked)
    from ``peer`` and write them to ``dest_dir``.

    Asks for the manifest, then every tensor in slices of ``part_bytes`` (``window``
    slices requested at a time) and the config/tokenizer files, checks every sha256
    (each tensor, each file, the manifest's own hash, and the manifest hash against
    ``expected_manifest``, which is required: a manifest dict or its sha256 hex string
    from a source the peer does not control, e.g. the model host's manifest or the
    model's published digest; see :func:`expected_sha256`), refuses a hostile manifest
    (:func:`_check_manifest`), and only then writes ``dest_dir/model.safetensors`` (only
    that range's tensors), the files and ``dest_dir/weights-manifest.json``, each to a
    temporary name renamed into place (the tensors last). ``dest_dir`` is then a model
    directory for that range: ``runtime.weights.load_range(dest_dir, ...)`` and
    ``runtime.backends.make_stage(backend, dest_dir, spec)`` read it.

    A manifest of GGUF blocks (a peer serving with ``blocks``) is written as stored
    instead: ``dest_dir/blocks.gguf-data`` (the tensors' bytes, each at a multiple of 32)
    and ``dest_dir/gguf.json`` (runtime.weights.GGUF_SOURCE: that file and its tensor
    table under the GGUF names), so ``runtime.weights.load_range_native(dest_dir, ...)``
    reads the range's blocks as it reads them from the GGUF.

    Args:
        transport: a :class:`runtime.transport.Transport` connected to ``peer``.
        timeout_s: seconds to wait for each reply.
        progress: called ``(bytes received, bytes in all)`` of the tensors after each
            slice (an exception it raises is logged, never stops the copy).
    Returns:
        The path of the written ``model.safetensors`` (or ``blocks.gguf-data``).
    Raises:
        WeightsError: no expected hash, refused, timed out, malformed, or a sha256
            mismatch; nothing is written then. ValueError: bad ``part_bytes`` or ``window``.
    """
    if not (0 < part_bytes <= MAX_PART_BYTES) or window < 1:
        raise ValueError(f"part_bytes must be in (0, {MAX_PART_BYTES}] and window >= 1")
    expected_sha256(expected_manifest)  # required, before anything is asked
    emb, head = bool(with_embedding), bool(with_head)
    dest = Path(dest_dir)
    cl = _Client(transport, peer, timeout_s)
    sub = transport.subscribe(CHANNEL, cl.on_reply, cl.accepts)
    try:
        _, payload = await cl.ask({"op": "manifest", "start": start, "end": end, "embedding": emb, "head": head})
        try:
            m = json.loads(bytes(payload))
        except (ValueError, RecursionError) as e:
            raise WeightsError(f"the manifest from {peer} is not JSON: {str(e)[:200]}") from None
        m = _check_manifest(m, start, end, emb, head, expected_manifest)
        blocks = is_blocks(m)

        files: dict[str, bytes] = {}
        for fn, e in m["files"].items():
            _, payload = await cl.ask({"op": "file", "name": fn})
            data = bytes(payload)
            if hashlib.sha256(data).hexdigest() != e["sha256"]:
                raise WeightsError(f"file {fn} from {peer}: sha256 mismatch")
            files[fn] = data

        # Each tensor's first slice is asked in the packed form (runtime.weights_codec):
        # the reply says which form comes ("packed", or "raw" for a tensor without one)
        # and its total size; the rest is asked in that form. A packed tensor is unpacked
        # to float32 when complete; either way its sha256 is checked on the stored bytes.
        size = {n: e["nbytes"] for n, e in m["tensors"].items()}
        total = sum(size.values())
        form: dict[str, str] = {}
        wire: dict[str, int] = {}
        bufs: dict[str, bytearray] = {}
        left: dict[str, int] = {}
        got = [0.0]
        tensors: dict[str, np.ndarray] = {}

        def received(n: str, off: int, h: dict, payload: memoryview) -> None:
            bufs[n][off:off + len(payload)] = payload
            left[n] -= len(payload)
            got[0] += len(payload) * size[n] / wire[n]  # progress in stored bytes
            if progress is not None:
                try:
                    progress(int(got[0]), total)
                except Exception as e:  # a display's bug never stops a copy
                    log.warning("weights progress callback failed: %s: %s", type(e).__name__, e)
            if left[n] == 0:
                e = m["tensors"][n]
                data = bytes(bufs[n])
                if form[n] == "packed":
                    try:
                        data = _codec.unpack(data, size[n] // 4)
                    except _codec.PackError as err:
                        raise WeightsError(f"tensor {n} from {peer}: malformed packed form: {err}") from None
                if hashlib.sha256(data).hexdigest() != e["sha256"]:
                    raise WeightsError(f"tensor {n} from {peer}: sha256 mismatch")  # stop early
                del bufs[n]
                tensors[n] = data if blocks else np.frombuffer(data, dtype=_NP_DTYPES[e["dtype"]]).reshape(e["shape"])

        async def first(n: str) -> None:
            packable = m["tensors"][n]["dtype"] == "F32"
            req = {"op": "tensor", "name": n, "offset": 0, "length": min(part_bytes, size[n])}
            h, payload = await cl.ask(dict(req, form="packed") if packable else req)
            f = h.get("form", "raw") if packable else "raw"
            t = h.get("total", size[n])
            if h.get("name") != n or h.get("offset") != 0 or f not in ("raw", "packed") or not _is_int(t) \
                    or (f == "raw" and t != size[n]) or not (0 < t <= size[n]) \
                    or len(payload) != min(part_bytes, t):
                raise WeightsError(f"tensor {n} from {peer}: wrong slice in reply")
            form[n], wire[n], left[n] = f, t, t
            bufs[n] = bytearray(t)
            received(n, 0, h, payload)

        async def rest(n: str, off: int, length: int) -> None:
            req = {"op": "tensor", "name": n, "offset": off, "length": length}
            h, payload = await cl.ask(dict(req, form="packed") if form[n] == "packed" else req)
            if h.get("name") != n or h.get("offset") != off or len(payload) != length \
                    or h.get("form", "raw") != form[n]:
                raise WeightsError(f"tensor {n} from {peer}: wrong slice in reply")
            received(n, off, h, payload)

        async def run(jobs) -> None:
            jobs = iter(jobs)

            async def worker() -> None:
                for job in jobs:
                    await job()
            tasks = [asyncio.ensure_future(worker()) for _ in range(window)]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()

        await run([lambda n=n: first(n) for n in size])
        await run([lambda n=n, off=off: rest(n, off, min(part_bytes, wire[n] - off))
                   for n in size for off in range(part_bytes, wire[n], part_bytes)])
        for n in size:
            if n not in tensors:  # cannot happen: every slice was fetched and checked
                raise WeightsError(f"tensor {n} from {peer}: incomplete")
    finally:
        sub.cancel()

    # verified: now write (side files first, the tensors last, each renamed into place)
    from safetensors.numpy import save_file

    dest.mkdir(parents=True, exist_ok=True)
    for fn, data in files.items():
        _atomic_write(dest / fn, lambda tmp, d=data: Path(tmp).write_bytes(d))
    _atomic_write(dest / "weights-manifest.json", lambda tmp: Path(tmp).write_text(json.dumps(m, indent=1)))
    if blocks:
        out = _write_blocks(dest, m, tensors)
    else:
        out = dest / _weights.SAFETENSORS_NAME
        meta = {"format": "pt", "splitroom_range": f"{start}-{end}", "manifest_sha256": m["sha256"], "source": peer}
        _atomic_write(out, lambda tmp: save_file(tensors, tmp, metadata=meta))
    log.info("%s: copied layers [%d, %d) from %s (%d tensors, manifest %s)", getattr(transport, "device", "?"),
             start, end, peer, len(tensors), m["sha256"][:12])
    return out
