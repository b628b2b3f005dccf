"""A browser tab that holds layers: what its WebGPU stage (``static/tab_stage.js``) is given.

The tab runs the same WGSL compute shaders as the wgpu backend: :func:`stage_bundle`
generates them with :mod:`runtime.backends.wgsl` for the model's sizes (one source;
the page never holds a copy of its own), and lists the dispatch plan the wgpu backend's
batch path encodes per layer (runtime/backends/wgpu_backend.py ``_encode_layers``):
fused RMSNorm + QKV product, RoPE into the KV cache, attention over the cache, output
product + residual, fused RMSNorm + SwiGLU gate/up, down product + residual. One-token
steps use the ``TB = 1`` variants, batches ``TB = 8``, as the wgpu backend's batch path.

:func:`stage_weights` packs a range's float32 tensors in the order the bundle's
``tensors`` list gives (byte offsets and shapes there), with the RoPE table
``[max_ctx, head_dim]`` (cos then sin halves per position, as the wgpu backend uploads it).

Only float32 weights and a model without q/k norms, biases or a sliding window are
offered (SmolLM2's kind); :func:`stage_bundle` raises ValueError for the rest.
"""

from __future__ import annotations

import numpy as np

from ..backends import wgsl
from ..backends.numpy_backend import rope_tables
from ..config import ModelConfig
from ..control import HOST_WAIT_S

