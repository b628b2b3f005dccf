"""wgpu backend: the numpy reference's forward as WGSL compute shaders (see :mod:`runtime.backends.wgsl`).

Runs on Vulkan: Mesa lavapipe on CPUs, vendor drivers on GPUs. The backend is forced to
Vulkan (``WGPU_BACKEND_TYPE=Vulkan`` unless set otherwise) and checked, so it never falls back
silently to another API.

Each public call is one command buffer, one submit and at most one read-back:

* ``forward``: upload residual -> layers -> read residual;
* ``embed_forward``: upload ids -> embedding gather -> layers -> read residual;
* ``head``: upload residual -> final norm + output head -> read logits;
* ``head_embed_forward`` (the host's decode step): upload the returning residual's last row
  -> norm + head -> arg-max -> the new token's embedding -> the host's layers -> read the
  residual and the token id. On one device this is the whole decode step.

A read-back waits for its own submission alone (:meth:`WgpuStage._read_after`: the submission's
index from ``wgpuQueueSubmitForIndex``, then ``wgpuDevicePoll`` with it), so submissions made
after it stay queued on the GPU.

Batches of tokens (prefill, verify laps) use 6 dispatches per layer: [norm+QKV], [RoPE + KV
write], [attention], [O-proj + residual], [norm + gate/up + SwiGLU], [down + residual].

One-token steps (decode) use 5, on adapters with subgroup operations (Vulkan 1.1 GPUs and
lavapipe): [norm + QKV + RoPE + KV write] (:func:`wgsl.matvec_src` with ``rope``), [attention]
(:func:`wgsl.attention1_src`), [O-proj + residual], [norm + gate/up + SwiGLU], [down + residual];
the host's head step adds [norm + head] and [arg-max + next token's embedding]. Each output row
is one subgroup's dot product (``subgroupAdd``), with no workgroup barrier. The passes are encoded
from a list prepared at construction, calling wgpu-native directly (about 0.5 us per command
instead of several through the Python wrappers).

Weights are stored as ``precision.weights`` (:mod:`runtime.precision`): ``f32``, ``f16`` (half the
bytes) or ``q8`` (int8 in blocks of 32 along each row, one float32 scale per block, 9 bits per
weight, filled by the numpy backend's :func:`runtime.backends.kernels.quantize_q8`, so both
backends compute one function per precision); the kernels widen them to float32 as they load
(:func:`wgsl.weight_decl`). Activations, norms, the KV cache and all sums are float32.
"""

from __future__ import annotations

import os
import time

import numpy as np

from ..config import ModelConfig
from ..weights import EMBED, FINAL_NORM, LM_HEAD
from . import wgsl
from ..precision import FLOAT32, Precision, check_backend
from .base import Stage, StageSpec, check_hidden, check_ids
from .kernels import quantize_q8
from .numpy_backend import rope_tables

F32 = np.float32
_DEVICE = None
def _runtime_dir() -> None:
    """Give the process a valid ``XDG_RUNTIME_DIR`` when it has none (a service, a test
    run, a container): the Vulkan loader's Wayland surface support looks it up when the
    adapter is made and prints ``error: XDG_RUNTIME_DIR is invalid or not set`` twice,
    which reads as a failure though compute needs no display. The directory is this
    user's own, mode 0700, as the XDG Base Directory Specification asks; an existing
    valid value is kept."""
    cur = os.environ.get("XDG_RUNTIME_DIR")
    if cur and os.path.isdir(cur):
        return
    import tempfile
    path = os.path.join(tempfile.gettempdir(), f"splitroom-runtime-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return
    st = os.lstat(path)
    import stat
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700:
        os.environ["XDG_RUNTIME_DIR"] = path


class WgpuUnavailable(RuntimeError):
    """No usable Vulkan adapter here (wgpu missing, no adapter, a bad adapter index): one line."""


#: environment variable choosing this process's adapter by index (see :func:`get_device`)
ADAPTER_ENV = "SPLITROOM_WGPU_ADAPTER"


def adapter_index() -> int | None:
    """The adapter index ``$SPLITROOM_WGPU_ADAPTER`` asks for (0-based, in the order of
    :func:`list_adapters`), or None when unset or empty.

    Raises:
        WgpuUnavailable: the value is not a whole number >= 0.
    """
    v = os.environ.get(ADAPTER_ENV, "").strip()
    if not v:
        return None
    if not v.isdigit():
        raise WgpuUnavailable(f"{ADAPTER_ENV} must be an adapter index (0, 1, ...), got {v!r}")
    return int(v)


def _adapters() -> list:
    """wgpu's adapters in its enumeration order, only Vulkan ones when ``WGPU_BACKEND_TYPE`` is Vulkan."""
    import wgpu

    found = wgpu.gpu.enumerate_adapters_sync()
    if os.environ.get("WGPU_BACKEND_TYPE") == "Vulkan":
        found = [a for a in found if "vulkan" in str(a.info.get("backend_type", "")).lower()]
    return found


def list_adapters() -> list[str]:
    """Summaries of the Vulkan adapters, in index order (what :data:`ADAPTER_ENV` picks from)."""
    os.environ.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    _runtime_dir()
    return [a.summary for a in _adapters()]


def get_device():
    """The process-wide ``(adapter, device)`` on Vulkan, created once.

    The adapter: the one at index ``$SPLITROOM_WGPU_ADAPTER`` of :func:`list_adapters` (Vulkan
    adapters in ``wgpu.gpu.enumerate_adapters_sync()``'s order) when that is set (one device process per GPU:
    each process is started with its own index), else wgpu's high-performance choice.

    Raises:
        WgpuUnavailable: wgpu is not installed, no Vulkan adapter exists, the index is past the
            adapters there are, or the adapter is not Vulkan.
    """
    global _DEVICE
    if _DEVICE is not None:
        return _DEVICE
    os.environ.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    _runtime_dir()
    try:
        import wgpu
    except ImportError as e:  # pragma: no cover
        raise WgpuUnavailable(f"the wgpu package is not installed: {e}") from e
    idx = adapter_index()
    try:
        if idx is None:
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        else:
            found = _adapters()
            if idx >= len(found):
                raise WgpuUnavailable(f"{ADAPTER_ENV}={idx}, but there are {len(found)} adapters: "
                                      + "; ".join(f"{i}: {a.summary}" for i, a in enumerate(found)))
            adapter = found[idx]
    except WgpuUnavailable:
        raise
    except Exception as e:
        raise WgpuUnavailable(f"no Vulkan adapter: {e}. Install mesa-vulkan-drivers (lavapipe).") from e
    backend = adapter.info.get("backend_type", "")
    if os.environ.get("WGPU_BACKEND_TYPE") == "Vulkan" and "vulkan" not in str(backend).lower():
        raise WgpuUnavailable(f"adapter {adapter.summary} is on {backend}, not Vulkan")
    lim = adapter.limits
    want = {
        "max-storage-buffer-binding-size": lim["max-storage-buffer-binding-size"],
        "max-buffer-size": lim["max-buffer-size"],
        "max-compute-workgroup-storage-size": min(lim["max-compute-workgroup-storage-size"], 32768),
        # the QKV product with attention fused (SPLITROOM_WGPU_FUSE_ATT) binds 10 storage buffers
        "max-storage-buffers-per-shader-stage": min(lim["max-storage-buffers-per-shader-stage"], 16),
    }
    feats = [f for f in ("subgroup", "timestamp-query", "timestamp-query-inside-passes") if f in adapter.features]
    device = adapter.request_device_sync(required_features=feats, required_limits=want)
    _DEVICE = (adapter, device)
    return _DEVICE


_SUBGROUP_SIZE: dict[int, int] = {}


def subgroup_size(device) -> int:
    """The subgroup size compute pipelines of ``device`` run with (NVIDIA 32, lavapipe 8): one
    dispatch of a probe kernel, cached per device; 0 without the ``subgroup`` feature. An adapter
    may give another pipeline another size (Vulkan's varying subgroup sizes); the kernels that
    depend on it (:func:`wgsl.attention_groups_src`: a multiple of 8 lanes; :func:`wgsl.matvec_src`
    ``split``: at least 4) are chosen only where this size allows them."""
    import wgpu

    if "subgroup" not in device.features:
        return 0
    if id(device) not in _SUBGROUP_SIZE:
        src = """@group(0) @binding(0) var<storage, read_write> O: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_size) s: u32) { if (i == 0u) { O[0] = s; } }
"""
        U = wgpu.BufferUsage
        o = device.create_buffer(size=16, usage=U.STORAGE | U.COPY_SRC)
        pipe = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=src), "entry_point": "main"})
        bg = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": o}}])
        enc = device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(1)
        cp.end()
        device.queue.submit([enc.finish()])
        _SUBGROUP_SIZE[id(device)] = int(np.frombuffer(device.queue.read_buffer(o), np.uint32)[0])
    return _SUBGROUP_SIZE[id(device)]


