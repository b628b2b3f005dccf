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

Per layer, 6 dispatches: [norm+QKV], [RoPE + KV write], [attention], [O-proj + residual],
[norm + gate/up + SwiGLU], [down + residual]. All activations are float32.
"""

from __future__ import annotations

import os

import numpy as np

from ..config import ModelConfig
from ..weights import EMBED, FINAL_NORM, LM_HEAD
from . import wgsl
from .base import Stage, StageSpec, check_hidden, check_ids
from .numpy_backend import rope_tables

F32 = np.float32
_DEVICE = None


class WgpuUnavailable(RuntimeError):
    """No Vulkan adapter (install Mesa's lavapipe, Debian ``mesa-vulkan-drivers``, or a GPU driver)."""


def get_device():
    """The process-wide ``(adapter, device)`` on Vulkan, created once.

    Raises:
        WgpuUnavailable: wgpu is not installed, no Vulkan adapter exists, or the adapter is not Vulkan.
    """
    global _DEVICE
    if _DEVICE is not None:
        return _DEVICE
    os.environ.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    try:
        import wgpu
    except ImportError as e:  # pragma: no cover
        raise WgpuUnavailable(f"the wgpu package is not installed: {e}") from e
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
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
    }
    device = adapter.request_device_sync(required_limits=want)
    _DEVICE = (adapter, device)
    return _DEVICE


def adapter_summary() -> str:
    """Human-readable adapter name, e.g. ``llvmpipe (LLVM 15.0.6, 256 bits) (CPU) via Vulkan``."""
    return get_device()[0].summary