#: tokens one dispatch handles at most (the wgpu backend's default ``max_tokens``)
MAX_TOKENS = 64
#: positions the tab's KV cache holds
MAX_CTX = 2048
#: ``TB -> R`` of the batch kernels (wgpu_backend: ``{1: (1, 4), 8: (8, 2)}``)
VARIANTS = {1: 4, 8: 2}
#: the per-layer tensors in the packed order: (name in the bundle, hf names concatenated)
_LAYER_TENSORS = (
    ("ln1", ("input_layernorm.weight",)),
    ("wqkv", ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")),
    ("wo", ("self_attn.o_proj.weight",)),
    ("ln2", ("post_attention_layernorm.weight",)),
    ("wg", ("mlp.gate_proj.weight",)),
    ("wu", ("mlp.up_proj.weight",)),
    ("wd", ("mlp.down_proj.weight",)),
)


def _check(cfg: ModelConfig) -> None:
    unsupported = [n for n, on in (("q/k norms", cfg.qk_norm), ("q/k/v biases", cfg.qkv_bias),
                                   ("an output bias", cfg.o_bias), ("a sliding window", cfg.sliding_window))
                   if on]
    if unsupported:
        raise ValueError(f"a browser tab stage does not compute {', '.join(unsupported)}")


def stage_bundle(cfg: ModelConfig, start: int, end: int) -> dict:
    """What the tab needs besides the weights, JSON-ready: sizes, the kernels' WGSL source
    per pipeline and variant, the dispatch grid of each, and the packed tensors' layout
    (each packed tensor's ``parts``: the model's tensors it concatenates, in order, so a
    tab can check each part's bytes against the range's weights manifest).

    Args:
        cfg: the model's configuration; ``start``, ``end``: the layers, 0-based half-open.
    Raises:
        ValueError: a range outside the model, or a model feature the tab does not compute.
    """
    if not 0 <= start < end <= cfg.n_layers:
        raise ValueError(f"layers [{start}, {end}) outside [0, {cfg.n_layers})")
    _check(cfg)
    c = cfg
    H, D, KV, NH, F = c.hidden, c.head_dim, c.n_kv_heads, c.n_heads, c.ffn
    qkv_w, QD = (NH + 2 * KV) * D, c.q_dim
    kernels = {str(tb): {
        "qkv": wgsl.matmul_src(H, qkv_w, r, tb, True, False, False, c.rms_eps),
        "o": wgsl.matmul_src(QD, H, r, tb, False, True, False),
        "gu": wgsl.matmul_src(H, F, r, tb, True, False, True, c.rms_eps),
        "d": wgsl.matmul_src(F, H, r, tb, False, True, False),
    } for tb, r in VARIANTS.items()}
    tensors, off = [], 0
    for i in range(start, end):
        for name, parts in _LAYER_TENSORS:
            rows = sum(_rows(c, p) for p in parts)
            cols = _cols(c, parts[0])
            shape = [rows, cols] if cols else [rows]
            n = rows * (cols or 1)
            tensors.append({"layer": i, "name": name, "offset": off, "shape": shape,
                            "parts": [f"model.layers.{i}.{p}" for p in parts]})
            off += n * 4
    rope_off = off
    off += MAX_CTX * D * 4
    return {"hidden": H, "head_dim": D, "n_heads": NH, "n_kv_heads": KV, "ffn": F, "qkv_width": qkv_w,
            "q_dim": QD, "kv_dim": c.kv_dim, "start": start, "end": end, "max_tokens": MAX_TOKENS,
            "max_ctx": MAX_CTX, "variants": {str(tb): r for tb, r in VARIANTS.items()}, "kernels": kernels,
            "rope_kernel": wgsl.rope_kv_src(NH, KV, D), "attention_kernel": wgsl.attention_src(NH, KV, D),
            "tensors": tensors, "rope": {"offset": rope_off, "shape": [MAX_CTX, D]}, "bytes": off}


def _rows(c: ModelConfig, part: str) -> int:
    return {"input_layernorm.weight": c.hidden, "post_attention_layernorm.weight": c.hidden,
            "self_attn.q_proj.weight": c.q_dim, "self_attn.k_proj.weight": c.kv_dim,
            "self_attn.v_proj.weight": c.kv_dim, "self_attn.o_proj.weight": c.hidden,
            "mlp.gate_proj.weight": c.ffn, "mlp.up_proj.weight": c.ffn, "mlp.down_proj.weight": c.hidden}[part]


def _cols(c: ModelConfig, part: str) -> int:
    return {"input_layernorm.weight": 0, "post_attention_layernorm.weight": 0,
            "self_attn.q_proj.weight": c.hidden, "self_attn.o_proj.weight": c.q_dim,
            "mlp.gate_proj.weight": c.hidden, "mlp.up_proj.weight": c.hidden, "mlp.down_proj.weight": c.ffn}[part]


def stage_weights(cfg: ModelConfig, weights: dict[str, np.ndarray], start: int, end: int) -> bytes:
    """The packed float32 bytes of layers ``[start, end)`` and the RoPE table, laid out as
    :func:`stage_bundle`'s ``tensors`` and ``rope`` say. ``weights``: ``{hf_name: float32
    array}`` (runtime.weights.load_range). Raises KeyError for a missing tensor and
    ValueError for a shape that is not the configuration's."""
    bundle = stage_bundle(cfg, start, end)
    out = bytearray(bundle["bytes"])
    by = {(t["layer"], t["name"]): t for t in bundle["tensors"]}
    for i in range(start, end):
        for name, parts in _LAYER_TENSORS:
            a = np.concatenate([np.asarray(weights[f"model.layers.{i}.{p}"], np.float32) for p in parts])
            t = by[(i, name)]
            if list(a.shape) != t["shape"]:
                raise ValueError(f"layer {i} {name}: shape {list(a.shape)}, the configuration says {t['shape']}")
            out[t["offset"]:t["offset"] + a.nbytes] = np.ascontiguousarray(a).tobytes()
    cos, sin = rope_tables(cfg, MAX_CTX)
    rope = np.ascontiguousarray(np.concatenate([cos, sin], axis=1), np.float32)
    out[bundle["rope"]["offset"]:bundle["rope"]["offset"] + rope.nbytes] = rope.tobytes()
    return bytes(out)


TAB_PAGE = """<!doctype html>
<meta charset="utf-8"><title>splitroom tab stage</title>
<p id="status">Loading</p>
<script type="module">
import { TabStage } from "/static/tab_stage.js";
window.tab = { ready: false, error: null };
(async () => {
  const bundle = await (await fetch("/tab/bundle.json")).json();
  const weights = await (await fetch("/tab/weights.bin")).arrayBuffer();
  window.tab.stage = await TabStage.create(bundle, weights);
  window.tab.ready = true;
  document.getElementById("status").textContent =
    `Serving · Layers ${bundle.start + 1}-${bundle.end} · ${(weights.byteLength / 1e6).toFixed(0)} MB`;
})().catch((e) => { window.tab.error = String(e); document.getElementById("status").textContent = String(e); });
</script>
"""


def make_app(bundle: dict, weights: bytes):
    """An aiohttp application serving a tab stage: ``/tab.html`` (loads ``bundle`` and
    ``weights`` into :class:`TabStage` and sets ``window.tab.ready``, or ``.error``),
    ``/static/tab_stage.js``, ``/tab/bundle.json`` and ``/tab/weights.bin``."""
    from pathlib import Path

    from aiohttp import web

    static = Path(__file__).parent / "static"

    async def page(_r):
        return web.Response(text=TAB_PAGE, content_type="text/html")

    async def script(_r):
        return web.FileResponse(static / "tab_stage.js", headers={"Content-Type": "text/javascript"})

    async def bundle_json(_r):
        return web.json_response(bundle)

    async def weights_bin(_r):
        return web.Response(body=weights, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/tab.html", page)
    app.router.add_get("/static/tab_stage.js", script)
    app.router.add_get("/tab/bundle.json", bundle_json)
    app.router.add_get("/tab/weights.bin", weights_bin)
    return app


class TabRoom:
    """What a served room tells a tab that joins it as a worker (``share.html?layers=A-B``):
    where the devices meet, and the model directory its range's weights come from.

    Args:
        relay: the relay's ``ws://ADDR:PORT``; ``room``: the room's name; ``host``: the
            model host's device id; ``model_dir``: the host's safetensors directory.
        ice_servers: ``RTCIceServer`` dictionaries; ``relay_only``: TURN relay candidates only.
        host_wait_s: seconds a tab that lost the model host keeps its layers and waits for
            it ("Host reconnecting"), as a Python worker's ``NodeConfig.host_wait_s``.
    """

    def __init__(self, relay: str, room: str, host: str, model_dir: str, ice_servers=(), relay_only: bool = False,
                 host_wait_s: float = HOST_WAIT_S):
        self.relay, self.room, self.host, self.model_dir = relay, room, host, model_dir
        self.ice_servers, self.relay_only = list(ice_servers), bool(relay_only)
        self.host_wait_s = float(host_wait_s)
        self._cfg = None
        self._cache: dict = {}  # the last range asked for: (start, end) -> (bundle, weights, manifest)

    def info(self) -> dict:
        """What the page reads from ``/api/room`` (``tab``): relay, room, host, ICE servers,
        how long to wait for a host that left (seconds)."""
        return {"relay": self.relay, "room": self.room, "host": self.host, "ice_servers": self.ice_servers,
                "relay_only": self.relay_only, "host_wait_s": self.host_wait_s}

    def range_of(self, text: str) -> tuple[int, int]:
        """Layers ``A-B`` (1-based inclusive, as a person types them) as ``(start, end)``
        0-based half-open. Raises ValueError naming what is wrong."""
        from planner.deal import parse_layers
        if self._cfg is None:
            self._cfg = ModelConfig.load(self.model_dir)
        return parse_layers(text, self._cfg.n_layers)

    def served(self, start: int, end: int) -> tuple[dict, bytes, dict]:
        """``(bundle, packed weights, manifest)`` of layers ``[start, end)``, the last range kept."""
        from ..weights import load_range
        from ..weights_share import make_manifest
        key = (start, end)
        if key not in self._cache:
            cfg = self._cfg or ModelConfig.load(self.model_dir)
            bundle = stage_bundle(cfg, start, end)
            weights = stage_weights(cfg, load_range(self.model_dir, start, end, False, False), start, end)
            self._cache = {key: (bundle, weights, make_manifest(self.model_dir, start, end, False, False))}
        return self._cache[key]


def add_tab_routes(app, server) -> None:
    """Routes for a tab that holds layers, on a room server's application: the scripts
    ``/tab_worker.js`` and ``/static/tab_stage.js``, and per range ``/tab/bundle.json``,
    ``/tab/weights.bin`` and ``/tab/manifest.json`` (``?layers=A-B``, 1-based inclusive).
    ``server.tab_room`` (a :class:`TabRoom`, or None: 503) says where they come from.
    A bad ``layers`` is a 400 naming it; a model the tab cannot compute, a 400 saying why."""
    import asyncio
    from pathlib import Path

    from aiohttp import web

    static = Path(__file__).parent / "static"

    def script(name: str):
        async def handler(_r):
            return web.Response(body=(static / name).read_bytes(), content_type="text/javascript", charset="utf-8")
        return handler

    def ranged(pick):
        async def handler(request):
            tab = getattr(server, "tab_room", None)
            if tab is None:
                return web.json_response({"error": "this room takes no tabs that hold layers"}, status=503)
            try:
                start, end = tab.range_of(request.query.get("layers", ""))
                got = await asyncio.get_running_loop().run_in_executor(None, tab.served, start, end)
            except ValueError as e:
                return web.json_response({"error": f"layers: {e}"}, status=400)
            return pick(got)
        return handler

    app.router.add_get("/tab_worker.js", script("tab_worker.js"))
    app.router.add_get("/static/tab_stage.js", script("tab_stage.js"))
    app.router.add_get("/tab/bundle.json", ranged(lambda g: web.json_response(g[0])))
    app.router.add_get("/tab/weights.bin", ranged(lambda g: web.Response(body=g[1],
                                                                         content_type="application/octet-stream")))
    app.router.add_get("/tab/manifest.json", ranged(lambda g: web.json_response(g[2])))
