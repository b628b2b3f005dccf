"""A layer range's sha256 manifest: made from a model directory, checked when it comes
from a peer (the layout is in :mod:`runtime.weights_share`).

Reads the safetensors file memory-mapped (8-byte little-endian header length, JSON
header with ``dtype``, ``shape``, ``data_offsets`` relative to the end of the header,
then the data: https://github.com/huggingface/safetensors, README, "Format"); a
manifest from a peer is checked here before anything is fetched or written.

With ``blocks=True`` (a room whose weights are ``gguf``, held as stored) the tensors are
the GGUF's own bytes instead, mapped from the file the model directory was prepared from
(:func:`runtime.weights.gguf_source`): each entry's ``dtype`` is the GGML type (``F32``,
``F16``, or a block format of :data:`runtime.gguf_blocks.FORMATS` in capitals, e.g.
``Q4_K``), its ``shape`` the GGUF's ``[out, in]`` (outermost first), ``nbytes`` its stored
bytes (``out * row_bytes(format, in)`` for blocks) and ``gguf`` its name in the file (Q
and K rows as the file orders them; the reader un-permutes them as it does for the file).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import gguf_blocks as _gb
from .. import weights as _weights
from ..config import ModelConfig

MANIFEST_VERSION = 1
#: Files copied beside the tensors: always / only with the embedding (a host's range).
CONFIG_FILES = ("config.json",)
HOST_FILES = ("tokenizer.json", "tokenizer_config.json")

# safetensors dtype -> numpy dtype (little endian); bf16 has no numpy type and is refused
_NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
              "I8": "|i1", "U8": "|u1", "BOOL": "|b1"}
#: a blocks manifest's dtype -> GGML type id (F32, F16 and the block formats held as stored)
GGML_DTYPES = {"F32": _gb.GGML_F32, "F16": _gb.GGML_F16,
               **{f.upper(): tid for f, (tid, _, _) in _gb.FORMATS.items()}}
_GGML_NAMES = {tid: name for name, tid in GGML_DTYPES.items()}


class WeightsError(_weights.WeightsError):
    """A copy from a peer failed: refused, timed out, malformed, or a sha256 that does
    not match (a tensor, a file, or the manifest against the expected one). Nothing was
    written when this is raised."""


@dataclass
class _TensorFile:
    """A safetensors file mapped read-only: ``entries[name] = (dtype, shape, begin, end)``
    with absolute byte offsets into ``mm``."""

    path: Path
    mm: mmap.mmap
    entries: dict[str, tuple[str, list[int], int, int]]
    key: tuple
    #: blocks (a GGUF mapped): tensor name -> its name in the GGUF; empty for safetensors
    gguf: dict[str, str] | None = None

    @classmethod
    def open(cls, path: Path) -> "_TensorFile":
        """Map ``path``. Raises WeightsError when it is missing or not a safetensors file."""
        try:
            st = path.stat()
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise WeightsError(f"cannot read {path}: {e}") from e
        try:
            (n,) = struct.unpack_from("<Q", mm, 0)
            header = json.loads(bytes(mm[8:8 + n]))
        except (struct.error, ValueError) as e:
            mm.close()
            raise WeightsError(f"{path} is not a safetensors file: {e}") from e
        base = 8 + n
        entries = {}
        for name, v in header.items():
            if name == "__metadata__":
                continue
            a, b = v["data_offsets"]
            entries[name] = (v["dtype"], list(v["shape"]), base + a, base + b)
        return cls(path, mm, entries, (str(path), st.st_mtime_ns, st.st_size))

    @classmethod
    def open_gguf(cls, mdir: Path) -> "_TensorFile":
        """Map the GGUF that model directory ``mdir`` was prepared from (``weights: gguf``):
        its tensors by Hugging Face name, as stored (see the module doc). Tensors of a type
        not held as stored are left out (a manifest of their range then says it lacks them).
        Raises WeightsError when the directory has no GGUF, or the GGUF is gone, changed,
        unreadable or shorter than its tensor table says."""
        try:
            src, table = _weights.gguf_source(mdir, with_table=True)
            if table is None:  # a folder prepared without the table
                import gguf
                table = _gb.tensor_table(gguf.GGUFReader(str(src)))
            arch = ModelConfig.load(mdir).arch
            st = src.stat()
            with open(src, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except _weights.WeightsError as e:
            raise WeightsError(str(e)) from None
        except (OSError, ValueError) as e:
            raise WeightsError(f"cannot read the GGUF of {mdir}: {e}") from e
        entries, names = {}, {}
        for gname, t in table.items():
            dtype = _GGML_NAMES.get(t.ggml_type)
            if gname == _weights.ROPE_FREQS_GGUF or dtype is None:
                continue
            if t.offset < 0 or t.offset + t.nbytes > len(mm):
                mm.close()
                raise WeightsError(f"{src}: {gname}: the file ends inside this tensor (truncated GGUF)")
            name = _weights.hf_name(gname, arch)
            entries[name] = (dtype, list(t.shape), t.offset, t.offset + t.nbytes)
            names[name] = gname
        return cls(src, mm, entries, (str(src), st.st_mtime_ns, st.st_size), names)

    def view(self, name: str) -> memoryview:
        _, _, a, b = self.entries[name]
        return memoryview(self.mm)[a:b]

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:  # a memoryview still alive; the mapping goes with the last one
            pass


_SHA_CACHE: dict[tuple, str] = {}


def _tensor_sha(tf: _TensorFile, name: str) -> str:
    """sha256 hex of one tensor's stored bytes, cached per (file, mtime, size, name)."""
    k = tf.key + (name,)
    h = _SHA_CACHE.get(k)
    if h is None:
        v = tf.view(name)
        h = hashlib.sha256(v).hexdigest()
        v.release()
        _SHA_CACHE[k] = h
    return h