def adapter_summary() -> str:
    """Human-readable adapter name, e.g. ``llvmpipe (LLVM 15.0.6, 256 bits) (CPU) via Vulkan``."""
    return get_device()[0].summary


def format_counts(text: str, var: str, every) -> dict[str, int]:
    """A ``FORMAT:N[,FORMAT:N]`` or ``N`` setting (environment variable ``var``) as ``{format: N}``;
    a bare ``N`` applies to every format in ``every``. Raises ValueError (naming ``var``) on other text
    or a negative ``N``."""
    out: dict[str, int] = {}
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            if ":" in part:
                f, n = part.split(":", 1)
                out[f.strip()] = int(n)
            else:
                out.update({f: int(part) for f in every})
    except ValueError:
        raise ValueError(f"{var}={text!r}: expected FORMAT:N[,FORMAT:N] or N") from None
    if any(n < 0 for n in out.values()):
        raise ValueError(f"{var}={text!r}: a count cannot be negative")
    return out


def wide_settings(text: str) -> dict[str, int]:
    """``SPLITROOM_WGPU_WIDE``: which weight formats the one-token products read in 16-byte pieces
    (:func:`wgsl.matvec_src` ``wide``), and at most how many pieces a lane has in flight:
    ``"q4_k:8"`` (the default: Q4_K only, measured faster on the H200; f16 was not; Q4_K reads code
    words instead unless ``SPLITROOM_WGPU_WORDS=0``), ``"f16:8,q4_k:8"``, ``"8"`` (every format that
    has the form), ``"0"`` (none). Raises ValueError on other text."""
    return format_counts(text, "SPLITROOM_WGPU_WIDE", wgsl.WIDE_FORMATS)


def rows_settings(text: str) -> dict[str, int]:
    """``SPLITROOM_WGPU_RS``: rows each subgroup of a one-token product computes at once
    (:func:`wgsl.matvec_src` ``rs``; they share the lane's x loads): ``"q4_k:2,q6_k:2"`` (the
    default: faster on the H200 for Q4_K and Q4_K_M; f16, Q8_0 and Q4_1 were slower so), ``"2"``
    (every format), ``"1"`` (one row at a time). Raises ValueError on other text or N < 1."""
    out = format_counts(text, "SPLITROOM_WGPU_RS", wgsl.WEIGHT_FORMATS)
    if any(n < 1 for n in out.values()):
        raise ValueError(f"SPLITROOM_WGPU_RS={text!r}: rows per subgroup must be at least 1")
    return out


def words_settings(text: str) -> dict[str, int]:
    """``SPLITROOM_WGPU_WORDS``: formats whose one-token products read u32 code words, lanes on
    consecutive words (:func:`wgsl.matvec_src` ``words``; Q4_K only), and how many groups of words
    (``SPLITROOM_WGPU_LANE_WORDS`` consecutive words, default 2) a lane has in flight per row:
    ``"q4_k:4"`` (the default), ``"4"``, ``"0"`` (none: the 16-byte pieces of ``SPLITROOM_WGPU_WIDE``
    or the vec4 loader). Raises ValueError on other text."""
    return format_counts(text, "SPLITROOM_WGPU_WORDS", ("q4_k",))


def split_settings(text: str) -> dict[str, int]:
    """``SPLITROOM_WGPU_SPLIT``: formats whose one-token products take the workgroup-shared form
    (:func:`wgsl.matvec_src` ``split``: a workgroup's threads split the K of its rows and issue all
    their loads at once), and how many rows (row pairs in the QKV + RoPE product) a workgroup
    computes: ``"f16:8,q4_k:4"``, ``"8"`` (every format), ``"0"`` (none). The threads a workgroup
    has are at most ``SPLITROOM_WGPU_SPLIT_WG`` (default 256). Raises ValueError on other text."""
    return format_counts(text, "SPLITROOM_WGPU_SPLIT", wgsl.WEIGHT_FORMATS)


def flag_setting(var: str, default: str) -> bool:
    """An on/off setting ``$var`` (``1`` or ``0``; ``default`` when unset or empty). Raises
    ValueError (naming ``var``) on other text."""
    v = os.environ.get(var, "").strip() or default
    if v not in ("0", "1"):
        raise ValueError(f"{var}={v!r}: expected 0 or 1")
    return v == "1"


#: environment variable choosing how read-backs wait for the GPU (see :func:`wait_setting`)
WAIT_ENV = "SPLITROOM_WGPU_WAIT"


def wait_setting(text: str) -> str:
    """``SPLITROOM_WGPU_WAIT``: ``"index"`` (the default: a read-back waits for the one submission
    that wrote it, later ones stay queued) or ``"map"`` (wgpu-py's ``map_sync``, which waits for
    every submission made so far). Raises ValueError on other text."""
    v = text.strip() or "index"
    if v not in ("index", "map"):
        raise ValueError(f"{WAIT_ENV}={text!r}: expected index or map")
    return v


#: the one-token products :func:`split_rows_settings` names
PRODUCTS = ("qkv", "o", "gate_up", "down", "head")


def split_rows_settings(text: str) -> dict[str, int]:
    """``SPLITROOM_WGPU_SPLIT_ROWS``: rows a workgroup of the workgroup-shared form computes, per
    product rather than per format: ``"gate_up:2,head:8"`` (products of :data:`PRODUCTS`; QKV with
    RoPE counts row pairs), ``"2"`` (every product), ``""`` (the default: each format's
    ``SPLITROOM_WGPU_SPLIT`` count). It applies only to formats that have the shared form, and
    only where it divides that product's rows. Raises ValueError on other text, an unknown
    product or a count below 1."""
    out = format_counts(text, "SPLITROOM_WGPU_SPLIT_ROWS", PRODUCTS)
    bad = sorted(set(out) - set(PRODUCTS))
    if bad:
        raise ValueError(f"SPLITROOM_WGPU_SPLIT_ROWS={text!r}: unknown product {bad[0]!r} (expected one of {', '.join(PRODUCTS)})")
    if any(n < 1 for n in out.values()):
        raise ValueError(f"SPLITROOM_WGPU_SPLIT_ROWS={text!r}: rows a workgroup must be at least 1")
    return out


class WideOf(dict):
    """``{format: pieces}`` that answers 0 for formats not named (a tuple of parts included)."""

    def __missing__(self, key):
        return 0


class RowsOf(dict):
    """``{format: rows per subgroup}`` that answers 1 for formats not named (a tuple of parts included)."""

    def __missing__(self, key):
        return 1


def _mv_shape(name: str, default: tuple[int, int]) -> tuple[int, int]:
    """``(threads per workgroup, rows per workgroup)`` of the one-token products, from
    ``SPLITROOM_WGPU_<name>`` (``"128,4"``) if set: a tuning knob for benchmarks."""
    v = os.environ.get(f"SPLITROOM_WGPU_{name}")
    if not v:
        return default
    a, b = (int(x) for x in v.split(","))
    return a, b


