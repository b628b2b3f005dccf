"""A browser tab that holds layers: what its WebGPU stage (``static/tab_stage.js``) is given.

The tab runs the same WGSL compute shaders as the wgpu backend: :func:`stage_bundle`
generates them with :mod:`runtime.backends.wgsl` for the model's sizes (one source;
the page never holds a copy of its own), and lists the dispatch plan the wgpu backend's
batch path encodes per layer (runtime/backends/wgpu_backend.py ``_encode_layers``):
fused RMSNorm + QKV product, RoPE into the KV cache, attention over the cache, output
product + residual, fused RMSNorm + SwiGLU gate/up, down product + residual. One-token
steps use the ``TB = 1`` variants, batches ``TB = 8``, as the wgpu backend's batch path.

The tab lays the range's float32 tensors out in one buffer as the bundle's ``tensors``
list says (byte offsets, shapes, the model's tensors each concatenates), with the RoPE
table ``[max_ctx, head_dim]`` that the bundle carries (:func:`rope_table`). The tensors
themselves come over the tab's ``weights`` data channel from the model host
(:meth:`TabRoom.serve`, runtime/weights_share's protocol), checked against the manifest
sha256 the bundle gives.

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


def rope_table(cfg: ModelConfig) -> bytes:
    """The RoPE table a tab uploads, float32 ``[MAX_CTX, head_dim]`` (cos then sin halves
    per position, as the wgpu backend uploads it; runtime.backends.numpy_backend.rope_tables)."""
    cos, sin = rope_tables(cfg, MAX_CTX)
    return np.ascontiguousarray(np.concatenate([cos, sin], axis=1), np.float32).tobytes()


class TabRoom:
    """What a served room tells a tab that joins it as a worker (``share.html?layers=A-B``):
    where the devices meet, the bundle of its range, and the weights of that range over
    the tab's ``weights`` data channel (:meth:`serve`).

    A tab names its device id and range when it asks for its bundle (``/tab/bundle.json
    ?layers=A-B&device=ID``); from then on that device may take that range's tensors, and
    only those, from the host's weights server (:meth:`grant`). The bundle carries the
    range's manifest sha256, which the tab checks the manifest it receives over the
    channel against (the value does not come from the channel).

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
        self._cache: dict = {}  # the last range asked for: (start, end) -> bundle
        #: device id -> (start, end) 0-based half-open: the range its bundle was asked for
        self.tabs: dict[str, tuple[int, int]] = {}

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

    def served(self, start: int, end: int) -> dict:
        """The bundle of layers ``[start, end)`` (:func:`stage_bundle`) with
        ``manifest_sha256`` (runtime.weights_share.make_manifest of the range, no embedding
        or head) and the RoPE table base64-encoded under ``rope.b64`` (:func:`rope_table`);
        the last range kept. Raises ValueError as :func:`stage_bundle`, WeightsError when
        the model directory lacks the range."""
        import base64

        from ..weights_share import make_manifest
        key = (start, end)
        if key not in self._cache:
            cfg = self._cfg or ModelConfig.load(self.model_dir)
            bundle = stage_bundle(cfg, start, end)
            bundle["manifest_sha256"] = make_manifest(self.model_dir, start, end, False, False)["sha256"]
            bundle["rope"]["b64"] = base64.b64encode(rope_table(cfg)).decode()
            self._cache = {key: bundle}
        return self._cache[key]

    def grant(self, peer: str) -> tuple[int, int, bool, bool] | None:
        """The range ``peer`` may copy from the host, ``(start, end, False, False)``, or
        None when it asked for no bundle (not a tab): a ``grant`` for
        :func:`runtime.weights_share.serve_weights`."""
        r = self.tabs.get(peer)
        return None if r is None else (r[0], r[1], False, False)

    def serve(self, transport):
        """Answer the tabs' weights requests on ``transport`` (the host's room transport;
        before the Node's own weights server subscribes, so this one is asked first): a
        :class:`runtime.weights_share.WeightsServer` of the model directory with
        :meth:`grant`; requests from other peers are not taken (they go to the next
        subscriber or the handler). ``close()`` it at the end."""
        from ..weights_share import serve_weights
        return serve_weights(transport, self.model_dir, grant=self.grant)


def add_tab_routes(app, server) -> None:
    """Routes for a tab that holds layers, on a room server's application: the scripts
    ``/tab_worker.js`` and ``/static/tab_stage.js``, and ``/tab/bundle.json?layers=A-B
    &device=ID`` (1-based inclusive; the device id the tab joins the room as), which also
    grants that device the range's weights (:meth:`TabRoom.grant`). ``server.tab_room``
    (a :class:`TabRoom`, or None: 503) says where they come from. A bad ``layers`` or
    ``device`` is a 400 naming it; a model the tab cannot compute, a 400 saying why."""
    import asyncio
    import re
    from pathlib import Path

    from aiohttp import web

    static = Path(__file__).parent / "static"

    def script(name: str):
        async def handler(_r):
            return web.Response(body=(static / name).read_bytes(), content_type="text/javascript", charset="utf-8")
        return handler

    async def bundle_json(request):
        tab = getattr(server, "tab_room", None)
        if tab is None:
            return web.json_response({"error": "this room takes no tabs that hold layers"}, status=503)
        device = request.query.get("device", "")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", device):
            return web.json_response({"error": "device: 1-64 letters, digits, . _ - (the id the tab joins as)"},
                                     status=400)
        try:
            start, end = tab.range_of(request.query.get("layers", ""))
            got = await asyncio.get_running_loop().run_in_executor(None, tab.served, start, end)
        except ValueError as e:
            return web.json_response({"error": f"layers: {e}"}, status=400)
        tab.tabs[device] = (start, end)
        return web.json_response(got)

    app.router.add_get("/tab_worker.js", script("tab_worker.js"))
    app.router.add_get("/static/tab_stage.js", script("tab_stage.js"))
    app.router.add_get("/tab/bundle.json", bundle_json)