def _model_dir(model_dir: Path | str) -> Path:
    p = Path(model_dir)
    return p.parent if p.is_file() else p


def open_store(mdir: Path, blocks: bool = False) -> _TensorFile:
    """The tensors a model directory serves: ``model.safetensors``, or with ``blocks`` its
    GGUF's blocks as stored (:meth:`_TensorFile.open_gguf`). Raises WeightsError."""
    return _TensorFile.open_gguf(mdir) if blocks else _TensorFile.open(mdir / _weights.SAFETENSORS_NAME)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def manifest_sha256(manifest: dict) -> str:
    """sha256 hex of the canonical JSON of ``manifest`` without its ``sha256`` key."""
    return hashlib.sha256(_canonical({k: v for k, v in manifest.items() if k != "sha256"})).hexdigest()


def _range_files(with_embedding: bool) -> tuple[str, ...]:
    return CONFIG_FILES + (HOST_FILES if with_embedding else ())


def _manifest_from(tf: _TensorFile, mdir: Path, start: int, end: int, with_embedding: bool,
                   with_head: bool) -> dict:
    cfg = ModelConfig.load(mdir)
    names = _weights.range_tensor_names(cfg, start, end, with_embedding, with_head)
    missing = [n for n in names if n not in tf.entries]
    if missing:
        raise WeightsError(f"{tf.path} lacks {len(missing)} tensors of layers [{start}, {end}), e.g. {missing[0]}")
    tensors = {}
    for n in names:
        dtype, shape, a, b = tf.entries[n]
        tensors[n] = {"sha256": _tensor_sha(tf, n), "dtype": dtype, "shape": shape, "nbytes": b - a}
        if tf.gguf:
            tensors[n]["gguf"] = tf.gguf[n]
    files = {}
    for fn in _range_files(with_embedding):
        p = mdir / fn
        if not p.is_file():
            raise WeightsError(f"{mdir} lacks {fn}")
        data = p.read_bytes()
        files[fn] = {"sha256": hashlib.sha256(data).hexdigest(), "nbytes": len(data)}
    m = {"version": MANIFEST_VERSION, "start": start, "end": end, "embedding": bool(with_embedding),
         "head": bool(with_head), "tensors": tensors, "files": files}
    m["sha256"] = manifest_sha256(m)
    return m