class _Parts(list):
    """Buffers of one matrix's row blocks in different formats (bound at :func:`wgsl.part_binding`)."""


class WgpuStage(Stage):
    """Layers ``[spec.start, spec.end)`` on the GPU (or lavapipe), same API as :class:`NumpyStage`.

    Args:
        cfg, spec: model shape and layer range.
        weights: ``{hf_name: float32}`` from :func:`runtime.weights.load_range`; consumed.
        max_ctx: KV cache positions (allocated up front: ``2 * kv_dim * 4 B`` per layer per position;
            as much again per further cache slot used, :meth:`use_cache`, whose positions are
            copied in and out of the buffers the kernels bind when the slot changes).
        max_tokens: largest ``n`` of one GPU step; longer inputs are split into several steps.
        precision: storage (:class:`runtime.precision.Precision`): weights ``f32``, ``f16`` or ``q8``
            (see module doc); the KV cache is float32 (``kv="f32"``).
    Raises:
        WgpuUnavailable: no Vulkan adapter.
        ValueError: a weight exceeds the adapter's storage-buffer binding limit, or an unknown
            q8 with a row length that is not a multiple of 32.
        PrecisionError: a precision this backend does not store (``kv="f16"``).
    """

    def __init__(self, cfg: ModelConfig, spec: StageSpec, weights: dict[str, np.ndarray], max_ctx: int = 2048,
                 max_tokens: int = 64, precision: Precision = FLOAT32) -> None:
        import wgpu

        if not (0 <= spec.start <= spec.end <= cfg.n_layers):
            raise ValueError(f"layer range [{spec.start}, {spec.end}) outside [0, {cfg.n_layers})")
        check_backend("wgpu", precision)
        self.cfg, self.spec, self.max_ctx, self.max_tokens = cfg, spec, int(max_ctx), int(max_tokens)
        self.precision = precision
        fmt = precision.weights
        self._wgpu = wgpu
        self.adapter, self.device = get_device()
        self._limit = self.adapter.limits["max-storage-buffer-binding-size"]
        self._pos = 0
        self._spare: dict[str, object] = {}  # pre-encoded command buffers of repeated one-token steps
        c, dev, U = cfg, self.device, wgpu.BufferUsage
        H, D, KV, NH, F, V = c.hidden, c.head_dim, c.n_kv_heads, c.n_heads, c.ffn, c.vocab
        self.qkv_w = (NH + 2 * KV) * D
        T = self.max_tokens
        S = U.STORAGE | U.COPY_DST | U.COPY_SRC

        def buf(nbytes):
            return dev.create_buffer(size=max(16, int(nbytes)), usage=S)

        self.bytes_weights = 0

        def upload(a):
            a = np.ascontiguousarray(a)
            if a.nbytes > self._limit:
                raise ValueError(f"tensor of {a.nbytes} B exceeds the storage binding limit {self._limit} B")
            self.bytes_weights += a.nbytes
            return dev.create_buffer_with_data(data=a, usage=U.STORAGE)

        def vec(a):  # norms, tables: float32 whatever the format
            return upload(np.asarray(a, dtype=F32))

        def mat(*parts):
            """Matrix (row blocks concatenated) in this stage's format -> ([buffer, scales buffer or
            None] or _Parts of buffers, format for wgsl.weight_decl)."""
            if fmt == "gguf":
                return self._stored(parts, upload)
            a = np.concatenate(parts) if len(parts) > 1 else np.asarray(parts[0])
            a = np.asarray(a, dtype=F32)
            if fmt == "f32":
                return [upload(a), None], fmt
            if fmt == "f16":
                return [upload(a.astype(np.float16)), None], fmt
            q, d = quantize_q8(a)
            return [upload(q), upload(d * F32(127.0))], fmt

        self.x = buf(T * H * 4)  # residual
        self.hx = buf(T * H * 4)  # head input
        self.qkv = buf(T * self.qkv_w * 4)
        QD = c.q_dim  # attention width n_heads * head_dim (may differ from hidden: Qwen3)
        self.att = buf(T * QD * 4)
        self.act = buf(T * F * 4)
        self.ids = dev.create_buffer(size=max(16, T * 4), usage=S)
        self.params = dev.create_buffer(size=16, usage=U.UNIFORM | U.COPY_DST)
        cos, sin = rope_tables(c, self.max_ctx)
        self.rope = vec(np.concatenate([cos, sin], axis=1))
        self.staging_size = T * max(H, V if spec.host else H) * 4 + 16
        self.staging = dev.create_buffer(size=self.staging_size, usage=U.MAP_READ | U.COPY_DST)

        # batch pipelines: TB=1 for single-token steps without subgroups, TB=8 for batches
        # TB -> (TB, R): output rows R per workgroup; SPLITROOM_WGPU_ROWS overrides R of the
        # one-token kernels (4 by default)
        r1 = int(os.environ.get("SPLITROOM_WGPU_ROWS", "4"))
        self._variants = {1: (1, r1), 8: (8, 2)}
        mk = self._pipeline
        V_ = self._variants.values()
        # product pipelines per weight format (a GGUF may mix formats across layers and inside one)
        p_qkv = lambda f: {tb: mk(wgsl.matmul_src(H, self.qkv_w, r, tb, True, False, False, c.rms_eps, f, bias=c.qkv_bias)) for tb, r in V_}  # noqa: E731
        p_o = lambda f: {tb: mk(wgsl.matmul_src(QD, H, r, tb, False, True, False, fmt=f, bias=c.o_bias)) for tb, r in V_}  # noqa: E731
        p_gu = lambda f: {tb: mk(wgsl.matmul_src(H, F, r, tb, True, False, True, c.rms_eps, f)) for tb, r in V_}  # noqa: E731
        p_d = lambda f: {tb: mk(wgsl.matmul_src(F, H, r, tb, False, True, False, fmt=f)) for tb, r in V_}  # noqa: E731
        self.p_rope = mk(wgsl.rope_kv_src(NH, KV, D, c.qk_norm, c.rms_eps))
        self.p_att = mk(wgsl.attention_src(NH, KV, D, c.sliding_window))

        # one-token (decode) pipelines: subgroup kernels, 5 dispatches per layer
        # lavapipe runs these kernels about 2x slower than the batch ones (CPU "subgroups" are SIMD
        # lanes of one thread), so CPU adapters keep the batch kernels unless SPLITROOM_WGPU_FAST=1
        want = os.environ.get("SPLITROOM_WGPU_FAST", "auto")
        cpu = str(self.adapter.info.get("adapter_type", "")).lower() == "cpu"
        self.fast = "subgroup" in self.device.features and (want == "1" or (want == "auto" and not cpu))
        if self.fast:
            self.mv = _mv_shape("MV", (128, 4))
            wgs, rr = self.mv
            if (self.qkv_w // 2) % rr or H % rr or F % rr or D % 4:
                self.fast = False
        if self.fast:
            un = int(os.environ.get("SPLITROOM_WGPU_UNROLL", "8"))
            self.wide = wide_settings(os.environ.get("SPLITROOM_WGPU_WIDE", "q4_k:8"))
            # defaults measured on the H200 at the Llama-3B shape, 2026-12-02 (docs/benchmarks.md):
            # Q4_K as code words, 4 groups of 2 a lane in flight, Q4_K and Q6_K rows 2 a subgroup
            self.rows_sg = rows_settings(os.environ.get("SPLITROOM_WGPU_RS", "q4_k:2,q6_k:2"))
            self.words = words_settings(os.environ.get("SPLITROOM_WGPU_WORDS", "q4_k:4"))
            lane_words = os.environ.get("SPLITROOM_WGPU_LANE_WORDS", "2")
            if lane_words not in ("1", "2", "4"):
                raise ValueError(f"SPLITROOM_WGPU_LANE_WORDS={lane_words!r}: expected 1, 2 or 4 (Q4_K code words a lane)")
            sgs = subgroup_size(dev)
            # defaults measured on the H200 at the Llama-3B and SmolLM2 shapes, 2026-12-03 (docs/benchmarks.md):
            # the workgroup-shared form, 4 rows (row pairs) a workgroup, for the formats measured
            self.split = split_settings(os.environ.get("SPLITROOM_WGPU_SPLIT", "f16:4,q4_k:4,q6_k:4,q8_0:4,q4_1:4"))
            if sgs < 4:  # its workgroup memory holds the sums of at most threads / 4 subgroups
                self.split = {}
            # SPLITROOM_WGPU_Q4K_MANT=1: Q4_K codes of the shared form to floats through the mantissa
            # (wgsl._words_decl mant: one operation a weight fewer); 0 (the default): as before
            self.q4k_mant = flag_setting("SPLITROOM_WGPU_Q4K_MANT", "0")
            split_wg = int(os.environ.get("SPLITROOM_WGPU_SPLIT_WG", "256"))
            if split_wg < 32 or split_wg % 32:
                raise ValueError(f"SPLITROOM_WGPU_SPLIT_WG={split_wg}: expected a multiple of 32")
            wide_n, rs_n, words_n, split_n = WideOf(self.wide), RowsOf(self.rows_sg), WideOf(self.words), WideOf(self.split)
            rows_qkv = self.qkv_w if c.qk_norm else self.qkv_w // 2  # rows (or RoPE pairs) of the QKV product

            self.split_rows = split_rows_settings(os.environ.get("SPLITROOM_WGPU_SPLIT_ROWS", ""))
            own_rows = {"qkv": rows_qkv, "o": H, "gate_up": F, "down": H, "head": V if spec.host else 0}

            def form(f, ns=(rows_qkv, H, F), rows=rr, unroll=un, product=None):
                """This format's kernel form: rows per workgroup (``rows`` times the rows per subgroup,
                which fall back to 1 where they do not divide every product's rows ``ns``), loads; or the
                workgroup-shared form (``split``: that many rows a workgroup, where they divide every ``ns``).
                ``product`` (qkv, o, gate_up, down, head) takes its own shared rows from
                :attr:`split_rows` where the format has the shared form and they divide that product's rows."""
                sp = split_n[f]
                n_own = own_rows.get(product, 0)
                if sp and product in self.split_rows and n_own and n_own % self.split_rows[product] == 0:
                    sp, ns = self.split_rows[product], (n_own,)
                if sp and all(n % sp == 0 for n in ns):
                    return {"R": sp, "rs": 1, "U": unroll, "wide": 0, "words": 0, "lane_words": 1, "split": sp,
                            "split_wg": split_wg, "mant": self.q4k_mant}
                k = rs_n[f] if all(n % (rows * rs_n[f]) == 0 for n in ns) else 1
                return {"R": rows * k, "rs": k, "U": max(1, unroll // k), "wide": wide_n[f], "words": words_n[f],
                        "lane_words": int(lane_words) if words_n[f] else 1}

            self.kernel_form = form
            if c.qk_norm:  # per-head norms need whole heads: plain QKV rows, then the batch RoPE pass
                f_qkv = lambda f: mk(wgsl.matvec_src(H, self.qkv_w, WGS=wgs, fmt=f, norm=True, eps=c.rms_eps, bias=c.qkv_bias, **form(f, product="qkv")))  # noqa: E731
            else:
                f_qkv = lambda f: mk(wgsl.matvec_src(H, self.qkv_w, WGS=wgs, fmt=f, norm=True, rope=(NH, KV, D), eps=c.rms_eps, bias=c.qkv_bias, **form(f, product="qkv")))  # noqa: E731
            f_o = lambda f: mk(wgsl.matvec_src(QD, H, WGS=wgs, fmt=f, add=True, bias=c.o_bias, **form(f, product="o")))  # noqa: E731
            f_gu = lambda f: mk(wgsl.matvec_src(H, F, WGS=wgs, fmt=f, norm=True, swiglu=True, eps=c.rms_eps, **form(f, product="gate_up")))  # noqa: E731
            f_d = lambda f: mk(wgsl.matvec_src(F, H, WGS=wgs, fmt=f, add=True, **form(f, product="down")))  # noqa: E731
            chunk = min(int(os.environ.get("SPLITROOM_WGPU_ATT_CHUNK", "2048")), self.max_ctx)
            aw = int(os.environ.get("SPLITROOM_WGPU_ATT", "256"))
            # SPLITROOM_WGPU_ATT_GROUPS=N: the key-group attention (wgsl.attention_groups_src), N keys
            # a group takes each round; 0: the chunked kernel (wgsl.attention1_src)
            # (default 2, measured on the H200 2026-12-03, where the subgroup size allows the groups)
            groups = int(os.environ.get("SPLITROOM_WGPU_ATT_GROUPS", "2"))
            if groups < 0:
                raise ValueError(f"SPLITROOM_WGPU_ATT_GROUPS={groups}: keys a round cannot be negative")
            if groups and not wgsl.attention_groups_ok(D, sgs):
                groups = 0
            if groups:
                aw = max(32, aw // 32 * 32)
                self.f_att = mk(wgsl.attention_groups_src(NH, KV, D, aw, groups, c.sliding_window))
            else:
                aw = max(1, aw // (D // 4)) * (D // 4)
                self.f_att = mk(wgsl.attention1_src(NH, KV, D, aw, chunk, c.sliding_window))
            self.attention_form = {"groups": groups, "threads": aw}
            # SPLITROOM_WGPU_FUSE_ATT=1: the one-token attention runs inside the QKV + RoPE product's
            # dispatch (wgsl.matvec_src att: the last workgroup to write a head's rows attends it),
            # 4 dispatches a layer; where the QKV product has the shared form, RoPE and key groups
            self.fuse_att = (flag_setting("SPLITROOM_WGPU_FUSE_ATT", "0") and bool(groups) and not c.qk_norm
                             and "max-storage-buffers-per-shader-stage" in self.device.limits
                             and self.device.limits["max-storage-buffers-per-shader-stage"] >= 10)
            if self.fuse_att:
                self.att_cnt = buf(NH * 4)  # zeroed on creation; each head's count is set back to 0 by its attention

            def fuses(f):
                fm = form(f, product="qkv")
                return self.fuse_att and fm.get("split", 0) > 0 and (D // 2) % fm["R"] == 0

            self.fuses_att = fuses
            f_qkv_att = lambda f: mk(wgsl.matvec_src(H, self.qkv_w, WGS=wgs, fmt=f, norm=True, rope=(NH, KV, D), eps=c.rms_eps, bias=c.qkv_bias,  # noqa: E731
                                                     att=(0, groups, c.sliding_window), **form(f, product="qkv")))

        self.layers = []
        self._kv: list[tuple[object, object]] = []  # each layer's K and V cache buffers (the slot in use)
        self._kv_store: dict[int, list[tuple[object, object]]] = {}  # other slots' copies, by slot
        self.plan1: list[tuple[str, object, object, int]] = []  # one-token layer passes: (label, pipeline, bind group, groups)
        w = weights
        for a in w.values():
            assert (fmt == "gguf" and not isinstance(a, np.ndarray)) or a.dtype == F32, "weights must be float32"
        self.formats: set[str] = set()  # weight formats held (for reports)
        for i in range(spec.start, spec.end):
            p = f"model.layers.{i}."
            ln1, ln2 = vec(w.pop(p + "input_layernorm.weight")), vec(w.pop(p + "post_attention_layernorm.weight"))
            wqkv, fq = mat(w.pop(p + "self_attn.q_proj.weight"), w.pop(p + "self_attn.k_proj.weight"), w.pop(p + "self_attn.v_proj.weight"))
            wo, fo = mat(w.pop(p + "self_attn.o_proj.weight"))
            (wg, fg), (wu, fu) = mat(w.pop(p + "mlp.gate_proj.weight")), mat(w.pop(p + "mlp.up_proj.weight"))
            wd, fd = mat(w.pop(p + "mlp.down_proj.weight"))
            if fg != fu:  # gate and up share one kernel: both halves as parts of one signature
                raise ValueError(f"layer {i + 1}: gate ({fg}) and up ({fu}) in different formats are not computed on wgpu")
            pq, po, pg, pd = p_qkv(fq), p_o(fo), p_gu(fg), p_d(fd)
            a_ = p + "self_attn."
            bqkv = vec(np.concatenate([w.pop(a_ + "q_proj.bias"), w.pop(a_ + "k_proj.bias"), w.pop(a_ + "v_proj.bias")])) if c.qkv_bias else None
            bo = vec(w.pop(a_ + "o_proj.bias")) if c.o_bias else None
            qn, kn = (vec(w.pop(a_ + "q_norm.weight")), vec(w.pop(a_ + "k_norm.weight"))) if c.qk_norm else (None, None)
            kc, vc = buf(self.max_ctx * c.kv_dim * 4), buf(self.max_ctx * c.kv_dim * 4)
            self._kv.append((kc, vc))
            xb = {9: bqkv} if bqkv is not None else {}
            ob = {9: bo} if bo is not None else {}
            nb = {5: qn, 6: kn} if qn is not None else {}
            L = {}
            for tb in pq:
                L[("qkv", tb)] = (pq[tb], self._bind(pq[tb], {0: self.x, 1: wqkv, 2: self.qkv, 3: self.params, 4: ln1, **xb}))
                L[("o", tb)] = (po[tb], self._bind(po[tb], {0: self.att, 1: wo, 2: self.x, 3: self.params, **ob}))
                L[("gu", tb)] = (pg[tb], self._bind(pg[tb], {0: self.x, 1: wg, 2: self.act, 3: self.params, 4: ln2, 5: wu}))
                L[("d", tb)] = (pd[tb], self._bind(pd[tb], {0: self.act, 1: wd, 2: self.x, 3: self.params}))
            L["rope"] = self._bind(self.p_rope, {0: self.qkv, 1: kc, 2: vc, 3: self.rope, 4: self.params, **nb})
            L["att"] = self._bind(self.p_att, {0: self.qkv, 1: kc, 2: vc, 3: self.att, 4: self.params})
            self.layers.append(L)
            if self.fast:
                fq_, fo_, fg_, fd_ = f_qkv(fq), f_o(fo), f_gu(fg), f_d(fd)
                R_ = {pr: self.kernel_form(f, product=pr)["R"] for pr, f in (("qkv", fq), ("o", fo), ("gate_up", fg), ("down", fd))}  # rows a workgroup
                if c.qk_norm:
                    self.plan1 += [
                        ("qkv", fq_, self._bind(fq_, {0: self.x, 1: wqkv, 2: self.qkv, 4: ln1, **xb}), self.qkv_w // R_["qkv"]),
                        ("qk_norm_rope", self.p_rope, L["rope"], (NH + 2 * KV, 1)),
                    ]
                elif self.fuses_att(fq):
                    fa_ = f_qkv_att(fq)
                    self.plan1.append(("qkv_rope_att", fa_, self._bind(fa_, {0: self.x, 1: wqkv, 2: self.qkv, 3: self.params, 4: ln1,
                                                                             6: kc, 7: vc, 8: self.rope, 10: self.att, 11: self.att_cnt,
                                                                             **xb}), self.qkv_w // 2 // R_["qkv"]))
                else:
                    self.plan1.append(("qkv_rope", fq_, self._bind(fq_, {0: self.x, 1: wqkv, 2: self.qkv, 3: self.params, 4: ln1,
                                                                          6: kc, 7: vc, 8: self.rope, **xb}), self.qkv_w // 2 // R_["qkv"]))
                if not (not c.qk_norm and self.fuses_att(fq)):
                    self.plan1.append(
                        ("attention", self.f_att, self._bind(self.f_att, {0: self.qkv, 1: kc, 2: vc, 3: self.att, 4: self.params}), NH))
                self.plan1 += [
                    ("o_add", fo_, self._bind(fo_, {0: self.att, 1: wo, 2: self.x, **ob}), H // R_["o"]),
                    ("gate_up", fg_, self._bind(fg_, {0: self.x, 1: wg, 2: self.act, 4: ln2, 5: wu}), F // R_["gate_up"]),
                    ("down_add", fd_, self._bind(fd_, {0: self.act, 1: wd, 2: self.x}), H // R_["down"]),
                ]

        if spec.host:
            emb = w.pop(EMBED)
            head_w = emb if cfg.tie_embeddings else w.pop(LM_HEAD)
            self.emb, fe = mat(emb)
            self.head_w, fh = (self.emb, fe) if cfg.tie_embeddings else mat(head_w)
            del emb, head_w
            norm = vec(w.pop(FINAL_NORM))
            self.logits = buf(T * V * 4)
            p_embed = mk(wgsl.embed_src(H, fe))
            self.p_head = {tb: mk(wgsl.matmul_src(H, V, r, tb, True, False, False, c.rms_eps, fh)) for tb, r in self._variants.values()}
            p_arg = mk(wgsl.argmax_src(V))
            self.b_embed = (p_embed, self._bind(p_embed, {0: self.ids, 1: self.emb, 2: self.x, 3: self.params}))
            self.b_head = {tb: (self.p_head[tb], self._bind(self.p_head[tb], {0: self.hx, 1: self.head_w, 2: self.logits, 3: self.params, 4: norm})) for tb in self.p_head}
            self.b_arg = (p_arg, self._bind(p_arg, {0: self.logits, 1: self.ids}))
            if self.fast:
                hw, hr = _mv_shape("HEAD", (256, 8))
                while V % hr:
                    hr //= 2
                fm = self.kernel_form(fh, ns=(V,), rows=hr, unroll=int(os.environ.get("SPLITROOM_WGPU_UNROLL", "8")), product="head")
                hr = fm["R"]
                f_head = mk(wgsl.matvec_src(H, V, WGS=hw, fmt=fh, norm=True, eps=c.rms_eps, **fm))
                f_arg = mk(wgsl.argmax_embed_src(V, H, fe))
                # head on the uploaded residual (hx) or on the residual left in x by the last step
                self.fhead_hx = ("head", f_head, self._bind(f_head, {0: self.hx, 1: self.head_w, 2: self.logits, 4: norm}), V // hr)
                self.fhead_x = ("head", f_head, self._bind(f_head, {0: self.x, 1: self.head_w, 2: self.logits, 4: norm}), V // hr)
                self.fargmax = ("argmax_embed", f_arg, self._bind(f_arg, {0: self.logits, 1: self.ids, 2: self.x, 3: self.emb}), 1)
        w.clear()
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        self._ffi, self._lib = ffi, lib
        self.wait_mode = wait_setting(os.environ.get(WAIT_ENV, "index"))
        mapped: list[int] = []  # statuses of map requests made by _read_after, filled by their callback
        self._mapped = mapped  # (the callback holds the list, not the stage: no cycle keeping the buffers alive)
        self._map_cb = ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)",
                                    lambda status, msg, u1, u2: mapped.append(int(status)))
        self._map_info = ffi.new("WGPUBufferMapCallbackInfo *", {"mode": lib.WGPUCallbackMode_AllowProcessEvents,
                                                                 "callback": self._map_cb})
        self._index = ffi.new("WGPUSubmissionIndex *")

    def _swap_cache(self, old: int, new: int) -> None:
        """Copy the positions held of the caches in use into slot ``old``'s buffers and
        slot ``new``'s back (GPU copies in one submit, in queue order with the steps; the
        bind groups keep naming the buffers in use). A slot's buffers are made on first use."""
        row = self.cfg.kv_dim * 4
        held_old, held_new = self._pos * row, (self._slot_pos or {}).get(new, 0) * row
        if old not in self._kv_store:
            S = self._wgpu.BufferUsage.STORAGE | self._wgpu.BufferUsage.COPY_DST | self._wgpu.BufferUsage.COPY_SRC
            size = max(16, self.max_ctx * row)
            self._kv_store[old] = [(self.device.create_buffer(size=size, usage=S),
                                    self.device.create_buffer(size=size, usage=S)) for _ in self._kv]
        enc = self.device.create_command_encoder()
        for (kc, vc), (ks, vs) in zip(self._kv, self._kv_store[old]):
            if held_old:
                enc.copy_buffer_to_buffer(kc, 0, ks, 0, held_old)
                enc.copy_buffer_to_buffer(vc, 0, vs, 0, held_old)
        back = self._kv_store.get(new)
        if back is not None and held_new:
            for (kc, vc), (ks, vs) in zip(self._kv, back):
                enc.copy_buffer_to_buffer(ks, 0, kc, 0, held_new)
                enc.copy_buffer_to_buffer(vs, 0, vc, 0, held_new)
        self.device.queue.submit([enc.finish()])

    # ------------------------------------------------------------------ plumbing
    def _pipeline(self, src: str):
        """The compute pipeline of WGSL ``src`` (one per distinct source: layers in one format share it)."""
        cache = self.__dict__.setdefault("_pipes", {})
        if src not in cache:
            mod = self.device.create_shader_module(code=src)
            cache[src] = self.device.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
        return cache[src]

    def _stored(self, parts, upload):
        """Row blocks ``parts`` held as the GGUF stores them (float32 arrays, QTensors of blocks or
        f16 bits) -> (buffers, format for wgsl.weight_decl). Parts in one format are one buffer
        (their rows concatenated); mixed formats stay apart (:class:`_Parts`, a tuple format).
        Block bytes are uploaded as they are, padded to whole 4-byte words plus one."""
        def fmt_of(t):
            return "f32" if isinstance(t, np.ndarray) else t.fmt

        def raw(ts):
            if isinstance(ts[0], np.ndarray):
                return np.concatenate([np.asarray(t, F32) for t in ts]) if len(ts) > 1 else np.asarray(ts[0], F32)
            b = np.concatenate([t.data.reshape(-1) for t in ts])
            if ts[0].fmt == "f16":
                return b
            return np.concatenate([b, np.zeros(4 + (-b.size) % 4, np.uint8)])  # rd_*: one word past the end

        fmts = [fmt_of(t) for t in parts]
        for f in fmts:
            self.formats.add(f)
        if len(set(fmts)) == 1:
            return [upload(raw(list(parts))), None], fmts[0]
        groups: list[list] = []
        for t, f in zip(parts, fmts):
            if groups and fmt_of(groups[-1][0]) == f:
                groups[-1].append(t)
            else:
                groups.append([t])
        bufs = _Parts(upload(raw(g)) for g in groups)
        sig = tuple((fmt_of(g[0]), sum(int(t.shape[0]) * int(t.shape[1]) for t in g) // 4) for g in groups)
        return bufs, sig

    def _bind(self, pipeline, buffers: dict):
        """Bind group of ``{binding: buffer}``; a ``[matrix, scales]`` pair binds its scales at ``binding + 10``."""
        flat = {}
        for b, bf in buffers.items():
            if isinstance(bf, _Parts):
                for k, part in enumerate(bf):
                    flat[wgsl.part_binding(b, k)] = part
            elif isinstance(bf, list):
                flat[b] = bf[0]
                if bf[1] is not None:
                    flat[b + 10] = bf[1]
            else:
                flat[b] = bf
        entries = [{"binding": b, "resource": {"buffer": bf, "offset": 0, "size": bf.size}} for b, bf in sorted(flat.items())]
        return self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)

    def _submit(self, command_buffers: list) -> int:
        """Submit ``command_buffers`` in one queue submission; return its submission index
        (wgpu-native's ``wgpuQueueSubmitForIndex``, increasing), which :meth:`_read_after` waits for."""
        from wgpu.backends.wgpu_native._api import libf

        arr = self._ffi.new("WGPUCommandBuffer[]", [cb._internal for cb in command_buffers])
        return int(libf.wgpuQueueSubmitForIndex(self.device.queue._internal, len(command_buffers), arr))

    def _read_after(self, buf, index: int, spans: list[tuple[int, int]]) -> list[bytes]:
        """Bytes ``[(offset, nbytes)]`` of the mappable ``buf``, once submission ``index`` (from
        :meth:`_submit`, the last one writing them) has finished.

        With :attr:`wait_mode` ``"index"`` (the default) this thread polls the device for that
        submission alone (``wgpuDevicePoll`` with its index), so submissions made after it stay
        queued and the GPU keeps running them, then maps ``buf`` and unmaps it again through
        wgpu-native's calls. ``"map"``: wgpu-py's ``map_sync``, whose poll thread waits with no
        index, that is for every submission made so far (the queue runs dry on each read).
        Offsets must be multiples of 8 and sizes of 4 (WebGPU's mapping rules).

        Raises:
            RuntimeError: the mapping failed (its status and wgpu-native's message).
        """
        end = max(o + n for o, n in spans)
        if self.wait_mode == "map":
            buf.map_sync(self._wgpu.MapMode.READ, 0, end)
            try:
                return [bytes(buf.read_mapped(o, n, copy=False)) for o, n in spans]
            finally:
                buf.unmap()
        from wgpu.backends.wgpu_native._api import libf

        ffi, lib, dev = self._ffi, self._lib, self.device._internal
        self._index[0] = index
        lib.wgpuDevicePoll(dev, True, self._index)
        self._mapped.clear()
        libf.wgpuBufferMapAsync(buf._internal, lib.WGPUMapMode_Read, 0, end, self._map_info[0])
        for _ in range(100_000):  # the callback runs in one of these polls (or in wgpu-py's poll thread)
            if self._mapped:
                break
            lib.wgpuDevicePoll(dev, True, self._index)
        if self._mapped[:1] != [lib.WGPUMapAsyncStatus_Success]:
            raise RuntimeError(f"could not map a read-back buffer of {end} B (status {self._mapped[:1] or 'none'})")
        ptr = ffi.cast("char *", lib.wgpuBufferGetMappedRange(buf._internal, 0, end))
        try:
            return [ffi.buffer(ptr + o, n)[:] for o, n in spans]
        finally:
            lib.wgpuBufferUnmap(buf._internal)

    def _tb(self, n: int) -> int:
        return 1 if n == 1 else 8

    def _encode_plan(self, cp, plan, ts=None) -> None:
        """Encode ``plan`` [(label, pipeline, bind group, groups)] through wgpu-native's C calls.
        ``ts = (query_set, first_index)`` writes a timestamp after every dispatch (and one before)."""
        lib, null, h = self._lib, self._ffi.NULL, cp._internal
        setp, setb, disp = lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup, lib.wgpuComputePassEncoderDispatchWorkgroups
        if ts is None:
            last = None
            for _, p, b, g in plan:
                if p is not last:
                    setp(h, p._internal)
                    last = p
                setb(h, 0, b._internal, 0, null)
                if type(g) is int:
                    disp(h, g, 1, 1)
                else:
                    disp(h, g[0], g[1], 1)
        else:
            qs, q0 = ts
            cp._write_timestamp(qs, q0)
            for i, (_, p, b, g) in enumerate(plan):
                setp(h, p._internal)
                setb(h, 0, b._internal, 0, null)
                gx, gy = (g, 1) if type(g) is int else g
                disp(h, gx, gy, 1)
                cp._write_timestamp(qs, q0 + 1 + i)

    def _encode_layers(self, cp, n: int) -> None:
        if n == 1 and self.fast:
            self._encode_plan(cp, self.plan1)
            return
        tb = self._tb(n)
        r = self._variants[tb][1]
        ty = -(-n // tb)
        c = self.cfg
        for L in self.layers:
            cp.set_pipeline(L[("qkv", tb)][0]); cp.set_bind_group(0, L[("qkv", tb)][1]); cp.dispatch_workgroups(self.qkv_w // r, ty)  # noqa: E702
            cp.set_pipeline(self.p_rope); cp.set_bind_group(0, L["rope"]); cp.dispatch_workgroups(c.n_heads + 2 * c.n_kv_heads, n)  # noqa: E702
            cp.set_pipeline(self.p_att); cp.set_bind_group(0, L["att"]); cp.dispatch_workgroups(c.n_heads, n)  # noqa: E702
            cp.set_pipeline(L[("o", tb)][0]); cp.set_bind_group(0, L[("o", tb)][1]); cp.dispatch_workgroups(c.hidden // r, ty)  # noqa: E702
            cp.set_pipeline(L[("gu", tb)][0]); cp.set_bind_group(0, L[("gu", tb)][1]); cp.dispatch_workgroups(c.ffn // r, ty)  # noqa: E702
            cp.set_pipeline(L[("d", tb)][0]); cp.set_bind_group(0, L[("d", tb)][1]); cp.dispatch_workgroups(c.hidden // r, ty)  # noqa: E702

    def _encode_embed(self, cp, n: int) -> None:
        p, b = self.b_embed
        cp.set_pipeline(p); cp.set_bind_group(0, b); cp.dispatch_workgroups(-(-self.cfg.hidden // 256), n)  # noqa: E702

    def _encode_head(self, cp, n: int) -> None:
        if n == 1 and self.fast:
            self._encode_plan(cp, [self.fhead_hx])
            return
        tb = self._tb(n)
        p, b = self.b_head[tb]
        cp.set_pipeline(p); cp.set_bind_group(0, b); cp.dispatch_workgroups(self.cfg.vocab // self._variants[tb][1], -(-n // tb))  # noqa: E702

    def _run(self, n: int, first_pos: int, encode, reads: list[tuple[object, int]], reuse: str | None = None) -> list[np.ndarray]:
        """Write params, encode one compute pass with ``encode(pass)``, copy ``reads`` [(buffer, nbytes)]
        into the staging buffer, submit once, map, and return the byte ranges as float32/uint32 views.

        With ``reuse`` (a key naming a step whose commands never change: positions and inputs
        travel in buffers written before the submit), the command buffer comes from the previous
        call with that key, and the next one is encoded while the GPU runs this one, so the
        caller waits for the GPU alone, not for Python encoding as well.
        """
        q = self.device.queue
        q.write_buffer(self.params, 0, np.array([n, first_pos, 0, 0], np.uint32))
        off = 0
        spans = []
        for _, nbytes in reads:
            spans.append((off, nbytes))
            off += (nbytes + 255) // 256 * 256

        def build():
            enc = self.device.create_command_encoder()
            cp = enc.begin_compute_pass()
            encode(cp)
            cp.end()
            for (b, nbytes), (o, _) in zip(reads, spans):
                enc.copy_buffer_to_buffer(b, 0, self.staging, o, nbytes)
            return enc.finish()

        if reuse is None:
            index = self._submit([build()])
        else:
            spare = self._spare.pop(reuse, None)
            index = self._submit([spare if spare is not None else build()])
            self._spare[reuse] = build()  # for the next call, while the GPU works
        return self._read_after(self.staging, index, spans) if reads else []

    # ------------------------------------------------------------------ Stage API
    def forward(self, hidden: np.ndarray, first_pos: int) -> np.ndarray:
        x = check_hidden(hidden, self.cfg.hidden)
        self._check_pos(first_pos, x.shape[0])
        outs = []
        for i in range(0, x.shape[0], self.max_tokens):
            part = x[i : i + self.max_tokens]
            n = part.shape[0]
            self.device.queue.write_buffer(self.x, 0, part)
            (raw,) = self._run(n, first_pos + i, lambda cp, n=n: self._encode_layers(cp, n), [(self.x, n * self.cfg.hidden * 4)],
                               reuse="forward1" if n == 1 else None)
            outs.append(np.frombuffer(raw, F32).reshape(n, self.cfg.hidden))
            self._pos = first_pos + i + n
        return np.concatenate(outs) if len(outs) > 1 else outs[0].copy()

    def embed(self, ids) -> np.ndarray:
        self._require_host()
        a = check_ids(ids, self.cfg.vocab)
        outs = []
        for i in range(0, a.size, self.max_tokens):
            part = a[i : i + self.max_tokens].astype(np.uint32)
            n = part.size
            self.device.queue.write_buffer(self.ids, 0, part)
            (raw,) = self._run(n, 0, lambda cp: self._encode_embed(cp, n), [(self.x, n * self.cfg.hidden * 4)])
            outs.append(np.frombuffer(raw, F32).reshape(n, self.cfg.hidden))
        return np.concatenate(outs).astype(F32, copy=False) if len(outs) > 1 else outs[0].copy()

    def embed_forward(self, ids, first_pos: int) -> np.ndarray:
        self._require_host()
        a = check_ids(ids, self.cfg.vocab)
        self._check_pos(first_pos, a.size)
        outs = []
        for i in range(0, a.size, self.max_tokens):
            part = a[i : i + self.max_tokens].astype(np.uint32)
            n = part.size
            self.device.queue.write_buffer(self.ids, 0, part)

            def enc(cp, n=n):
                self._encode_embed(cp, n)
                self._encode_layers(cp, n)

            (raw,) = self._run(n, first_pos + i, enc, [(self.x, n * self.cfg.hidden * 4)])
            outs.append(np.frombuffer(raw, F32).reshape(n, self.cfg.hidden))
            self._pos = first_pos + i + n
        return np.concatenate(outs) if len(outs) > 1 else outs[0].copy()

    def head(self, hidden: np.ndarray) -> np.ndarray:
        self._require_host()
        x = check_hidden(hidden, self.cfg.hidden)
        outs = []
        V = self.cfg.vocab
        for i in range(0, x.shape[0], self.max_tokens):
            part = x[i : i + self.max_tokens]
            n = part.shape[0]
            self.device.queue.write_buffer(self.hx, 0, part)
            (raw,) = self._run(n, 0, lambda cp: self._encode_head(cp, n), [(self.logits, n * V * 4)])
            outs.append(np.frombuffer(raw, F32).reshape(n, V))
        return np.concatenate(outs) if len(outs) > 1 else outs[0].copy()

    def _encode_step(self, cp, from_x: bool) -> None:
        """Head on the residual (``x`` left by the last step, or the uploaded ``hx``), arg-max + embed, layers."""
        if self.fast:
            self._encode_plan(cp, [self.fhead_x if from_x else self.fhead_hx, self.fargmax] + self.plan1)
            return
        self._encode_head(cp, 1)
        pa, ba = self.b_arg
        cp.set_pipeline(pa); cp.set_bind_group(0, ba); cp.dispatch_workgroups(1)  # noqa: E702
        self._encode_embed(cp, 1)
        self._encode_layers(cp, 1)

    def head_embed_forward(self, hidden: np.ndarray, first_pos: int) -> tuple[int, np.ndarray]:
        """One submit: head on ``hidden[-1]``, arg-max, embed it, this stage's layers at ``first_pos``."""
        self._require_host()
        x = check_hidden(hidden, self.cfg.hidden)
        self._check_pos(first_pos, 1)
        self.device.queue.write_buffer(self.hx, 0, np.ascontiguousarray(x[-1:]))
        raw_x, raw_id = self._run(1, first_pos, lambda cp: self._encode_step(cp, False), [(self.x, self.cfg.hidden * 4), (self.ids, 4)],
                                  reuse="step")
        self._pos = first_pos + 1
        return int(np.frombuffer(raw_id, np.uint32)[0]), np.frombuffer(raw_x, F32).reshape(1, self.cfg.hidden).copy()

    def greedy_steps(self, hidden: np.ndarray, first_pos: int, steps: int, depth: int = 3, per_submit: int = 1,
                     stats: dict | None = None) -> tuple[list[int], np.ndarray]:
        """``steps`` greedy host steps on one device (the whole model here), pipelined: same result as
        ``steps`` calls of :meth:`head_embed_forward` feeding each returned residual to the next.

        Step ``i`` (head on the residual the last step left on the GPU, arg-max, embedding, layers
        at ``first_pos + i``) is encoded and submitted while earlier steps run; only token ids come
        back (4 bytes each), read ``depth - 1`` submits later, so the GPU never waits for Python.
        ``per_submit`` steps share one command buffer (positions are copied into the uniform from a
        table between their passes), which spreads the per-submit costs. ``stats``, if given,
        accumulates seconds spent encoding, submitting and waiting for ids.
        Returns ``(ids [steps], last residual [1, hidden] float32)``.

        Raises:
            PositionError: positions outside the cache. RuntimeError: not the host, or this stage
                does not hold every layer (the residual would have to leave the device each step).
            ValueError: ``steps`` < 1, ``per_submit`` outside 1..64 or ``depth`` < 1.
        """
        self._require_host()
        if not (1 <= per_submit <= 64) or depth < 1 or steps < 1:
            raise ValueError(f"need steps >= 1, per_submit in 1..64 and depth >= 1, got {steps}, {per_submit}, {depth}")
        if not self.fast:  # no subgroup kernels: plain steps, each read back
            out, h = [], hidden
            for i in range(steps):
                t, h = self.head_embed_forward(h, first_pos + i)
                out.append(t)
            return out, h
        if self.spec.start != 0 or self.spec.end != self.cfg.n_layers:
            raise RuntimeError("greedy_steps needs every layer on this stage; use head_embed_forward between stages")
        x = check_hidden(hidden, self.cfg.hidden)
        self._check_pos(first_pos, steps)
        wgpu, q, dev = self._wgpu, self.device.queue, self.device
        U = wgpu.BufferUsage
        if getattr(self, "_ring", None) is None or len(self._ring) < depth:
            self._ring = [dev.create_buffer(size=256, usage=U.MAP_READ | U.COPY_DST) for _ in range(depth)]
            self._postab = dev.create_buffer(size=4 * 64 * 16, usage=U.COPY_SRC | U.COPY_DST)
            self._hist = dev.create_buffer(size=256, usage=U.COPY_SRC | U.COPY_DST)
        st = stats if stats is not None else {}
        for k in ("encode_s", "submit_s", "wait_s"):
            st.setdefault(k, 0.0)
        q.write_buffer(self.x, 0, np.ascontiguousarray(x[-1:]))
        ids: list[int] = []
        pending: list[tuple[int, int, int]] = []  # (ring slot, ids in it, submission index)
        clock = time.perf_counter

        def collect():
            slot, n, index = pending.pop(0)
            t0 = clock()
            (raw,) = self._read_after(self._ring[slot], index, [(0, 4 * n)])
            ids.extend(int(v) for v in np.frombuffer(raw, np.uint32))
            st["wait_s"] += clock() - t0

        step_plan = [self.fhead_x, self.fargmax] + self.plan1
        nsub = 0
        for g0 in range(0, steps, per_submit):
            n = min(per_submit, steps - g0)
            if len(pending) == depth:
                collect()
            t0 = clock()
            slot = nsub % depth
            if per_submit == 1:
                q.write_buffer(self.params, 0, np.array([1, first_pos + g0, 0, 0], np.uint32))
            else:
                # positions of this submit's steps; written before the submit that copies them
                q.write_buffer(self._postab, (nsub % 4) * 1024, np.array([[1, first_pos + g0 + i, 0, 0] for i in range(n)], np.uint32))
            enc = dev.create_command_encoder()
            for i in range(n):
                if per_submit > 1:
                    enc.copy_buffer_to_buffer(self._postab, (nsub % 4) * 1024 + 16 * i, self.params, 0, 16)
                cp = enc.begin_compute_pass()
                self._encode_plan(cp, step_plan)
                cp.end()
                if n > 1:
                    enc.copy_buffer_to_buffer(self.ids, 0, self._hist, 4 * i, 4)
            if n > 1:
                enc.copy_buffer_to_buffer(self._hist, 0, self._ring[slot], 0, 4 * n)
            else:
                enc.copy_buffer_to_buffer(self.ids, 0, self._ring[slot], 0, 4)
            cb = enc.finish()
            t1 = clock()
            index = self._submit([cb])
            st["encode_s"] += t1 - t0
            st["submit_s"] += clock() - t1
            pending.append((slot, n, index))
            nsub += 1
            self._pos = first_pos + g0 + n
        while pending:
            collect()
        (raw,) = self._run(1, first_pos + steps - 1, lambda cp: None, [(self.x, self.cfg.hidden * 4)])
        return ids, np.frombuffer(raw, F32).reshape(1, self.cfg.hidden).copy()

    def step_gpu_us(self, first_pos: int, reps: int = 10) -> float:
        """GPU time of one whole greedy step at ``first_pos`` (timestamps at the start and end of its
        pass only, so no per-dispatch timestamp costs), median of ``reps``, in microseconds."""
        wgpu = self._wgpu
        plan = [self.fhead_x, self.fargmax] + self.plan1
        qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
        res = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        rd = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        ts = []
        for _ in range(reps):
            self.device.queue.write_buffer(self.params, 0, np.array([1, first_pos, 0, 0], np.uint32))
            enc = self.device.create_command_encoder()
            cp = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
            self._encode_plan(cp, plan)
            cp.end()
            enc.resolve_query_set(qs, 0, 2, res, 0)
            enc.copy_buffer_to_buffer(res, 0, rd, 0, 16)
            self.device.queue.submit([enc.finish()])
            rd.map_sync(wgpu.MapMode.READ, 0, 16)
            t = np.frombuffer(bytes(rd.read_mapped(0, 16, copy=False)), np.uint64)
            rd.unmap()
            ts.append(float(t[1] - t[0]) / 1e3)
        return float(np.median(ts))

    def kernel_times(self, first_pos: int, reps: int = 5) -> list[tuple[str, float]]:
        """GPU time of each dispatch of one greedy step at ``first_pos`` (head, arg-max + embed, then
        every layer's passes), from timestamp queries written between dispatches: ``[(label, us)]``,
        the median over ``reps`` runs. Leaves the cache holding ``first_pos + 1`` positions' garbage
        beyond :attr:`position` (roll back or overwrite). Needs the ``timestamp-query-inside-passes``
        feature and the subgroup kernels. Timestamps are taken as nanoseconds (Vulkan's
        ``timestampPeriod`` is 1 on NVIDIA and lavapipe; callers should check against wall time).
        """
        wgpu = self._wgpu
        if not self.fast or "timestamp-query-inside-passes" not in self.device.features:
            raise RuntimeError("kernel_times needs subgroup kernels and timestamp-query-inside-passes")
        plan = [self.fhead_x, self.fargmax] + self.plan1
        nq = len(plan) + 1
        qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=nq)
        res = self.device.create_buffer(size=nq * 8, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        rd = self.device.create_buffer(size=nq * 8, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        runs = []
        for _ in range(reps):
            self.device.queue.write_buffer(self.params, 0, np.array([1, first_pos, 0, 0], np.uint32))
            enc = self.device.create_command_encoder()
            cp = enc.begin_compute_pass()
            self._encode_plan(cp, plan, ts=(qs, 0))
            cp.end()
            enc.resolve_query_set(qs, 0, nq, res, 0)
            enc.copy_buffer_to_buffer(res, 0, rd, 0, nq * 8)
            self.device.queue.submit([enc.finish()])
            rd.map_sync(wgpu.MapMode.READ, 0, nq * 8)
            t = np.frombuffer(bytes(rd.read_mapped(0, nq * 8, copy=False)), np.uint64).astype(np.float64)
            rd.unmap()
            runs.append(np.diff(t) / 1e3)
        med = np.median(np.array(runs), axis=0)
        return [(lab, float(us)) for (lab, *_), us in zip(plan, med)]
