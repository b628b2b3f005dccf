"""WGSL compute shaders for the wgpu backend, generated with the model's sizes baked in.

Every kernel works on float32 storage buffers. Shapes use ``n`` = tokens in this step
(``Params.n``, at most the stage's ``max_tokens``), ``H`` hidden, ``D`` head dim.

* :func:`matmul_src`: ``Y[t, o] (+)= f(sum_k X[t, k] * W[o, k])`` with optional fused RMSNorm of X
  (the sum of squares is accumulated in the same pass and applied as a per-token scale,
  since ``sum_k w_k (x_k g_k s) = s * sum_k w_k x_k g_k``), residual add, and SwiGLU
  (two weight matrices, ``silu(a) * b``). A workgroup of 64 threads computes ``R`` output rows
  for ``TB`` tokens; threads split K in vec4 steps; partial sums meet in workgroup memory.
* :func:`rope_kv_src`: rotate-half RoPE on Q in place and on K into the KV cache; V into the cache.
* :func:`attention_src`: one workgroup (``D`` threads) per (head, token): causal attention
  over the cache with the running-max ("online") softmax of Milakov & Gimelshein 2018 in blocks
  of ``D`` keys; thread ``d`` owns output dim ``d``.
* :func:`embed_src`, :func:`argmax_src`: row gather; arg-max of logits row 0 (lowest id on ties).
"""

from __future__ import annotations

PARAMS = "struct Params { n: u32, first_pos: u32, r0: u32, r1: u32 };\n"
WG = 64


def _f(x: float) -> str:
    return repr(float(x))


def matmul_src(K: int, N: int, R: int, TB: int, norm: bool, add: bool, swiglu: bool, eps: float = 1e-5) -> str:
    """Source of a (fused) matrix product kernel. K, N multiples of 4 and R. Dispatch ``(N/R, ceil(n/TB))``."""
    assert K % 4 == 0 and N % R == 0
    K4 = K // 4
    nacc = R * TB
    nv = nacc * (2 if swiglu else 1) + (TB if norm else 0)
    ssoff = nacc * (2 if swiglu else 1)
    s = [PARAMS]
    s.append("@group(0) @binding(0) var<storage, read> X: array<vec4<f32>>;\n")
    s.append("@group(0) @binding(1) var<storage, read> W: array<vec4<f32>>;\n")
    s.append("@group(0) @binding(2) var<storage, read_write> Y: array<f32>;\n")
    s.append("@group(0) @binding(3) var<uniform> P: Params;\n")
    if norm:
        s.append("@group(0) @binding(4) var<storage, read> NW: array<vec4<f32>>;\n")
    if swiglu:
        s.append("@group(0) @binding(5) var<storage, read> W2: array<vec4<f32>>;\n")
    s.append(
        f"""
const K4: u32 = {K4}u;
const N: u32 = {N}u;
const R: u32 = {R}u;
const TB: u32 = {TB}u;
const WG: u32 = {WG}u;
const NACC: u32 = {nacc}u;
const NV: u32 = {nv}u;
const SSOFF: u32 = {ssoff}u;
const EPS: f32 = {_f(eps)};
var<workgroup> red: array<f32, {nv * WG}>;

@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let row0 = wid.x * R;
  let t0 = wid.y * TB;
  var acc: array<f32, {nacc}>;
  {"var acc2: array<f32, %d>;" % nacc if swiglu else ""}
  {"var ss: array<f32, %d>;" % TB if norm else ""}
  for (var k = lid; k < K4; k += WG) {{
    var xv: array<vec4<f32>, {TB}>;
    {"let g = NW[k];" if norm else ""}
    for (var t = 0u; t < TB; t++) {{
      var v = vec4<f32>(0.0);
      if (t0 + t < P.n) {{ v = X[(t0 + t) * K4 + k]; }}
      {"ss[t] += dot(v, v); v = v * g;" if norm else ""}
      xv[t] = v;
    }}
    for (var r = 0u; r < R; r++) {{
      let w = W[(row0 + r) * K4 + k];
      {"let w2 = W2[(row0 + r) * K4 + k];" if swiglu else ""}
      for (var t = 0u; t < TB; t++) {{
        acc[r * TB + t] += dot(w, xv[t]);
        {"acc2[r * TB + t] += dot(w2, xv[t]);" if swiglu else ""}
      }}
    }}
  }}
  for (var i = 0u; i < NACC; i++) {{ red[lid * NV + i] = acc[i]; }}
  {"for (var i = 0u; i < NACC; i++) { red[lid * NV + NACC + i] = acc2[i]; }" if swiglu else ""}
  {"for (var t = 0u; t < TB; t++) { red[lid * NV + SSOFF + t] = ss[t]; }" if norm else ""}
  workgroupBarrier();
  if (lid < NACC) {{
    let r = lid / TB;
    let t = lid % TB;
    if (t0 + t < P.n) {{
      var y = 0.0;
      {"var y2 = 0.0;" if swiglu else ""}
      {"var q = 0.0;" if norm else ""}
      for (var i = 0u; i < WG; i++) {{
        y += red[i * NV + lid];
        {"y2 += red[i * NV + NACC + lid];" if swiglu else ""}
        {"q += red[i * NV + SSOFF + t];" if norm else ""}
      }}
      {"let sc = 1.0 / sqrt(q / f32(K4 * 4u) + EPS); y = y * sc;" if norm else ""}
      {"y2 = y2 * sc;" if (norm and swiglu) else ""}
      {"y = (y / (1.0 + exp(-y))) * y2;" if swiglu else ""}
      let o = (t0 + t) * N + row0 + r;
      {"Y[o] = Y[o] + y;" if add else "Y[o] = y;"}
    }}
  }}
}}
"""
    )
    return "".join(s)