def make_manifest(model_dir: Path | str, start: int, end: int, with_embedding: bool, with_head: bool,
                  blocks: bool = False) -> dict:
    """The sha256 manifest of layers ``[start, end)`` (0-based, half-open) of a model
    directory (``model.safetensors`` + ``config.json``; a range directory written by
    :func:`fetch_range` works too), plus the embedding and/or head when asked; with
    ``blocks``, of the GGUF's tensors as stored (module doc).

    Hashes the tensors' stored bytes (about 0.3 s per 100 MB; cached per file and
    mtime). See the module doc for the layout.

    Raises:
        ValueError: a range outside ``[0, n_layers]``.
        WeightsError: the file is missing, unreadable, or lacks a tensor or file of the range.
    """
    mdir = _model_dir(model_dir)
    tf = open_store(mdir, blocks)
    try:
        return _manifest_from(tf, mdir, start, end, with_embedding, with_head)
    finally:
        tf.close()


def range_nbytes(model_dir: Path | str, start: int, end: int, blocks: bool = False) -> int:
    """Stored bytes of layers ``[start, end)`` (0-based, half-open) of a model directory:
    the sum of the ``nbytes`` its manifest (:func:`make_manifest`, ``blocks`` as there)
    gives those tensors, read from the safetensors header (or the GGUF's tensor table)
    without hashing. Raises WeightsError as :func:`make_manifest` does."""
    if end <= start:
        return 0
    mdir = _model_dir(model_dir)
    tf = open_store(mdir, blocks)
    try:
        names = _weights.range_tensor_names(ModelConfig.load(mdir), start, end, False, False)
        missing = [n for n in names if n not in tf.entries]
        if missing:
            raise WeightsError(f"{tf.path} lacks {len(missing)} tensors of layers [{start}, {end}), e.g. {missing[0]}")
        return sum(tf.entries[n][3] - tf.entries[n][2] for n in names)
    finally:
        tf.close()