class WgpuStage(Stage):
    """Layers ``[spec.start, spec.end)`` on the GPU (or lavapipe), same API as :class:`NumpyStage`.

    Args:
        cfg, spec: model shape and layer range.
        weights: ``{hf_name: float32}`` from :func:`runtime.weights.load_range`; consumed.
        max_ctx: KV cache positions (allocated up front: ``2 * kv_dim * 4 B`` per layer per position).
        max_tokens: largest ``n`` of one GPU step; longer inputs are split into several steps.
    Raises:
        WgpuUnavailable: no Vulkan adapter.
        ValueError: a weight exceeds the adapter's storage-buffer binding limit.
    """

    def __init__(self, cfg: ModelConfig, spec: StageSpec, weights: dict[str, np.ndarray], max_ctx: int = 2048, max_tokens: int = 64) -> None:
        import wgpu

        if not (0 <= spec.start <= spec.end <= cfg.n_layers):
            raise ValueError(f"layer range [{spec.start}, {spec.end}) outside [0, {cfg.n_layers})")
        self.cfg, self.spec, self.max_ctx, self.max_tokens = cfg, spec, int(max_ctx), int(max_tokens)
        self._wgpu = wgpu
        self.adapter, self.device = get_device()
        self._limit = self.adapter.limits["max-storage-buffer-binding-size"]
        self._pos = 0
        c, dev, U = cfg, self.device, wgpu.BufferUsage
        H, D, KV, NH, F, V = c.hidden, c.head_dim, c.n_kv_heads, c.n_heads, c.ffn, c.vocab
        self.qkv_w = (NH + 2 * KV) * D
        T = self.max_tokens
        S = U.STORAGE | U.COPY_DST | U.COPY_SRC

        def buf(nbytes):
            return dev.create_buffer(size=max(16, int(nbytes)), usage=S)

        self.bytes_weights = 0

        def wbuf(a):
            a = np.ascontiguousarray(a, dtype=F32)
            if a.nbytes > self._limit:
                raise ValueError(f"tensor of {a.nbytes} B exceeds the storage binding limit {self._limit} B")
            self.bytes_weights += a.nbytes
            return dev.create_buffer_with_data(data=a, usage=U.STORAGE)

        self.x = buf(T * H * 4)  # residual
        self.hx = buf(T * H * 4)  # head input
        self.qkv = buf(T * self.qkv_w * 4)
        self.att = buf(T * H * 4)
        self.act = buf(T * F * 4)
        self.ids = dev.create_buffer(size=max(16, T * 4), usage=S)
        self.params = dev.create_buffer(size=16, usage=U.UNIFORM | U.COPY_DST)
        cos, sin = rope_tables(c, self.max_ctx)
        self.rope = wbuf(np.concatenate([cos, sin], axis=1))
        self.staging_size = T * max(H, V if spec.host else H) * 4 + 16
        self.staging = dev.create_buffer(size=self.staging_size, usage=U.MAP_READ | U.COPY_DST)

        # pipelines: TB=1 for single-token steps, TB=8 for batches
        # TB -> (TB, R): output rows R per workgroup; SPLITROOM_WGPU_ROWS overrides R of the
        # one-token kernels (4 by default; tuning knob for GPUs with many compute units)
        r1 = int(os.environ.get("SPLITROOM_WGPU_ROWS", "4"))
        self._variants = {1: (1, r1), 8: (8, 2)}
        mk = self._pipeline
        self.p_qkv = {tb: mk(wgsl.matmul_src(H, self.qkv_w, r, tb, True, False, False, c.rms_eps)) for tb, r in self._variants.values()}
        self.p_o = {tb: mk(wgsl.matmul_src(H, H, r, tb, False, True, False)) for tb, r in self._variants.values()}
        self.p_gu = {tb: mk(wgsl.matmul_src(H, F, r, tb, True, False, True, c.rms_eps)) for tb, r in self._variants.values()}
        self.p_d = {tb: mk(wgsl.matmul_src(F, H, r, tb, False, True, False)) for tb, r in self._variants.values()}
        self.p_rope = mk(wgsl.rope_kv_src(NH, KV, D))
        self.p_att = mk(wgsl.attention_src(NH, KV, D))
        self.rope_groups = -(-((NH + KV) * D // 2 + KV * D) // 64)

        self.layers = []
        w = weights
        for a in w.values():
            assert a.dtype == F32, "weights must be float32"
        for i in range(spec.start, spec.end):
            p = f"model.layers.{i}."
            ln1, ln2 = wbuf(w.pop(p + "input_layernorm.weight")), wbuf(w.pop(p + "post_attention_layernorm.weight"))
            wqkv = wbuf(np.concatenate([w.pop(p + "self_attn.q_proj.weight"), w.pop(p + "self_attn.k_proj.weight"), w.pop(p + "self_attn.v_proj.weight")]))
            wo = wbuf(w.pop(p + "self_attn.o_proj.weight"))
            wg, wu = wbuf(w.pop(p + "mlp.gate_proj.weight")), wbuf(w.pop(p + "mlp.up_proj.weight"))
            wd = wbuf(w.pop(p + "mlp.down_proj.weight"))
            kc, vc = buf(self.max_ctx * c.kv_dim * 4), buf(self.max_ctx * c.kv_dim * 4)
            L = {}
            for tb in self.p_qkv:
                L[("qkv", tb)] = self._bind(self.p_qkv[tb], {0: self.x, 1: wqkv, 2: self.qkv, 3: self.params, 4: ln1})
                L[("o", tb)] = self._bind(self.p_o[tb], {0: self.att, 1: wo, 2: self.x, 3: self.params})
                L[("gu", tb)] = self._bind(self.p_gu[tb], {0: self.x, 1: wg, 2: self.act, 3: self.params, 4: ln2, 5: wu})
                L[("d", tb)] = self._bind(self.p_d[tb], {0: self.act, 1: wd, 2: self.x, 3: self.params})
            L["rope"] = self._bind(self.p_rope, {0: self.qkv, 1: kc, 2: vc, 3: self.rope, 4: self.params})
            L["att"] = self._bind(self.p_att, {0: self.qkv, 1: kc, 2: vc, 3: self.att, 4: self.params})
            self.layers.append(L)

        if spec.host:
            emb = w.pop(EMBED)
            head_w = emb if cfg.tie_embeddings else w.pop(LM_HEAD)
            self.emb = wbuf(emb)
            self.head_w = self.emb if cfg.tie_embeddings else wbuf(head_w)
            del emb, head_w
            norm = wbuf(w.pop(FINAL_NORM))
            self.logits = buf(T * V * 4)
            p_embed = mk(wgsl.embed_src(H))
            self.p_head = {tb: mk(wgsl.matmul_src(H, V, r, tb, True, False, False, c.rms_eps)) for tb, r in self._variants.values()}
            p_arg = mk(wgsl.argmax_src(V))
            self.b_embed = (p_embed, self._bind(p_embed, {0: self.ids, 1: self.emb, 2: self.x, 3: self.params}))
            self.b_head = {tb: (self.p_head[tb], self._bind(self.p_head[tb], {0: self.hx, 1: self.head_w, 2: self.logits, 3: self.params, 4: norm})) for tb in self.p_head}
            self.b_arg = (p_arg, self._bind(p_arg, {0: self.logits, 1: self.ids}))
        w.clear()

    # ------------------------------------------------------------------ plumbing
    def _pipeline(self, src: str):
        mod = self.device.create_shader_module(code=src)
        return self.device.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})

    def _bind(self, pipeline, buffers: dict):
        entries = [{"binding": b, "resource": {"buffer": bf, "offset": 0, "size": bf.size}} for b, bf in sorted(buffers.items())]
        return self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)

    def _tb(self, n: int) -> int:
        return 1 if n == 1 else 8

    def _encode_layers(self, cp, n: int) -> None:
        tb = self._tb(n)
        r = self._variants[tb][1]
        ty = -(-n // tb)
        c = self.cfg
        for L in self.layers:
            cp.set_pipeline(self.p_qkv[tb]); cp.set_bind_group(0, L[("qkv", tb)]); cp.dispatch_workgroups(self.qkv_w // r, ty)  # noqa: E702
            cp.set_pipeline(self.p_rope); cp.set_bind_group(0, L["rope"]); cp.dispatch_workgroups(self.rope_groups, n)  # noqa: E702
            cp.set_pipeline(self.p_att); cp.set_bind_group(0, L["att"]); cp.dispatch_workgroups(c.n_heads, n)  # noqa: E702
            cp.set_pipeline(self.p_o[tb]); cp.set_bind_group(0, L[("o", tb)]); cp.dispatch_workgroups(c.hidden // r, ty)  # noqa: E702
            cp.set_pipeline(self.p_gu[tb]); cp.set_bind_group(0, L[("gu", tb)]); cp.dispatch_workgroups(c.ffn // r, ty)  # noqa: E702
            cp.set_pipeline(self.p_d[tb]); cp.set_bind_group(0, L[("d", tb)]); cp.dispatch_workgroups(c.hidden // r, ty)  # noqa: E702

    def _encode_embed(self, cp, n: int) -> None:
        p, b = self.b_embed
        cp.set_pipeline(p); cp.set_bind_group(0, b); cp.dispatch_workgroups(-(-self.cfg.hidden // 64), n)  # noqa: E702

    def _encode_head(self, cp, n: int) -> None:
        tb = self._tb(n)
        p, b = self.b_head[tb]
        cp.set_pipeline(p); cp.set_bind_group(0, b); cp.dispatch_workgroups(self.cfg.vocab // self._variants[tb][1], -(-n // tb))  # noqa: E702

    def _run(self, n: int, first_pos: int, encode, reads: list[tuple[object, int]]) -> list[np.ndarray]:
        """Write params, encode one compute pass with ``encode(pass)``, copy ``reads`` [(buffer, nbytes)]
        into the staging buffer, submit once, map, and return the byte ranges as float32/uint32 views."""
        q = self.device.queue
        q.write_buffer(self.params, 0, np.array([n, first_pos, 0, 0], np.uint32))
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        encode(cp)
        cp.end()
        off = 0
        spans = []
        for b, nbytes in reads:
            enc.copy_buffer_to_buffer(b, 0, self.staging, off, nbytes)
            spans.append((off, nbytes))
            off += (nbytes + 255) // 256 * 256
        q.submit([enc.finish()])
        out = []
        if reads:
            self.staging.map_sync(self._wgpu.MapMode.READ, 0, off)
            try:
                for o, nb in spans:
                    out.append(bytes(self.staging.read_mapped(o, nb, copy=False)))
            finally:
                self.staging.unmap()
        return out

    # ------------------------------------------------------------------ Stage API
    def forward(self, hidden: np.ndarray, first_pos: int) -> np.ndarray:
        x = check_hidden(hidden, self.cfg.hidden)
        self._check_pos(first_pos, x.shape[0])
        outs = []
        for i in range(0, x.shape[0], self.max_tokens):
            part = x[i : i + self.max_tokens]
            n = part.shape[0]
            self.device.queue.write_buffer(self.x, 0, part)
            (raw,) = self._run(n, first_pos + i, lambda cp: self._encode_layers(cp, n), [(self.x, n * self.cfg.hidden * 4)])
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

    def head_embed_forward(self, hidden: np.ndarray, first_pos: int) -> tuple[int, np.ndarray]:
        """One submit: head on ``hidden[-1]``, arg-max, embed it, this stage's layers at ``first_pos``."""
        self._require_host()
        x = check_hidden(hidden, self.cfg.hidden)
        self._check_pos(first_pos, 1)
        self.device.queue.write_buffer(self.hx, 0, np.ascontiguousarray(x[-1:]))

        def enc(cp):
            self._encode_head(cp, 1)
            pa, ba = self.b_arg
            cp.set_pipeline(pa); cp.set_bind_group(0, ba); cp.dispatch_workgroups(1)  # noqa: E702
            self._encode_embed(cp, 1)
            self._encode_layers(cp, 1)

        raw_x, raw_id = self._run(1, first_pos, enc, [(self.x, self.cfg.hidden * 4), (self.ids, 4)])
        self._pos = first_pos + 1
        return int(np.frombuffer(raw_id, np.uint32)[0]), np.frombuffer(raw_x, F32).reshape(1, self.cfg.hidden).copy()