def rope_kv_src(H: int, KV: int, D: int) -> str:
    """RoPE on Q (in place in the QKV buffer) and K (into the cache); V copied into the cache.

    Bindings: 0 QKV ``[n, (H+2KV)*D]``, 1 KC / 2 VC ``[ctx, KV*D]``, 3 ROPE ``[ctx, D]`` (cos | sin),
    4 Params. Dispatch ``(ceil(((H+KV)*D/2 + KV*D)/64), n)``.
    """
    half = D // 2
    return PARAMS + f"""
@group(0) @binding(0) var<storage, read_write> QKV: array<f32>;
@group(0) @binding(1) var<storage, read_write> KC: array<f32>;
@group(0) @binding(2) var<storage, read_write> VC: array<f32>;
@group(0) @binding(3) var<storage, read> ROPE: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;
const H: u32 = {H}u;
const KV: u32 = {KV}u;
const D: u32 = {D}u;
const HALF: u32 = {half}u;
const QKVW: u32 = {(H + 2 * KV) * D}u;
const KVD: u32 = {KV * D}u;
const NROT: u32 = {(H + KV) * half}u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
  let t = gid.y;
  let i = gid.x;
  if (t >= P.n) {{ return; }}
  let pos = P.first_pos + t;
  if (i < NROT) {{
    let hh = i / HALF;
    let k = i % HALF;
    let base = t * QKVW + hh * D;
    let x1 = QKV[base + k];
    let x2 = QKV[base + k + HALF];
    let c = ROPE[pos * D + k];
    let s = ROPE[pos * D + HALF + k];
    let y1 = x1 * c - x2 * s;
    let y2 = x2 * c + x1 * s;
    if (hh < H) {{
      QKV[base + k] = y1;
      QKV[base + k + HALF] = y2;
    }} else {{
      let kb = pos * KVD + (hh - H) * D;
      KC[kb + k] = y1;
      KC[kb + k + HALF] = y2;
    }}
  }} else if (i < NROT + KVD) {{
    let j = i - NROT;
    VC[pos * KVD + j] = QKV[t * QKVW + (H + KV) * D + j];
  }}
}}
"""