#: Largest tensor a manifest may describe, and largest range a client holds in memory
#: while it checks it, bytes (SmolLM2-135M's largest tensor is 113 MB, its whole model 540 MB).
MAX_TENSOR_BYTES = 8 << 30
MAX_RANGE_BYTES = 64 << 30
#: Most dimensions of one tensor, and most tensors in one range's manifest.
MAX_DIMS = 8
MAX_TENSORS = 100_000
_HEX64 = frozenset("0123456789abcdef")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_sha(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX64


def is_blocks(m: dict) -> bool:
    """Whether manifest ``m`` lists GGUF blocks as stored (its tensors name their GGUF
    tensor, module doc) rather than safetensors tensors."""
    return any(isinstance(e, dict) and "gguf" in e for e in m.get("tensors", {}).values())


def expected_sha256(expected: Any) -> str:
    """The manifest sha256 a copy must match: ``expected`` is that 64-character lower-case
    hex string, or a manifest dict holding it under ``sha256`` (e.g. the model host's own
    manifest, or the model's published digest). It must come from somewhere the peer
    serving the weights does not control.

    Raises:
        WeightsError: ``expected`` is None or not such a hash (nothing is fetched then).
    """
    want = expected.get("sha256") if isinstance(expected, dict) else expected
    if not _is_sha(want):
        raise WeightsError("an expected manifest sha256 (64 hex characters, from the model host's manifest or "
                           "the model's published digest) is required to copy weights from a peer")
    return want


def _check_manifest(m: Any, start: int, end: int, emb: bool, head: bool, expected: Any) -> dict:
    """``m`` if it is a well-formed manifest of the range whose sha256 is ``expected``.

    Raises WeightsError (never another error) for anything else: not a mapping, another
    range, a hash that does not match, no tensors, a tensor name, dtype, shape (negative,
    too many dimensions, more than ``MAX_TENSOR_BYTES``), byte count or sha256 that is
    not what it claims, more than ``MAX_RANGE_BYTES`` in all, or an unexpected file.
    """
    want = expected_sha256(expected)
    if not isinstance(m, dict) or not isinstance(m.get("tensors"), dict) or not isinstance(m.get("files"), dict):
        raise WeightsError("the manifest is malformed")
    if (m.get("start"), m.get("end"), m.get("embedding"), m.get("head")) != (start, end, emb, head) \
            or not all(_is_int(m.get(k)) for k in ("start", "end")):
        raise WeightsError(f"the manifest is for another range: {str(m.get('start'))[:20]}-{str(m.get('end'))[:20]}")
    try:
        got = manifest_sha256(m)
    except (TypeError, ValueError, RecursionError) as e:  # NaN/Infinity, keys that are not text
        raise WeightsError(f"the manifest is malformed: {type(e).__name__}") from None
    if m.get("sha256") != got:
        raise WeightsError(f"the manifest's sha256 does not match its contents ({got[:12]}...)")
    if want != got:
        raise WeightsError(f"manifest sha256 {got[:12]}... is not the expected {want[:12]}...")
    if not m["tensors"]:
        raise WeightsError("the manifest lists no tensors")
    if len(m["tensors"]) > MAX_TENSORS:
        raise WeightsError(f"the manifest lists over {MAX_TENSORS} tensors")
    total = 0
    blocks = is_blocks(m)
    for n, e in m["tensors"].items():
        if not isinstance(n, str) or not n or len(n) > 256 or not isinstance(e, dict):
            raise WeightsError(f"the manifest has a malformed tensor entry {str(n)[:60]!r}")
        if blocks != ("gguf" in e):
            raise WeightsError(f"tensor {n}: some tensors of the manifest are GGUF blocks and some are not")
        if blocks and (not isinstance(e["gguf"], str) or not 0 < len(e["gguf"]) <= 256 or "/" in e["gguf"]):
            raise WeightsError(f"tensor {n}: its GGUF name {str(e['gguf'])[:60]!r} is malformed")
        known = GGML_DTYPES if blocks else _NP_DTYPES
        if not isinstance(e.get("dtype"), str) or e["dtype"] not in known:
            raise WeightsError(f"tensor {n} has an unsupported dtype {str(e.get('dtype'))[:20]!r}")
        shape = e.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_int(d) and d >= 0 for d in shape):
            raise WeightsError(f"tensor {n}: shape {str(shape)[:60]} is not a list of at most {MAX_DIMS} "
                               "non-negative integers")
        count = 1
        for d in shape:
            count *= d  # Python ints: no overflow
        if e["dtype"] in _NP_DTYPES:
            want_n = count * np.dtype(_NP_DTYPES[e["dtype"]]).itemsize
        else:  # GGUF blocks: whole rows of blocks of a matrix [out, in]
            fmt = e["dtype"].lower()
            if len(shape) != 2 or shape[1] % _gb.FORMATS[fmt][1]:
                raise WeightsError(f"tensor {n}: {e['dtype']} blocks need a matrix of rows of whole blocks, "
                                   f"got shape {shape}")
            want_n = shape[0] * _gb.row_bytes(fmt, shape[1])
        if want_n > MAX_TENSOR_BYTES:
            raise WeightsError(f"tensor {n}: shape {shape} is {want_n} bytes, over {MAX_TENSOR_BYTES}")
        if not _is_int(e.get("nbytes")) or want_n != e["nbytes"]:
            raise WeightsError(f"tensor {n}: {str(e.get('nbytes'))[:30]} bytes do not fit shape {shape}")
        if not _is_sha(e.get("sha256")):
            raise WeightsError(f"tensor {n}: sha256 is not 64 hex characters")
        total += want_n
    if total > MAX_RANGE_BYTES:
        raise WeightsError(f"the manifest's tensors hold {total} bytes, over {MAX_RANGE_BYTES}")
    for fn, e in m["files"].items():
        if fn not in CONFIG_FILES + HOST_FILES or "/" in fn:
            raise WeightsError(f"the manifest names an unexpected file {str(fn)[:60]!r}")
        if not isinstance(e, dict) or not _is_sha(e.get("sha256")):
            raise WeightsError(f"file {fn}: sha256 is not 64 hex characters")
    return m