def attention_src(H: int, KV: int, D: int) -> str:
    """Causal GQA attention over the cache. Bindings: 0 QKV, 1 KC, 2 VC, 3 O ``[n, H*D]``, 4 Params.

    Dispatch ``(H, n)``, workgroup size ``D``. Query ``t`` (position ``first_pos + t``) sees keys
    ``0..first_pos + t``.
    """
    import math

    return PARAMS + f"""
@group(0) @binding(0) var<storage, read> QKV: array<f32>;
@group(0) @binding(1) var<storage, read> KC: array<f32>;
@group(0) @binding(2) var<storage, read> VC: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;
const H: u32 = {H}u;
const G: u32 = {H // KV}u;
const D: u32 = {D}u;
const QKVW: u32 = {(H + 2 * KV) * D}u;
const KVD: u32 = {KV * D}u;
const SCALE: f32 = {_f(1.0 / math.sqrt(D))};
var<workgroup> qs: array<f32, {D}>;
var<workgroup> sc: array<f32, {D}>;
var<workgroup> ps: array<f32, {D}>;

@compute @workgroup_size({D})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let h = wid.x;
  let t = wid.y;
  if (t >= P.n) {{ return; }}
  let kvo = (h / G) * D;
  let T = P.first_pos + t + 1u;
  qs[lid] = QKV[t * QKVW + h * D + lid];
  workgroupBarrier();
  var m = -1e30;
  var l = 0.0;
  var acc = 0.0;
  for (var j0 = 0u; j0 < T; j0 += D) {{
    let j = j0 + lid;
    var s = -1e30;
    if (j < T) {{
      var d = 0.0;
      let kb = j * KVD + kvo;
      for (var e = 0u; e < D; e++) {{ d += qs[e] * KC[kb + e]; }}
      s = d * SCALE;
    }}
    sc[lid] = s;
    workgroupBarrier();
    var bm = m;
    for (var i = 0u; i < D; i++) {{ bm = max(bm, sc[i]); }}
    ps[lid] = select(0.0, exp(s - bm), j < T);
    workgroupBarrier();
    let corr = exp(m - bm);
    var bl = 0.0;
    var ba = 0.0;
    let nb = min(D, T - j0);
    for (var i = 0u; i < nb; i++) {{
      let p = ps[i];
      bl += p;
      ba += p * VC[(j0 + i) * KVD + kvo + lid];
    }}
    l = l * corr + bl;
    acc = acc * corr + ba;
    m = bm;
    workgroupBarrier();
  }}
  O[t * H * D + h * D + lid] = acc / l;
}}
"""


def embed_src(Hd: int) -> str:
    """``X[t, :] = E[IDS[t], :]``. Bindings: 0 IDS u32, 1 E ``[vocab, H]``, 2 X, 3 Params. Dispatch ``(ceil(H/64), n)``."""
    return PARAMS + f"""
@group(0) @binding(0) var<storage, read> IDS: array<u32>;
@group(0) @binding(1) var<storage, read> E: array<f32>;
@group(0) @binding(2) var<storage, read_write> X: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;
const HD: u32 = {Hd}u;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
  let t = gid.y;
  let i = gid.x;
  if (t >= P.n || i >= HD) {{ return; }}
  X[t * HD + i] = E[IDS[t] * HD + i];
}}
"""


def argmax_src(V: int) -> str:
    """Arg-max of ``L[0, :V]`` into ``IDS[0]`` (lowest index on ties). Bindings: 0 L, 1 IDS (rw). Dispatch ``(1,)``."""
    return f"""
@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read_write> IDS: array<u32>;
const V: u32 = {V}u;
var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {{
  var best = L[lid];
  var idx = lid;
  for (var i = lid + 256u; i < V; i += 256u) {{
    let v = L[i];
    if (v > best) {{ best = v; idx = i; }}
  }}
  bv[lid] = best;
  bi[lid] = idx;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) {{
    if (lid < s) {{
      let ov = bv[lid + s];
      let oi = bi[lid + s];
      if (ov > bv[lid] || (ov == bv[lid] && oi < bi[lid])) {{ bv[lid] = ov; bi[lid] = oi; }}
    }}
    workgroupBarrier();
  }}
  if (lid == 0u) {{ IDS[0] = bi[0]; }}
}}
"""
