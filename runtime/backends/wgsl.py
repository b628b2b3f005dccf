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


def _product_decls(fmt: str, norm: bool, swiglu: bool, bias: bool) -> str:
    """Bindings shared by the product kernels: 0 X, 1 W (``fmt``), 2 Y, 3 Params, 4 norm weight,
    5 W2 (SwiGLU's second matrix), 9 bias."""
    s = ["@group(0) @binding(0) var<storage, read> X: array<vec4<f32>>;\n", weight_decl("W", 1, fmt),
         "@group(0) @binding(2) var<storage, read_write> Y: array<f32>;\n",
         "@group(0) @binding(3) var<uniform> P: Params;\n"]
    if norm:
        s.append("@group(0) @binding(4) var<storage, read> NW: array<vec4<f32>>;\n")
    if swiglu:
        s.append(weight_decl("W2", 5, fmt))
    if bias:
        s.append("@group(0) @binding(9) var<storage, read> B: array<f32>;\n")
    return "".join(s)


def matmul_src(K: int, N: int, R: int, TB: int, norm: bool, add: bool, swiglu: bool, eps: float = 1e-5, fmt: str = "f32",
               bias: bool = False) -> str:
    """Source of a (fused) matrix product kernel. K, N multiples of 4 and R. Dispatch ``(N/R, ceil(n/TB))``.
    Weights in ``fmt`` (see :func:`weight_decl`); ``bias`` adds ``B[o]`` (binding 9) to each output."""
    assert K % 4 == 0 and N % R == 0
    K4 = K // 4
    nacc = R * TB
    nv = nacc * (2 if swiglu else 1) + (TB if norm else 0)
    ssoff = nacc * (2 if swiglu else 1)
    s = [PARAMS, _product_decls(fmt, norm, swiglu, bias)]
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
      let w = ld_W((row0 + r) * K4 + k);
      {"let w2 = ld_W2((row0 + r) * K4 + k);" if swiglu else ""}
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
      {"y = y + B[row0 + r];" if bias else ""}
      let o = (t0 + t) * N + row0 + r;
      {"Y[o] = Y[o] + y;" if add else "Y[o] = y;"}
    }}
  }}
}}
"""
    )
    return "".join(s)


def rope_kv_src(H: int, KV: int, D: int, qk_norm: bool = False, eps: float = 1e-6) -> str:
    """RoPE on Q (in place in the QKV buffer) and K (into the cache); V copied into the cache.

    One workgroup of ``D/2`` threads per (head, token), heads ``0..H+2KV-1`` (Q heads, K heads, V
    heads); thread ``k`` owns the pair ``(k, k + D/2)``. With ``qk_norm`` (Qwen3) each Q and K head
    is first RMS-normalised over its ``D`` values with weights ``QN``/``KN`` (bindings 5, 6).
    Bindings: 0 QKV ``[n, (H+2KV)*D]``, 1 KC / 2 VC ``[ctx, KV*D]``, 3 ROPE ``[ctx, D]`` (cos | sin),
    4 Params. Dispatch ``(H + 2KV, n)``.
    """
    half = D // 2
    norm = ""
    if qk_norm:
        norm = f"""
  if (hh < H + KV) {{
    red[k] = x1 * x1 + x2 * x2;
    workgroupBarrier();
    for (var st = {1 << (half - 1).bit_length() >> 1}u; st > 0u; st >>= 1u) {{
      if (k < st && k + st < HALF) {{ red[k] += red[k + st]; }}
      workgroupBarrier();
    }}
    let sc = 1.0 / sqrt(red[0] / f32(D) + EPS);
    if (hh < H) {{ x1 = x1 * sc * QN[k]; x2 = x2 * sc * QN[k + HALF]; }}
    else {{ x1 = x1 * sc * KN[k]; x2 = x2 * sc * KN[k + HALF]; }}
  }}"""
    decl = ("@group(0) @binding(5) var<storage, read> QN: array<f32>;\n"
            "@group(0) @binding(6) var<storage, read> KN: array<f32>;\n"
            f"var<workgroup> red: array<f32, {half}>;\nconst EPS: f32 = {_f(eps)};\n") if qk_norm else ""
    return PARAMS + f"""
@group(0) @binding(0) var<storage, read_write> QKV: array<f32>;
@group(0) @binding(1) var<storage, read_write> KC: array<f32>;
@group(0) @binding(2) var<storage, read_write> VC: array<f32>;
@group(0) @binding(3) var<storage, read> ROPE: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;
{decl}const H: u32 = {H}u;
const KV: u32 = {KV}u;
const D: u32 = {D}u;
const HALF: u32 = {half}u;
const QKVW: u32 = {(H + 2 * KV) * D}u;
const KVD: u32 = {KV * D}u;

@compute @workgroup_size({half})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) k: u32) {{
  let hh = wid.x;
  let t = wid.y;
  if (t >= P.n) {{ return; }}
  let pos = P.first_pos + t;
  let base = t * QKVW + hh * D;
  var x1 = QKV[base + k];
  var x2 = QKV[base + k + HALF];{norm}
  if (hh >= H + KV) {{
    let vb = pos * KVD + (hh - H - KV) * D;
    VC[vb + k] = x1;
    VC[vb + k + HALF] = x2;
    return;
  }}
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
}}
"""


def attention_src(H: int, KV: int, D: int, window: int = 0) -> str:
    """Causal GQA attention over the cache. Bindings: 0 QKV, 1 KC, 2 VC, 3 O ``[n, H*D]``, 4 Params.

    Dispatch ``(H, n)``, workgroup size ``D``. Query ``t`` (position ``first_pos + t``) sees keys
    ``0..first_pos + t`` (with ``window`` > 0, only the last ``window`` of them).
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
const WIN: u32 = {int(window)}u;
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
  var lo = 0u;
  if (WIN > 0u && T > WIN) {{ lo = T - WIN; }}
  for (var j0 = lo; j0 < T; j0 += D) {{
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


def embed_src(Hd: int, fmt: str = "f32") -> str:
    """``X[t, :] = E[IDS[t], :]``. Bindings: 0 IDS u32, 1 E ``[vocab, H]`` (``fmt``), 2 X, 3 Params.
    Dispatch ``(ceil(H/4/64), n)``."""
    return PARAMS + weight_decl("E", 1, fmt) + f"""
@group(0) @binding(0) var<storage, read> IDS: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> P: Params;
const H4: u32 = {Hd // 4}u;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
  let t = gid.y;
  let i = gid.x;
  if (t >= P.n || i >= H4) {{ return; }}
  X[t * H4 + i] = ld_E(IDS[t] * H4 + i);
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


# ---------------------------------------------------------------------------- weight formats
#: GGUF block formats the kernels read as stored: ``{format: (weights per block, bytes per block)}``
#: (runtime/gguf_blocks.py FORMATS)
BLOCK_FORMATS = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q4_k": (256, 144), "q6_k": (256, 210)}
#: weight storage formats the kernels read; every product still accumulates in float32.
WEIGHT_FORMATS = ("f32", "f16", "q8") + tuple(BLOCK_FORMATS)  # runtime/precision.py WEIGHTS; gguf: the blocks


def _block_loader(name: str, fmt: str) -> str:
    """``ld_<name>(i)`` for GGUF blocks held as stored (bytes in ``array<u32>``, padded by one
    word): element ``e = 4i`` of the flat matrix lies in block ``e / BS`` at ``e % BS``
    (rows hold whole blocks), and 4 consecutive elements share their block's scales. Layouts
    as runtime/gguf_blocks.py (ggml-common.h); float16 scales read with ``unpack2x16float``."""
    bs, nb = BLOCK_FORMATS[fmt]
    s = [f"""fn rd_{name}(b: u32) -> u32 {{
  let w = b >> 2u;
  let sh = (b & 3u) * 8u;
  return (({name}[w] >> sh) | select({name}[w + 1u] << (32u - sh), 0u, sh == 0u));
}}
fn h_{name}(b: u32) -> f32 {{ return unpack2x16float({name}[b >> 2u] >> ((b & 2u) * 8u)).x; }}
fn by_{name}(b: u32) -> u32 {{ return ({name}[b >> 2u] >> ((b & 3u) * 8u)) & 255u; }}
fn ld_{name}(i: u32) -> vec4<f32> {{
  let e = i * 4u;
  let base = (e / {bs}u) * {nb}u;
  let j = e % {bs}u;
"""]
    lanes = "vec4<f32>(f32(c & 255u), f32((c >> 8u) & 255u), f32((c >> 16u) & 255u), f32(c >> 24u))"
    if fmt == "q8_0":
        s.append(f"""  let q = bitcast<i32>(rd_{name}(base + 2u + j));
  return h_{name}(base) * vec4<f32>(f32(extractBits(q, 0u, 8u)), f32(extractBits(q, 8u, 8u)),
                                     f32(extractBits(q, 16u, 8u)), f32(extractBits(q, 24u, 8u)));
}}
""")
    elif fmt in ("q4_0", "q4_1"):
        q0 = 2 if fmt == "q4_0" else 4
        tail = f"h_{name}(base) * ({lanes} - vec4<f32>(8.0))" if fmt == "q4_0" else             f"h_{name}(base) * {lanes} + vec4<f32>(h_{name}(base + 2u))"
        s.append(f"""  let c = (rd_{name}(base + {q0}u + (j & 15u)) >> ((j >> 4u) * 4u)) & 0x0F0F0F0Fu;
  return {tail};
}}
""")
    elif fmt == "q4_k":
        s.append(f"""  let ch = j >> 6u;
  let hf = (j >> 5u) & 1u;
  let sub = 2u * ch + hf;
  var sc: u32;
  var mn: u32;
  if (sub < 4u) {{
    sc = by_{name}(base + 4u + sub) & 63u;
    mn = by_{name}(base + 8u + sub) & 63u;
  }} else {{
    sc = (by_{name}(base + 8u + sub) & 15u) | ((by_{name}(base + sub) >> 6u) << 4u);
    mn = (by_{name}(base + 8u + sub) >> 4u) | ((by_{name}(base + 4u + sub) >> 6u) << 4u);
  }}
  let c = (rd_{name}(base + 16u + 32u * ch + (j & 31u)) >> (4u * hf)) & 0x0F0F0F0Fu;
  return vec4<f32>(h_{name}(base) * f32(sc)) * {lanes} - vec4<f32>(h_{name}(base + 2u) * f32(mn));
}}
""")
    elif fmt == "q6_k":
        s.append(f"""  let hf = j >> 7u;
  let r = j & 127u;
  let qq = r >> 5u;
  let l = r & 31u;
  let lo = (rd_{name}(base + 64u * hf + 32u * (qq & 1u) + l) >> (4u * (qq >> 1u))) & 0x0F0F0F0Fu;
  let hi = (rd_{name}(base + 128u + 32u * hf + l) >> (2u * qq)) & 0x03030303u;
  let c = lo | (hi << 4u);
  let sc = f32(extractBits(bitcast<i32>(by_{name}(base + 192u + 8u * hf + 2u * qq + (l >> 4u))), 0u, 8u));
  return vec4<f32>(h_{name}(base + 208u) * sc) * ({lanes} - vec4<f32>(32.0));
}}
""")
    return "".join(s)


def part_binding(binding: int, k: int) -> int:
    """Binding of part ``k`` of a matrix whose row blocks are in different formats (part 0 at ``binding``)."""
    return binding if k == 0 else binding + 20 + k


def weight_decl(name: str, binding: int, fmt: str) -> str:
    """WGSL declarations of weight matrix ``name`` in ``fmt`` and a loader ``ld_<name>(i) -> vec4<f32>``
    returning the ``i``-th group of 4 consecutive elements (row-major ``[rows, K]``, K a multiple of 4).

    * ``f32``: ``array<vec4<f32>>``.
    * ``f16``: IEEE half pairs packed in ``array<vec2<u32>>``, widened with ``unpack2x16float``
      (core WGSL, no ``shader-f16`` feature needed).
    * ``q8``: blocks of 32 elements along K (:func:`runtime.backends.kernels.quantize_q8`, the numpy
      backend's format): int8 values in -127..127 packed 4 per u32,
      one float32 scale ``d * 127`` per block at binding ``binding + 10``; the value is
      ``unpack4x8snorm(q) * (d * 127) = q * d`` (``unpack4x8snorm`` gives ``q / 127``).
    * a key of :data:`BLOCK_FORMATS`: the GGUF's blocks as stored (:func:`_block_loader`).
    * a tuple ``((format, vec4 count), ...)``: row blocks in different formats, part ``k`` at
      :func:`part_binding` (a Q4_K_M layer's Q4_K q/k and Q6_K v in one QKV product).
    """
    if fmt == "f32":
        return (f"@group(0) @binding({binding}) var<storage, read> {name}: array<vec4<f32>>;\n"
                f"fn ld_{name}(i: u32) -> vec4<f32> {{ return {name}[i]; }}\n")
    if fmt == "f16":
        return (f"@group(0) @binding({binding}) var<storage, read> {name}: array<vec2<u32>>;\n"
                f"fn ld_{name}(i: u32) -> vec4<f32> {{ let p = {name}[i]; "
                f"return vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y)); }}\n")
    if fmt == "q8":
        return (f"@group(0) @binding({binding}) var<storage, read> {name}: array<u32>;\n"
                f"@group(0) @binding({binding + 10}) var<storage, read> {name}_s: array<f32>;\n"
                f"fn ld_{name}(i: u32) -> vec4<f32> {{ return unpack4x8snorm({name}[i]) * {name}_s[i >> 3u]; }}\n")
    if fmt in BLOCK_FORMATS:
        return f"@group(0) @binding({binding}) var<storage, read> {name}: array<u32>;\n" + _block_loader(name, fmt)
    if isinstance(fmt, tuple):  # row blocks in different formats: ((format, vec4 count), ...)
        out, ends, acc = [], [], 0
        for k, (f, n4) in enumerate(fmt):
            out.append(weight_decl(f"{name}_p{k}", part_binding(binding, k), f))
            acc += n4
            ends.append(acc)
        body = "".join(f"  if (i < {ends[k]}u) {{ return ld_{name}_p{k}(i - {ends[k] - n4}u); }}\n"
                       for k, (_, n4) in enumerate(fmt[:-1]))
        last = len(fmt) - 1
        body += f"  return ld_{name}_p{last}(i - {ends[last] - fmt[last][1]}u);\n"
        return "".join(out) + f"fn ld_{name}(i: u32) -> vec4<f32> {{\n{body}}}\n"
    raise ValueError(f"unknown weight format {fmt!r}; choose one of {', '.join(WEIGHT_FORMATS)}")


SUBGROUP_BUILTINS = ("@builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sgs: u32, "
                     "@builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32")


def matvec_src(K: int, N: int, R: int, WGS: int, fmt: str = "f32", norm: bool = False, add: bool = False,
               swiglu: bool = False, rope: tuple[int, int, int] | None = None, eps: float = 1e-5, U: int = 8,
               bias: bool = False, wide: int = 0, rs: int = 1, words: int = 0, lane_words: int = 1, split: int = 0,
               split_wg: int = 256, mant: bool = False, att: tuple[int, int, int] | None = None) -> str:
    """One-token fused matrix-vector product ``y[o] (+)= f(sum_k x[k] W[o, k])`` (decode step, ``n = 1``).

    Each subgroup computes whole output rows: its lanes split K in vec4 steps and meet in one
    ``subgroupAdd`` (no workgroup memory, no barrier). A workgroup of ``WGS`` threads owns ``R``
    rows (or, with ``rope``, ``R`` row pairs); subgroups take them in turn, so any subgroup size works.
    Fusions: RMSNorm of x (``norm``: sum of squares in the same loop, applied as a scale), residual
    add (``add``), SwiGLU (``swiglu``: second matrix ``W2`` at binding 5, ``silu(a) * b``), and with
    ``rope = (NH, KV, D)`` the QKV product finishes the layer's attention input: rows ``j`` and
    ``j + D/2`` of a head are computed by one subgroup and rotated (rotate-half RoPE at position
    ``first_pos``); Q goes to ``Y`` (``[NH*D]``), K and V straight into the caches (bindings 6, 7)
    at ``first_pos``; tables at binding 8 (``[ctx, D]`` = cos | sin).
    ``bias`` adds ``B[row]`` (binding 9) to each row's product (before RoPE).
    Each lane issues ``U`` loads before it sums them (one memory round trip per ``U * subgroup``
    vec4s). Bindings: 0 X ``[K]`` f32, 1 W ``[N, K]`` (``fmt``), 2 Y f32, 3 Params, 4 norm weight.
    Dispatch ``(N / R,)`` (with ``rope``: ``(N / 2 / R,)``).

    ``wide`` > 0 with a format of :func:`wide_ok` reads the weights in 16-byte pieces instead
    (:func:`_wide_loop`): at most ``wide`` pieces per lane in flight, balanced so that a row takes
    as few rounds as possible; ``U`` is then unused. Same bindings and dispatch.

    ``rs`` > 1: each subgroup computes ``rs`` rows (row pairs with ``rope``) at once, so each lane
    loads its x (and norm weight) vec4s once for ``rs`` rows; ``R`` must be a multiple of ``rs``
    (rows per workgroup, not per subgroup: give ``R = rs * subgroups`` to keep every subgroup
    busy). ``words`` > 0 with a format of :func:`words_ok` (Q4_K) reads the blocks as u32 code words
    instead, lanes on consecutive words (:func:`_words_loop`), ``words`` of them per lane and row
    in flight, ``lane_words`` (1, 2 or 4) consecutive words a lane; the pieces (``wide``) are then
    unused. With ``rs`` > 1 the pieces (``wide``) serve
    ``rs`` rows too, else the format's vec4 loader, ``U`` loads per lane and row. Both take the loop of :func:`_rows_main`.

    ``split`` > 0: the whole workgroup shares its rows instead (:func:`_split_main`): ``R`` rows (row
    pairs with ``rope``) a workgroup, of at most ``split_wg`` threads that split each row's K and
    issue all their loads at once; ``WGS``, ``U``, ``rs``, ``wide`` and ``words`` are then unused.
    Same bindings and dispatch. ``mant``: Q4_K's codes of the shared form become floats through the
    mantissa (:func:`_words_decl` ``mant``).

    ``att = (WGS_ATT, UK, window)`` (with ``rope`` and ``split``, ``D/2`` a multiple of ``R``): the
    layer's one-token attention in the same dispatch, so a layer takes 4 dispatches, not 5. Each
    workgroup, once its rows are written, adds one to the counter (binding 11, ``NH`` u32s, zero
    between dispatches) of every query head its rows feed (a Q head's own, a K or V head's ``G``);
    the workgroup that brings a head's counter to ``3 D / (2 R)`` (every Q, K and V row of it
    written) sets it back to 0 and runs that head's attention (:func:`attention_groups_src`
    ``as_fn``, ``UK`` keys a round) into ``AO`` (binding 10, ``[NH*D]``), reading Q from ``Y`` and
    the caches. The writes are made visible across workgroups by ``storageBarrier`` (a device-scope
    acquire-release barrier in naga's SPIR-V) before the count and after it is read.
    ``WGS_ATT`` is unused (the product's threads run the attention).
    """
    assert K % 4 == 0 and N % R == 0 and not (swiglu and rope) and rs >= 1 and R % rs == 0
    K4 = K // 4
    words = words if (words > 0 and words_ok(fmt, K)) else 0
    wide = wide if (wide > 0 and wide_ok(fmt, K) and not words) else 0
    decls = _product_decls(fmt, norm, swiglu, bias)
    kind = split_pieces(fmt, K)[0] if split else ""
    if kind in ("f16", "q4_k"):  # the same buffers read as vec4<u32>
        mk = (lambda n, bnd: _wide_decl(n, bnd, "f16")) if kind == "f16" else (lambda n, bnd: _words_decl(n, bnd, 4, mant))
        decls = decls.replace(weight_decl("W", 1, fmt), mk("W", 1))
        if swiglu:
            decls = decls.replace(weight_decl("W2", 5, fmt), mk("W2", 5))
    if split:
        words = wide = 0
    if words:
        decls = decls.replace(weight_decl("W", 1, fmt), _words_decl("W", 1, lane_words))
        if swiglu:
            decls = decls.replace(weight_decl("W2", 5, fmt), _words_decl("W2", 5, lane_words))
    if wide:
        decls = decls.replace(weight_decl("W", 1, fmt), _wide_decl("W", 1, fmt))
        if swiglu:
            decls = decls.replace(weight_decl("W2", 5, fmt), _wide_decl("W2", 5, fmt))
    s = [PARAMS, decls]
    if rope:
        NH, KV, D = rope
        assert N == (NH + 2 * KV) * D and (N // 2) % R == 0
        s.append("@group(0) @binding(6) var<storage, read_write> KC: array<f32>;\n")
        s.append("@group(0) @binding(7) var<storage, read_write> VC: array<f32>;\n")
        s.append("@group(0) @binding(8) var<storage, read> ROPE: array<f32>;\n")
        s.append(f"const NH: u32 = {NH}u;\nconst KV: u32 = {KV}u;\nconst D: u32 = {D}u;\nconst HALF: u32 = {D // 2}u;\n"
                 f"const KVD: u32 = {KV * D}u;\n")
    s.append(f"const K4: u32 = {K4}u;\nconst R: u32 = {R}u;\nconst U: u32 = {U}u;\nconst EPS: f32 = {_f(eps)};\n")
    two = swiglu or rope
    if att:
        assert rope and split and (rope[2] // 2) % R == 0, "fused attention needs the shared form with RoPE, R dividing D/2"
        NH, KV, D = rope
        s[1] = s[1].replace("@group(0) @binding(2) var<storage, read_write> Y: array<f32>;",
                            "@group(0) @binding(2) var<storage, read_write> Y: array<vec4<f32>>;")
        s = [x.replace("var<storage, read_write> KC: array<f32>;", "var<storage, read_write> KC: array<vec4<f32>>;")
              .replace("var<storage, read_write> VC: array<f32>;", "var<storage, read_write> VC: array<vec4<f32>>;") for x in s]
        s.append("@group(0) @binding(10) var<storage, read_write> AO: array<vec4<f32>>;\n"
                 "@group(0) @binding(11) var<storage, read_write> CNT: array<atomic<u32>>;\n"
                 "var<workgroup> att_todo: u32;\n"
                 f"const NEED: u32 = {3 * (D // 2) // R}u;  // workgroups writing a query head's Q, K and V rows\n")
        WGS_S = split_threads(split_pieces(fmt, K)[1], split_wg)
        s.append(attention_groups_src(NH, KV, D, WGS_S, att[1], att[2], as_fn=True))
    if split:
        return "".join(s) + _split_main(fmt, K, R, split_wg, norm, add, swiglu, bool(rope), bias, bool(att))
    if rs > 1 or words:
        return "".join(s) + _rows_main(fmt, K, WGS, rs, U, words, wide, norm, add, swiglu, bool(rope), bias, lane_words)
    body = [f"""
@compute @workgroup_size({WGS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, {SUBGROUP_BUILTINS}) {{
  for (var r = sg; r < R; r += nsg) {{
    let u = wid.x * R + r;"""]
    if rope:
        body.append("""
    let head = u / HALF;
    let j = u % HALF;
    let row = head * D + j;
    let row2 = row + HALF;""")
    else:
        body.append("\n    let row = u;")
    body.append("""
    var a = 0.0;
    var b = 0.0;
    var ss = 0.0;""")
    if wide:
        mats = [("a", "W", "row")] + ([("b", "W2", "row")] if swiglu else []) + ([("b", "W", "row2")] if rope else [])
        body.append(_wide_loop(fmt, K, wide, norm, mats))
    else:
        body.append(_plain_loop(K4, U, norm, swiglu, bool(rope)))
    body.append(_subgroup_sums([""], two, norm))
    body.append("\n    if (lane == 0u) {")
    if norm:
        body.append("\n      let sc = 1.0 / sqrt(ss / f32(K4 * 4u) + EPS);")
    body += _epilogue(norm, two, bias, swiglu, bool(rope), add)
    body.append("\n    }\n  }\n}\n")
    return "".join(s) + "".join(body)


def _subgroup_sums(rows: list[str], two: bool, norm: bool, indent: str = "    ") -> str:
    """WGSL lines that sum a subgroup's partial sums: ``a{r}`` (and ``b{r}`` with ``two``) for
    each row suffix ``r`` in ``rows``, then the sum of squares ``ss`` with ``norm``."""
    out = []
    for r in rows:
        out.append(f"\n{indent}a{r} = subgroupAdd(a{r});")
        if two:
            out.append(f"\n{indent}b{r} = subgroupAdd(b{r});")
    if norm:
        out.append(f"\n{indent}ss = subgroupAdd(ss);")
    return "".join(out)


def _epilogue(norm: bool, two: bool, bias: bool, swiglu: bool, rope: bool, add: bool) -> list[str]:
    """Lane 0's end of one row of :func:`matvec_src`: with ``a`` (and ``b``: SwiGLU's second matrix or
    RoPE's partner row) summed over the subgroup and ``sc`` the RMSNorm scale (``norm``): scale,
    bias, then SwiGLU, RoPE with the K/V cache writes, residual add or a plain store of ``Y[row]``."""
    body: list[str] = []
    if norm:
        body.append("\n      a = a * sc;")
        if two:
            body.append("\n      b = b * sc;")
    if bias:
        body.append("\n      a = a + B[row];")
        if rope:
            body.append("\n      b = b + B[row2];")
    if swiglu:
        body.append("\n      Y[row] = (a / (1.0 + exp(-a))) * b;")
    elif rope:
        body.append("""
      let pos = P.first_pos;
      if (head < NH + KV) {
        let c = ROPE[pos * D + j];
        let s = ROPE[pos * D + HALF + j];
        let y1 = a * c - b * s;
        let y2 = b * c + a * s;
        if (head < NH) {
          Y[row] = y1;
          Y[row2] = y2;
        } else {
          let kb = pos * KVD + (head - NH) * D + j;
          KC[kb] = y1;
          KC[kb + HALF] = y2;
        }
      } else {
        let vb = pos * KVD + (head - NH - KV) * D + j;
        VC[vb] = a;
        VC[vb + HALF] = b;
      }""")
    elif add:
        body.append("\n      Y[row] = Y[row] + a;")
    else:
        body.append("\n      Y[row] = a;")
    return body


def _plain_loop(K4: int, U: int, norm: bool, swiglu: bool, rope: bool) -> str:
    """The K loop of :func:`matvec_src` over ``ld_W`` vec4s: ``U`` independent loads per lane first
    (indices clamped in range, out-of-range terms masked to 0), then the sums. A loop with a
    run-time stride is not unrolled by the driver, so each iteration would wait a full memory
    round trip."""
    two = swiglu or rope
    body = ["\n    for (var k0 = lane; k0 < K4; k0 += sgs * U) {"]
    for u in range(U):
        idx = "k0" if u == 0 else f"min(k0 + {u}u * sgs, K4 - 1u)"
        body.append(f"\n      let i{u} = {idx};\n      var x{u} = X[i{u}];\n      let w{u} = ld_W(row * K4 + i{u});")
        if swiglu:
            body.append(f"\n      let v{u} = ld_W2(row * K4 + i{u});")
        if rope:
            body.append(f"\n      let v{u} = ld_W(row2 * K4 + i{u});")
    for u in range(U):
        m = "" if u == 0 else f" * select(0.0, 1.0, k0 + {u}u * sgs < K4)"
        if norm:
            body.append(f"\n      ss += dot(x{u}, x{u}){m};\n      x{u} = x{u} * NW[i{u}];")
        body.append(f"\n      a += dot(w{u}, x{u}){m};")
        if two:
            body.append(f"\n      b += dot(v{u}, x{u}){m};")
    body.append("\n    }")
    return "".join(body)


#: formats with a 16-byte-piece form of the one-token product: {format: (weights per piece, K multiple)}
WIDE_FORMATS = {"f16": (8, 8), "q4_k": (32, 256)}


def wide_ok(fmt, K: int) -> bool:
    """Whether :func:`matvec_src` can read ``fmt`` rows of ``K`` weights in 16-byte pieces
    (f16: 8 halves a piece, K a multiple of 8; Q4_K: a quarter of a 64-weight chunk's codes plus
    its block's header, K a multiple of 256)."""
    return isinstance(fmt, str) and fmt in WIDE_FORMATS and K % WIDE_FORMATS[fmt][1] == 0


def _wide_decl(name: str, binding: int, fmt: str) -> str:
    """Weight matrix ``name`` as ``array<vec4<u32>>`` (the same buffer as :func:`weight_decl`'s),
    and for Q4_K the helper ``q4k_<name>(codes, header, t, x...)`` summing one piece's 32 products.

    Q4_K's 144-byte blocks (ggml-common.h ``block_q4_K``) are 9 aligned vec4s: vec4 0 holds ``d``,
    ``dmin`` (float16) and the 12 bytes of 6-bit scales and mins, vec4 ``1 + t`` (t = 0..7) the
    codes ``qs[16t .. 16t + 15]``: low nibbles are weights ``64c + 16h + 0..15`` of sub-block
    ``2c`` and high nibbles weights ``64c + 32 + 16h + 0..15`` of sub-block ``2c + 1``
    (``c = t / 2``, ``h = t % 2``). Sub-block ``j``'s scale and min are unpacked as ggml's
    ``get_scale_min_k4``, four bytes at a time. A code ``c`` becomes a float as
    ``bitcast<f32>(0x4B000000 | c) - 2^23`` (exact; two full-rate operations instead of an
    integer-to-float conversion, which NVIDIA GPUs issue at a quarter of the rate).
    """
    s = f"@group(0) @binding({binding}) var<storage, read> {name}: array<vec4<u32>>;\n"
    if fmt == "q4_k":
        s += f"""fn nib_{name}(v: u32) -> vec4<f32> {{
  let c = (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
  return bitcast<vec4<f32>>(c | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
}}
fn q4k_{name}(w: vec4<u32>, h: vec4<u32>, t: u32, l0: vec4<f32>, l1: vec4<f32>, l2: vec4<f32>, l3: vec4<f32>,
              g0: vec4<f32>, g1: vec4<f32>, g2: vec4<f32>, g3: vec4<f32>) -> f32 {{
  let dm = unpack2x16float(h.x);
  let ch = t >> 1u;
{_q4k_scales("ch")}  let sc0 = f32((scw >> sh) & 255u);
  let sc1 = f32((scw >> (sh + 8u)) & 255u);
  let mn0 = f32((mnw >> sh) & 255u);
  let mn1 = f32((mnw >> (sh + 8u)) & 255u);
  let dl = dot(nib_{name}(w.x), l0) + dot(nib_{name}(w.y), l1) + dot(nib_{name}(w.z), l2) + dot(nib_{name}(w.w), l3);
  let dh = dot(nib_{name}(w.x >> 4u), g0) + dot(nib_{name}(w.y >> 4u), g1) + dot(nib_{name}(w.z >> 4u), g2)
         + dot(nib_{name}(w.w >> 4u), g3);
  let one = vec4<f32>(1.0);
  return dm.x * (sc0 * dl + sc1 * dh) - dm.y * (mn0 * dot(l0 + l1 + l2 + l3, one) + mn1 * dot(g0 + g1 + g2 + g3, one));
}}
"""
    return s


def _wide_loop(fmt: str, K: int, UMAX: int, norm: bool, mats: list[tuple[str, str, str]]) -> str:
    """The K loop of :func:`matvec_src` over 16-byte pieces of each row (``NP`` pieces), summing
    every matrix row of ``mats`` (``(accumulator, matrix, row)``, :func:`_row_mats`) against the
    same x pieces.

    Lane ``lane`` takes pieces ``p0 + u * sgs`` (u < ``U``); ``U`` is the fewest loads per lane
    (at most ``UMAX``) that cover a row in the fewest rounds of a 32-lane subgroup, so rows of
    3,072 f16 weights (384 pieces) take 2 rounds of 6, not 1.5 of 8. Every piece's loads are
    issued before its sums; pieces past the row are clamped and masked to 0. f16 pieces are 8
    halves (``unpack2x16float``) against 2 vec4s of x; a Q4_K piece is 16 code bytes and its
    block's header against 8 vec4s of x (:func:`_wide_decl`).
    """
    import math

    per, _ = WIDE_FORMATS[fmt]
    NP = K // per
    rounds = math.ceil(NP / (32 * UMAX))
    U = max(1, min(UMAX, math.ceil(NP / (32 * rounds))))
    q4k = fmt == "q4_k"
    nx = 8 if q4k else 2  # vec4s of x per piece
    body = [f"\n    for (var p0 = lane; p0 < {NP}u; p0 += sgs * {U}u) {{"]
    for u in range(U):
        idx = "p0" if u == 0 else f"min(p0 + {u}u * sgs, {NP - 1}u)"
        body.append(f"\n      let p{u} = {idx};")
        if q4k:
            body.append(f"\n      let t{u} = p{u} & 7u;")
            for m, (_, W, r) in enumerate(mats):
                body.append(f"\n      let wb{u}_{m} = ({r} * {K // 256}u + (p{u} >> 3u)) * 9u;"
                            f"\n      let w{u}_{m} = {W}[wb{u}_{m} + 1u + t{u}];\n      let h{u}_{m} = {W}[wb{u}_{m}];")
            body.append(f"\n      let xb{u} = (p{u} >> 3u) * 64u + (t{u} >> 1u) * 16u + (t{u} & 1u) * 4u;")
            offs = [0, 1, 2, 3, 8, 9, 10, 11]
        else:
            for m, (_, W, r) in enumerate(mats):
                body.append(f"\n      let w{u}_{m} = {W}[{r} * {NP}u + p{u}];")
            body.append(f"\n      let xb{u} = p{u} * 2u;")
            offs = [0, 1]
        for e, o in enumerate(offs):
            body.append(f"\n      var x{u}_{e} = X[xb{u} + {o}u];")
    for u in range(U):
        mk = "" if u == 0 else f" * select(0.0, 1.0, p0 + {u}u * sgs < {NP}u)"
        xs = [f"x{u}_{e}" for e in range(nx)]
        if norm:
            body.append(f"\n      ss += ({' + '.join(f'dot({x}, {x})' for x in xs)}){mk};")
            for e, o in enumerate(offs):
                body.append(f"\n      x{u}_{e} = x{u}_{e} * NW[xb{u} + {o}u];")
        for m, (acc, W, _) in enumerate(mats):
            v = f"w{u}_{m}"
            if q4k:
                body.append(f"\n      {acc} += q4k_{W}({v}, h{u}_{m}, t{u}, {', '.join(xs)}){mk};")
            else:
                body.append(f"\n      {acc} += (dot(vec4<f32>(unpack2x16float({v}.x), unpack2x16float({v}.y)), {xs[0]})"
                            f" + dot(vec4<f32>(unpack2x16float({v}.z), unpack2x16float({v}.w)), {xs[1]})){mk};")
    body.append("\n    }")
    return "".join(body)


def words_ok(fmt, K: int) -> bool:
    """Whether :func:`matvec_src` can read ``fmt`` rows of ``K`` weights as u32 code words
    (:func:`_words_loop`): Q4_K with K a multiple of 256."""
    return fmt == "q4_k" and K % 256 == 0


def _q4k_scales(c: str) -> str:
    """WGSL lines unpacking sub-blocks ``2c`` and ``2c + 1``'s 6-bit scales and mins of a Q4_K
    header ``h`` (vec4 0 of a block) as ggml's ``get_scale_min_k4``, four bytes at a time:
    ``scw`` (scales) and ``mnw`` (mins) hold sub-blocks ``4 * (c / 2) .. + 3``, byte ``2 * (c % 2)``
    onwards; ``sh`` is that byte's bit offset. ``c`` is the 64-weight chunk (0..3)."""
    return f"""  let first = {c} < 2u;
  let scw = select((h.w & 0x0F0F0F0Fu) | ((h.y >> 2u) & 0x30303030u), h.y & 0x3F3F3F3Fu, first);
  let mnw = select(((h.w >> 4u) & 0x0F0F0F0Fu) | ((h.z >> 2u) & 0x30303030u), h.z & 0x3F3F3F3Fu, first);
  let sh = ({c} & 1u) * 16u;
"""


def _words_decl(name: str, binding: int, G: int = 1, mant: bool = False) -> str:
    """Q4_K matrix ``name`` as ``array<vec4<u32>>`` (the buffer of :func:`weight_decl`; a block is 9
    vec4s, :func:`_wide_decl`) and ``q4kw_<name>(q, header, c, xl, xh, tl, th)``: the ``8 G``
    products of ``G`` consecutive u32 code words ``q`` (``G`` = 1, 2 or 4). Word ``w`` (0..31) of a
    block is bytes ``qs[4w .. 4w + 3]``, chunk ``c = w / 8``, ``m = w % 8``: its low nibbles are
    weights ``64c + 4m + 0..3`` (sub-block ``2c``, x vec4 ``xl[e]`` for word ``e`` of the group),
    its high nibbles weights ``64c + 32 + 4m + 0..3`` (sub-block ``2c + 1``, ``xh[e]``); ``tl``,
    ``th`` are the sums of the ``xl``, ``xh`` (for the mins). Codes and 6-bit scales become floats
    exactly as ``bitcast<f32>(0x4B000000 | c) - 2^23`` (:func:`_wide_decl`).

    ``mant``: the codes become ``1 + c / 16`` instead, each nibble shifted straight into the
    mantissa (``bitcast<f32>(0x3F800000 | c << 19)``: a shift and one and-or a weight, no
    subtraction), and a sub-block's ``sum c x`` is ``16 (sum (1 + c/16) x - sum x)``, its
    ``sum x`` (``tl``, ``th``) being there already for the mins: one operation a weight fewer
    (exact values; only the summation's rounding differs, by about one bit)."""
    assert G in (1, 2, 4)
    qv = "u32" if G == 1 else f"vec{G}<u32>"
    xv = "vec4<f32>" if G == 1 else f"array<vec4<f32>, {G}>"
    one = lambda e: "q" if G == 1 else f"q[{e}]"  # noqa: E731
    xe = lambda x, e: x if G == 1 else f"{x}[{e}]"  # noqa: E731
    if mant:
        lo = " + ".join(f"dot(nibl_{name}({one(e)}), {xe('xl', e)})" for e in range(G))
        hi = " + ".join(f"dot(nibh_{name}({one(e)}), {xe('xh', e)})" for e in range(G))
        return f"""@group(0) @binding({binding}) var<storage, read> {name}: array<vec4<u32>>;
fn nibl_{name}(v: u32) -> vec4<f32> {{
  let c = vec4<u32>(v << 19u, v << 11u, v << 3u, v >> 5u) & vec4<u32>(0x00780000u);
  return bitcast<vec4<f32>>(c | vec4<u32>(0x3F800000u));
}}
fn nibh_{name}(v: u32) -> vec4<f32> {{
  let c = vec4<u32>(v << 15u, v << 7u, v >> 1u, v >> 9u) & vec4<u32>(0x00780000u);
  return bitcast<vec4<f32>>(c | vec4<u32>(0x3F800000u));
}}
fn q4kw_{name}(q: {qv}, h: vec4<u32>, c: u32, xl: {xv}, xh: {xv}, tl: f32, th: f32) -> f32 {{
  let dm = unpack2x16float(h.x);
{_q4k_scales("c")}  let s = bitcast<vec4<f32>>(((vec4<u32>(scw, scw, mnw, mnw) >> vec4<u32>(sh, sh + 8u, sh, sh + 8u)) & vec4<u32>(255u))
                           | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
  return dm.x * 16.0 * (s.x * (({lo}) - tl) + s.y * (({hi}) - th)) - dm.y * (s.z * tl + s.w * th);
}}
"""
    lo = " + ".join(f"dot(nibw_{name}({one(e)}), {xe('xl', e)})" for e in range(G))
    hi = " + ".join(f"dot(nibw_{name}({one(e)} >> 4u), {xe('xh', e)})" for e in range(G))
    return f"""@group(0) @binding({binding}) var<storage, read> {name}: array<vec4<u32>>;
fn nibw_{name}(v: u32) -> vec4<f32> {{
  let c = (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
  return bitcast<vec4<f32>>(c | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
}}
fn q4kw_{name}(q: {qv}, h: vec4<u32>, c: u32, xl: {xv}, xh: {xv}, tl: f32, th: f32) -> f32 {{
  let dm = unpack2x16float(h.x);
{_q4k_scales("c")}  let s = bitcast<vec4<f32>>(((vec4<u32>(scw, scw, mnw, mnw) >> vec4<u32>(sh, sh + 8u, sh, sh + 8u)) & vec4<u32>(255u))
                           | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
  return dm.x * (s.x * ({lo}) + s.y * ({hi})) - dm.y * (s.z * tl + s.w * th);
}}
"""


def _row_mats(rs: int, swiglu: bool, rope: bool) -> list[tuple[str, str, str]]:
    """``(accumulator, matrix, row)`` of every matrix row a subgroup of :func:`_rows_main` sums:
    ``rs`` rows of W, each with SwiGLU's W2 row or RoPE's partner row of W."""
    mats = []
    for i in range(rs):
        mats.append((f"a{i}", "W", f"row{i}"))
        if swiglu:
            mats.append((f"b{i}", "W2", f"row{i}"))
        if rope:
            mats.append((f"b{i}", "W", f"row2_{i}"))
    return mats


def _rows_loop(K4: int, U: int, norm: bool, mats: list[tuple[str, str, str]]) -> str:
    """The K loop of :func:`_rows_main` over ``ld_<matrix>`` vec4s: as :func:`_plain_loop`, but each
    x vec4 (and norm weight) a lane loads serves every row in ``mats``."""
    body = [f"\n    for (var k0 = lane; k0 < {K4}u; k0 += sgs * {U}u) {{"]
    for u in range(U):
        idx = "k0" if u == 0 else f"min(k0 + {u}u * sgs, {K4 - 1}u)"
        body.append(f"\n      let i{u} = {idx};\n      var x{u} = X[i{u}];")
        for m, (_, W, r) in enumerate(mats):
            body.append(f"\n      let w{u}_{m} = ld_{W}({r} * {K4}u + i{u});")
    for u in range(U):
        m_ = "" if u == 0 else f" * select(0.0, 1.0, k0 + {u}u * sgs < {K4}u)"
        if norm:
            body.append(f"\n      ss += dot(x{u}, x{u}){m_};\n      x{u} = x{u} * NW[i{u}];")
        for m, (acc, _, _) in enumerate(mats):
            body.append(f"\n      {acc} += dot(w{u}_{m}, x{u}){m_};")
    body.append("\n    }")
    return "".join(body)


def _words_loop(K: int, UMAX: int, norm: bool, mats: list[tuple[str, str, str]], G: int = 1) -> str:
    """The K loop of :func:`_rows_main` over Q4_K code words (:func:`_words_decl`), ``G`` words a lane.

    A row of ``K / 256`` blocks has ``NQ = K / 8`` code words in ``NQ / G`` groups of ``G``;
    lane ``lane`` takes groups ``g0 + u * sgs`` (u < ``U``, ``U`` at most ``UMAX`` and balanced
    as in :func:`_wide_loop`), so the lanes of a subgroup read consecutive words of a block (with
    ``G = 1``, one 128-byte line per 32 lanes) and consecutive x vec4s ``16c + m`` and
    ``16c + 8 + m`` of chunk ``c`` (``G = 1``: 4 lines per 32 lanes, every byte used; ``G``
    vec4s a lane otherwise). The block header (vec4 0) is one address for all lanes of the block.
    Each lane loads x once for every row in ``mats``; groups past the row are clamped and masked.
    """
    import math

    nbr, NG = K // 256, K // 8 // G
    rounds = math.ceil(NG / (32 * UMAX))
    U = max(1, min(UMAX, math.ceil(NG / (32 * rounds))))
    body = [f"\n    for (var g0 = lane; g0 < {NG}u; g0 += sgs * {U}u) {{"]
    for u in range(U):
        idx = "g0" if u == 0 else f"min(g0 + {u}u * sgs, {NG - 1}u)"
        body.append(f"\n      let q{u} = {idx} * {G}u;\n      let bk{u} = q{u} >> 5u;\n      let c{u} = (q{u} >> 3u) & 3u;"
                    f"\n      let xi{u} = bk{u} * 64u + c{u} * 16u + (q{u} & 7u);")
        for e in range(G):
            body.append(f"\n      var xl{u}_{e} = X[xi{u} + {e}u];\n      var xh{u}_{e} = X[xi{u} + {8 + e}u];")
        for m, (_, W, r) in enumerate(mats):
            body.append(f"\n      let vb{u}_{m} = ({r} * {nbr}u + bk{u}) * 9u + 1u + ((q{u} >> 2u) & 7u);"
                        f"\n      let h{u}_{m} = {W}[({r} * {nbr}u + bk{u}) * 9u];")
            if G == 4:
                body.append(f"\n      let w{u}_{m} = {W}[vb{u}_{m}];")
            elif G == 2:
                body.append(f"\n      let w{u}_{m} = select({W}[vb{u}_{m}].zw, {W}[vb{u}_{m}].xy, (q{u} & 2u) == 0u);")
            else:
                body.append(f"\n      let w{u}_{m} = {W}[vb{u}_{m}][q{u} & 3u];")
    for u in range(U):
        mk = "" if u == 0 else f" * select(0.0, 1.0, g0 + {u}u * sgs < {NG}u)"
        xl = [f"xl{u}_{e}" for e in range(G)]
        xh = [f"xh{u}_{e}" for e in range(G)]
        if norm:
            body.append(f"\n      ss += ({' + '.join(f'dot({x}, {x})' for x in xl + xh)}){mk};")
            for e in range(G):
                body.append(f"\n      xl{u}_{e} = xl{u}_{e} * NW[xi{u} + {e}u];\n      xh{u}_{e} = xh{u}_{e} * NW[xi{u} + {8 + e}u];")
        body.append(f"\n      let tl{u} = dot({' + '.join(xl)}, vec4<f32>(1.0));\n      let th{u} = dot({' + '.join(xh)}, vec4<f32>(1.0));")
        xa = (xl[0], xh[0]) if G == 1 else (f"array<vec4<f32>, {G}>({', '.join(xl)})", f"array<vec4<f32>, {G}>({', '.join(xh)})")
        for m, (acc, W, _) in enumerate(mats):
            body.append(f"\n      {acc} += q4kw_{W}(w{u}_{m}, h{u}_{m}, c{u}, {xa[0]}, {xa[1]}, tl{u}, th{u}){mk};")
    body.append("\n    }")
    return "".join(body)


def _rows_main(fmt: str, K: int, WGS: int, rs: int, U: int, words: int, wide: int, norm: bool, add: bool, swiglu: bool,
               rope: bool, bias: bool, lane_words: int = 1) -> str:
    """``main`` of :func:`matvec_src` with ``rs`` rows (or RoPE row pairs) per subgroup at once:
    subgroup ``sg`` takes rows ``r .. r + rs - 1`` for ``r = sg * rs, (sg + nsg) * rs, ...``, sums
    them in one loop (:func:`_words_loop` for Q4_K words, ``words`` groups of ``lane_words`` a
    lane and row in flight;
    :func:`_wide_loop` for 16-byte pieces, at most ``wide``; else :func:`_rows_loop` with ``U``),
    then lane 0 finishes each row as :func:`_epilogue` does."""
    two = swiglu or rope
    mats = _row_mats(rs, swiglu, rope)
    body = [f"""
@compute @workgroup_size({WGS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, {SUBGROUP_BUILTINS}) {{
  for (var r = sg * {rs}u; r < R; r += nsg * {rs}u) {{"""]
    for i in range(rs):
        body.append(f"\n    let u{i} = wid.x * R + r + {i}u;")
        if rope:
            body.append(f"\n    let head{i} = u{i} / HALF;\n    let j{i} = u{i} % HALF;\n    let row{i} = head{i} * D + j{i};"
                        f"\n    let row2_{i} = row{i} + HALF;")
        else:
            body.append(f"\n    let row{i} = u{i};")
        body.append(f"\n    var a{i} = 0.0;\n    var b{i} = 0.0;")
    body.append("\n    var ss = 0.0;")
    if words:
        body.append(_words_loop(K, words, norm, mats, lane_words))
    elif wide:
        body.append(_wide_loop(fmt, K, wide, norm, mats))
    else:
        body.append(_rows_loop(K // 4, U, norm, mats))
    body.append(_subgroup_sums([str(i) for i in range(rs)], two, norm))
    body.append("\n    if (lane == 0u) {")
    if norm:
        body.append("\n      let sc = 1.0 / sqrt(ss / f32(K4 * 4u) + EPS);")
    for i in range(rs):
        names = f"\n      let row = row{i};\n      var a = a{i};\n      var b = b{i};"
        if rope:
            names += f"\n      let head = head{i};\n      let j = j{i};\n      let row2 = row2_{i};"
        body.append("\n      {" + names.replace("\n      ", "\n        "))
        body.append("".join(_epilogue(norm, two, bias, swiglu, rope, add)).replace("\n      ", "\n        "))
        body.append("\n      }")
    body.append("\n    }\n  }\n}\n")
    return "".join(body)


def split_pieces(fmt, K: int) -> tuple[str, int]:
    """The piece :func:`matvec_src`'s ``split`` form reads of a ``fmt`` row of ``K`` weights, and
    pieces per row: ``("f16", K / 8)`` (8 halves, one ``vec4<u32>``; K a multiple of 8),
    ``("q4_k", K / 32)`` (one 16-byte code vec4 of a block, 4 consecutive u32 code words, with its
    block's header; K a multiple of 256), else ``("vec4", K / 4)`` (the format's vec4 loader)."""
    if fmt == "f16" and K % 8 == 0:
        return "f16", K // 8
    if fmt == "q4_k" and K % 256 == 0:
        return "q4_k", K // 32
    return "vec4", K // 4


def split_threads(NP: int, wg_max: int = 256) -> int:
    """Threads a workgroup of the ``split`` form has for rows of ``NP`` pieces: the largest multiple
    of 32 at most ``wg_max`` that divides ``NP`` (so no lane is idle), if it is at least
    ``min(NP, 128)``; else ``NP`` rounded up to 32, at most ``wg_max`` (the pieces past the row masked)."""
    best = max((w for w in range(32, wg_max + 1, 32) if NP % w == 0), default=0)
    if best and best >= min(NP, 128):
        return best
    return min(wg_max, -(-NP // 32) * 32)


def _split_main(fmt, K: int, R: int, wg_max: int, norm: bool, add: bool, swiglu: bool, rope: bool, bias: bool,
                att: bool = False) -> str:
    """``main`` of :func:`matvec_src`'s ``split`` form: one workgroup computes ``R`` rows (row pairs
    with ``rope``), its threads splitting every row's K in pieces (:func:`split_pieces`).

    Thread ``lid`` takes pieces ``lid + j * WGS`` (``j < J``, ``WGS`` from :func:`split_threads`),
    loads their x (and norm weight) once, then the pieces of all ``R`` rows (and SwiGLU's or RoPE's
    second row), every load of the workgroup issued before any sum needs it: one memory round trip
    a workgroup, and an x load serves ``R`` rows. Per row the subgroups' sums (``subgroupAdd``) meet
    in workgroup memory; thread ``r < R`` finishes row ``r`` as :func:`_epilogue` does.
    """
    kind, NP = split_pieces(fmt, K)
    WGS = split_threads(NP, wg_max)
    J = -(-NP // WGS)
    masked = J * WGS != NP
    two = swiglu or rope
    mats = []  # (accumulator, matrix, row expression)
    for r in range(R):
        mats.append((f"a{r}", "W", f"row{r}"))
        if swiglu:
            mats.append((f"b{r}", "W2", f"row{r}"))
        if rope:
            mats.append((f"b{r}", "W", f"row2_{r}"))
    per = 2 if two else 1
    NV = R * per + 1  # sums of one subgroup in workgroup memory: R rows (x 2), the sum of squares
    nbr = K // 256
    b = [f"""
const WGS: u32 = {WGS}u;
const NV: u32 = {NV}u;
var<workgroup> red: array<f32, {max(1, WGS // 4) * NV}>;

@compute @workgroup_size({WGS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, {SUBGROUP_BUILTINS}) {{
  var ss = 0.0;"""]
    for r in range(R):
        b.append(f"\n  let u{r} = wid.x * R + {r}u;")
        if rope:
            b.append(f"\n  let row{r} = (u{r} / HALF) * D + u{r} % HALF;\n  let row2_{r} = row{r} + HALF;")
        else:
            b.append(f"\n  let row{r} = u{r};")
        b.append(f"\n  var a{r} = 0.0;\n  var b{r} = 0.0;")
    for j in range(J):
        if masked:
            b.append(f"\n  let ok{j} = lid + {j * WGS}u < {NP}u;\n  let p{j} = min(lid + {j * WGS}u, {NP - 1}u);")
        else:
            b.append(f"\n  let p{j} = lid + {j * WGS}u;")
        if kind == "q4_k":
            b.append(f"\n  let bk{j} = p{j} >> 3u;\n  let t{j} = p{j} & 7u;\n  let c{j} = t{j} >> 1u;"
                     f"\n  let xi{j} = bk{j} * 64u + c{j} * 16u + (t{j} & 1u) * 4u;")
            xs = [(f"xl{j}_{e}", f"xi{j} + {e}u") for e in range(4)] + [(f"xh{j}_{e}", f"xi{j} + {8 + e}u") for e in range(4)]
        elif kind == "f16":
            xs = [(f"x{j}_0", f"p{j} * 2u"), (f"x{j}_1", f"p{j} * 2u + 1u")]
        else:
            xs = [(f"x{j}_0", f"p{j}")]
        for v, i in xs:
            b.append(f"\n  var {v} = X[{i}];")
        if masked:
            for v, _ in xs:
                b.append(f"\n  {v} = select(vec4<f32>(0.0), {v}, ok{j});")
        if norm:
            b.append(f"\n  ss += {' + '.join(f'dot({v}, {v})' for v, _ in xs)};")
            for v, i in xs:
                b.append(f"\n  {v} = {v} * NW[{i}];")
        if kind == "q4_k":
            xl = ", ".join(f"xl{j}_{e}" for e in range(4))
            xh = ", ".join(f"xh{j}_{e}" for e in range(4))
            b.append(f"\n  let tl{j} = dot(xl{j}_0 + xl{j}_1 + xl{j}_2 + xl{j}_3, vec4<f32>(1.0));"
                     f"\n  let th{j} = dot(xh{j}_0 + xh{j}_1 + xh{j}_2 + xh{j}_3, vec4<f32>(1.0));"
                     f"\n  let xla{j} = array<vec4<f32>, 4>({xl});\n  let xha{j} = array<vec4<f32>, 4>({xh});")
    for j in range(J):
        for m, (_, W, r) in enumerate(mats):
            if kind == "q4_k":
                b.append(f"\n  let wb{j}_{m} = ({r} * {nbr}u + bk{j}) * 9u;"
                         f"\n  let w{j}_{m} = {W}[wb{j}_{m} + 1u + t{j}];\n  let h{j}_{m} = {W}[wb{j}_{m}];")
            elif kind == "f16":
                b.append(f"\n  let w{j}_{m} = {W}[{r} * {NP}u + p{j}];")
            else:
                b.append(f"\n  let w{j}_{m} = ld_{W}({r} * {NP}u + p{j});")
    for j in range(J):
        for m, (acc, W, _) in enumerate(mats):
            if kind == "q4_k":
                term = f"q4kw_{W}(w{j}_{m}, h{j}_{m}, c{j}, xla{j}, xha{j}, tl{j}, th{j})"
            elif kind == "f16":
                v = f"w{j}_{m}"
                term = (f"dot(vec4<f32>(unpack2x16float({v}.x), unpack2x16float({v}.y)), x{j}_0)"
                        f" + dot(vec4<f32>(unpack2x16float({v}.z), unpack2x16float({v}.w)), x{j}_1)")
            else:
                term = f"dot(w{j}_{m}, x{j}_0)"
            b.append(f"\n  {acc} += select(0.0, {term}, ok{j});" if masked else f"\n  {acc} += {term};")
    b.append(_subgroup_sums([str(r) for r in range(R)], two, norm, "  "))
    b.append("\n  if (lane == 0u) {")
    for r in range(R):
        b.append(f"\n    red[sg * NV + {r * per}u] = a{r};")
        if two:
            b.append(f"\n    red[sg * NV + {r * per + 1}u] = b{r};")
    b.append(f"\n    red[sg * NV + {R * per}u] = ss;\n  }}\n  workgroupBarrier();\n  if (lid < R) {{"
             "\n    var a = 0.0;\n    var b = 0.0;\n    var q = 0.0;"
             f"\n    for (var s = 0u; s < nsg; s++) {{\n      a += red[s * NV + lid * {per}u];")
    if two:
        b.append(f"\n      b += red[s * NV + lid * {per}u + 1u];")
    b.append(f"\n      q += red[s * NV + {R * per}u];\n    }}\n    let u = wid.x * R + lid;")
    if rope:
        b.append("\n    let head = u / HALF;\n    let j = u % HALF;\n    let row = head * D + j;\n    let row2 = row + HALF;")
    else:
        b.append("\n    let row = u;")
    if norm:
        b.append("\n    let sc = 1.0 / sqrt(q / f32(K4 * 4u) + EPS);")
    b.append("".join(_epilogue(norm, two, bias, swiglu, rope, add)).replace("\n      ", "\n    "))
    if not att:
        b.append("\n  }\n}\n")
        return "".join(b)
    # the epilogue's scalar stores into the vec4 views of Y and the caches, then the count
    # workgroups in kv-group order (K rows, V rows, then the G query heads' rows of group 0, then
    # group 1, ...; the GPU starts them about in index order), so a group's heads complete while the
    # later groups' rows are still being read, their attention hidden under those reads, and the
    # last workgroup of each head is one of its own Q workgroups, not one V workgroup for G heads
    ep = "".join(b).replace("wid.x * R", "wx * R")
    ep = ep.replace("  var ss = 0.0;", """  let PW = HALF / R;  // workgroups a head
  let gi = wid.x / ((G + 2u) * PW);
  let gr = wid.x % ((G + 2u) * PW);
  var wx = (NH + gi) * PW + gr;  // K rows of group gi
  if (gr >= 2u * PW) { wx = (gi * G) * PW + gr - 2u * PW; }  // its query heads' rows
  else if (gr >= PW) { wx = (NH + KV + gi) * PW + gr - PW; }  // V rows
  var ss = 0.0;""", 1)
    for a, v in (("Y[row]", "row"), ("Y[row2]", "row2"), ("KC[kb]", "kb"), ("KC[kb + HALF]", "kb + HALF"),
                 ("VC[vb]", "vb"), ("VC[vb + HALF]", "vb + HALF")):
        ep = ep.replace(f" {a} = ", f" {a.split('[')[0]}[({v}) >> 2u][({v}) & 3u] = ")
    return ep + f"""
  }}
  storageBarrier();  // this workgroup's Q, K, V rows, before its counts
  let hd = (wx * R) / HALF;
  var h0 = hd;
  if (hd >= NH + KV) {{ h0 = (hd - NH - KV) * G; }} else if (hd >= NH) {{ h0 = (hd - NH) * G; }}
  let nh = select(G, 1u, hd < NH);
  if (lid == 0u) {{
    var fl = 0u;
    for (var i = 0u; i < nh; i++) {{
      if (atomicAdd(&CNT[h0 + i], 1u) == NEED - 1u) {{
        atomicStore(&CNT[h0 + i], 0u);
        fl |= 1u << i;
      }}
    }}
    att_todo = fl;
  }}
  let todo = workgroupUniformLoad(&att_todo);
  if (todo != 0u) {{
    storageBarrier();  // every other workgroup's rows of these heads, after their counts
    for (var i = 0u; i < G; i++) {{
      if (((todo >> i) & 1u) != 0u) {{
        attend(h0 + i, lid, lane, sg, sgs);
        workgroupBarrier();
      }}
    }}
  }}
}}
"""



def _attention1_decls(NH: int, KV: int, D: int) -> str:
    """Params, the bindings of the one-token attention kernels (0 QKV, 1 KC, 2 VC as vec4s, 3 O,
    4 Params) and their constants ``G`` (query heads a KV head), ``D4``, ``KVD4``."""
    return PARAMS + f"""
@group(0) @binding(0) var<storage, read> QKV: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> KC: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> VC: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> P: Params;
const G: u32 = {NH // KV}u;
const D4: u32 = {D // 4}u;
const KVD4: u32 = {KV * (D // 4)}u;
"""


def attention1_src(NH: int, KV: int, D: int, WGS: int = 256, CH: int = 2048, window: int = 0) -> str:
    """One-token causal GQA attention (decode): one workgroup of ``WGS`` threads per query head.

    Keys are taken in chunks of ``CH`` with the running-max softmax across chunks. Within a
    chunk: each thread scores whole keys (the query sits in ``D/4`` vec4 registers, the dot
    product is unrolled), the chunk max and sum meet through ``subgroupMax``/``subgroupAdd`` and
    workgroup memory, then ``WGS / (D/4)`` slices of ``D/4`` threads accumulate ``p_j * V[j]`` as
    vec4s (one slice reads one key's row: coalesced) and the slices are summed.
    Bindings: 0 QKV (Q rotated, ``[NH*D]`` first), 1 KC, 2 VC ``[ctx, KV*D]``, 3 O ``[NH*D]``, 4 Params.
    Dispatch ``(NH,)``; query position ``first_pos`` sees keys ``0..first_pos`` (with ``window`` > 0,
    only the last ``window`` of them).
    """
    import math

    D4 = D // 4
    assert D % 4 == 0 and WGS % D4 == 0
    qload = "\n".join(f"  let q{e} = QKV[h * D4 + {e}u] * SCALE;" for e in range(D4))
    qdot = " + ".join(f"dot(q{e}, KC[kb + {e}u])" for e in range(D4))
    return _attention1_decls(NH, KV, D) + f"""const WGS: u32 = {WGS}u;
const SL: u32 = {WGS // D4}u;
const CH: u32 = {CH}u;
const SCALE: f32 = {_f(1.0 / math.sqrt(D))};
var<workgroup> sc: array<f32, {CH}>;
var<workgroup> red: array<f32, {WGS}>;
var<workgroup> part: array<vec4<f32>, {WGS}>;

fn wg_max(v: f32, lane: u32, sg: u32, nsg: u32) -> f32 {{
  let m = subgroupMax(v);
  if (lane == 0u) {{ red[sg] = m; }}
  workgroupBarrier();
  var r = red[0];
  for (var i = 1u; i < nsg; i++) {{ r = max(r, red[i]); }}
  workgroupBarrier();
  return r;
}}

fn wg_sum(v: f32, lane: u32, sg: u32, nsg: u32) -> f32 {{
  let m = subgroupAdd(v);
  if (lane == 0u) {{ red[sg] = m; }}
  workgroupBarrier();
  var r = 0.0;
  for (var i = 0u; i < nsg; i++) {{ r += red[i]; }}
  workgroupBarrier();
  return r;
}}

@compute @workgroup_size({WGS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, {SUBGROUP_BUILTINS}) {{
  let h = wid.x;
  let kvo4 = (h / G) * D4;
  let T = P.first_pos + 1u;
{qload}
  let d4 = lid % D4;
  let sl = lid / D4;
  var m = -1e30;
  var l = 0.0;
  var acc = vec4<f32>(0.0);
  var lo = 0u;
  if ({int(window)}u > 0u && T > {int(window)}u) {{ lo = T - {int(window)}u; }}
  for (var c0 = lo; c0 < T; c0 += CH) {{
    let cn = min(CH, T - c0);
    var lmax = -1e30;
    for (var j = lid; j < cn; j += WGS) {{
      let kb = (c0 + j) * KVD4 + kvo4;
      let s = {qdot};
      sc[j] = s;
      lmax = max(lmax, s);
    }}
    let nm = max(m, wg_max(lmax, lane, sg, nsg));
    var lsum = 0.0;
    for (var j = lid; j < cn; j += WGS) {{
      let p = exp(sc[j] - nm);
      sc[j] = p;
      lsum += p;
    }}
    let csum = wg_sum(lsum, lane, sg, nsg);
    let corr = exp(m - nm);
    var a = vec4<f32>(0.0);
    for (var j = sl; j < cn; j += SL * 4u) {{
      let j1 = min(j + SL, cn - 1u);
      let j2 = min(j + 2u * SL, cn - 1u);
      let j3 = min(j + 3u * SL, cn - 1u);
      let v0 = VC[(c0 + j) * KVD4 + kvo4 + d4];
      let v1 = VC[(c0 + j1) * KVD4 + kvo4 + d4];
      let v2 = VC[(c0 + j2) * KVD4 + kvo4 + d4];
      let v3 = VC[(c0 + j3) * KVD4 + kvo4 + d4];
      a += sc[j] * v0 + select(0.0, sc[j1], j + SL < cn) * v1 + select(0.0, sc[j2], j + 2u * SL < cn) * v2
         + select(0.0, sc[j3], j + 3u * SL < cn) * v3;
    }}
    acc = acc * corr + a;
    l = l * corr + csum;
    m = nm;
    workgroupBarrier();
  }}
  part[lid] = acc;
  workgroupBarrier();
  if (lid < D4) {{
    var o = vec4<f32>(0.0);
    for (var i = 0u; i < SL; i++) {{ o += part[i * D4 + lid]; }}
    O[h * D4 + lid] = o / l;
  }}
}}
"""


def attention_groups_lanes(D: int) -> int:
    """Lanes of one key group of :func:`attention_groups_src` for head dim ``D``: 8, or ``D/4`` if that
    is not a multiple of 8."""
    D4 = D // 4
    return 8 if D4 % 8 == 0 else D4


def attention_groups_ok(D: int, subgroup_size: int) -> bool:
    """Whether :func:`attention_groups_src` serves head dim ``D`` on subgroups of ``subgroup_size``
    lanes: a key group's lanes (:func:`attention_groups_lanes`) a power of two that divides it."""
    L = attention_groups_lanes(D)
    return D % 4 == 0 and L > 0 and L & (L - 1) == 0 and subgroup_size > 0 and subgroup_size % L == 0


def attention_groups_src(NH: int, KV: int, D: int, WGS: int = 256, UK: int = 2, window: int = 0, as_fn: bool = False) -> str:
    """One-token causal GQA attention (decode) with key groups: one workgroup of ``WGS`` threads per
    query head, split into groups of ``L`` lanes (``L`` = 8, or ``D/4`` if smaller; ``L`` consecutive
    lanes of one subgroup, so the subgroup size must be a multiple of ``L``). Group ``g`` takes keys
    ``lo + g, lo + g + WGS/L, ...``; each lane holds ``E = D/(4L)`` vec4s of the query, loads the
    same dims of a key's K and V rows (a group reads whole rows: coalesced), and the score is summed
    over the group by ``subgroupShuffleXor``. Each group keeps its own running max, sum and output
    (the online softmax of Milakov & Gimelshein 2018, ``UK`` keys a round, their K and V loads
    issued together), so the groups meet once, in workgroup memory, at the end.
    Bindings as :func:`attention1_src` (0 QKV, 1 KC, 2 VC, 3 O, 4 Params); dispatch ``(NH,)``; query
    position ``first_pos`` sees keys ``0..first_pos`` (``window`` > 0: only the last ``window``).

    ``as_fn``: no bindings and no entry point, but the constants, the workgroup arrays and
    ``fn attend(h, lid, lane, sg, sgs)``, the same body for query head ``h`` run by a workgroup of
    ``WGS`` threads, reading Q from ``Y`` and K, V from ``KC``, ``VC`` (``array<vec4<f32>>``) and
    writing ``AO``: for a kernel that declares those (:func:`matvec_src` ``att``). Call it in
    uniform control flow.
    """
    import math

    D4 = D // 4
    L = attention_groups_lanes(D)
    assert D % 4 == 0 and L & (L - 1) == 0 and WGS % L == 0 and UK >= 1
    E, NG = D4 // L, WGS // L
    lines = []
    for k in range(UK):
        j = f"key{k}"
        lines.append(f"\n      let {j} = j0 + {k * NG}u;\n      let ok{k} = {j} < T;\n      let kb{k} = min({j}, T - 1u) * KVD4 + kvo4 + c * {E}u;")
        for e in range(E):
            lines.append(f"\n      let k{k}_{e} = KC[kb{k} + {e}u];\n      let v{k}_{e} = VC[kb{k} + {e}u];")
    for k in range(UK):
        dots = " + ".join(f"dot(q{e}, k{k}_{e})" for e in range(E))
        lines.append(f"\n      var s{k} = {dots};")
        sh = L // 2
        while sh >= 1:
            lines.append(f"\n      s{k} += subgroupShuffleXor(s{k}, {sh}u);")
            sh //= 2
        lines.append(f"\n      s{k} = select(-1e30, s{k}, ok{k});")
    mx = "m"
    for k in range(UK):
        mx = f"max({mx}, s{k})"
    lines.append(f"\n      let mb = {mx};")
    lines.append("\n      let corr = exp(m - mb);")
    for k in range(UK):
        lines.append(f"\n      let p{k} = select(0.0, exp(s{k} - mb), ok{k});")
    lines.append(f"\n      l = l * corr + {' + '.join(f'p{k}' for k in range(UK))};")
    for e in range(E):
        lines.append(f"\n      a{e} = a{e} * corr + {' + '.join(f'p{k} * v{k}_{e}' for k in range(UK))};")
    lines.append("\n      m = mb;")
    qload = "".join(f"\n  let q{e} = QKV[h * D4 + c * {E}u + {e}u] * SCALE;" for e in range(E))
    accs = "".join(f"\n  var a{e} = vec4<f32>(0.0);" for e in range(E))
    store = "".join(f"\n  part[g * D4 + c * {E}u + {e}u] = a{e};" for e in range(E))
    head = _attention1_decls(NH, KV, D)
    entry = f"""@compute @workgroup_size({WGS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, {SUBGROUP_BUILTINS}) {{
  let h = wid.x;"""
    if as_fn:
        head = f"const G: u32 = {NH // KV}u;\nconst D4: u32 = {D4}u;\nconst KVD4: u32 = {KV * D4}u;\n"
        entry = "fn attend(h: u32, lid: u32, lane: u32, sg: u32, sgs: u32) {"
        qload = qload.replace("QKV[", "Y[")
    src = head + f"""const L: u32 = {L}u;
const NG: u32 = {NG}u;
const SCALE: f32 = {_f(1.0 / math.sqrt(D))};
var<workgroup> part: array<vec4<f32>, {NG * D4}>;
var<workgroup> gm: array<f32, {NG}>;
var<workgroup> gl: array<f32, {NG}>;

{entry}
  let kvo4 = (h / G) * D4;
  let T = P.first_pos + 1u;
  let f = sg * sgs + lane;
  let g = f / L;
  let c = lane % L;{qload}
  var lo = 0u;
  if ({int(window)}u > 0u && T > {int(window)}u) {{ lo = T - {int(window)}u; }}
  var m = -1e30;
  var l = 0.0;{accs}
  let rounds = (T - lo + {NG * UK - 1}u) / {NG * UK}u;  // the same for every group: uniform control flow
  for (var it = 0u; it < rounds; it++) {{
      let j0 = lo + g + it * {NG * UK}u;{"".join(lines)}
  }}{store}
  if (c == 0u) {{
    gm[g] = m;
    gl[g] = l;
  }}
  workgroupBarrier();
  if (lid < D4) {{
    var mm = -1e30;
    for (var i = 0u; i < NG; i++) {{ mm = max(mm, gm[i]); }}
    var o = vec4<f32>(0.0);
    var ll = 0.0;
    for (var i = 0u; i < NG; i++) {{
      let w = exp(gm[i] - mm);
      o += part[i * D4 + lid] * w;
      ll += gl[i] * w;
    }}
    O[h * D4 + lid] = o / ll;
  }}
}}
"""
    return src.replace("    O[h * D4 + lid] = o / ll;", "    AO[h * D4 + lid] = o / ll;") if as_fn else src


def argmax_embed_src(V: int, Hd: int, fmt: str = "f32", WGS: int = 1024) -> str:
    """Arg-max of logits ``L[0, :V]`` (lowest id on ties) into ``IDS[0]``, and that token's embedding
    row into ``X[0, :]`` (the next step's residual), in one workgroup.
    Bindings: 0 L, 1 IDS (rw u32), 2 X (rw), 3 E ``[V, Hd]`` (``fmt``). Dispatch ``(1,)``.

    With ``V`` a multiple of 4 each thread reads ``L`` as vec4s, 4 independent loads before it
    compares them (one memory round trip per 16 logits a thread instead of one per logit), in
    increasing index order so that the first of equal values wins.
    """
    assert Hd % 4 == 0
    if V % 4 == 0:
        V4 = V // 4
        cmp = "".join(f"""
      if (i + {u}u * WGS < {V4}u) {{
        let b{u} = (i + {u}u * WGS) * 4u;
        if (v{u}.x > best || idx == 0xffffffffu) {{ best = v{u}.x; idx = b{u}; }}
        if (v{u}.y > best) {{ best = v{u}.y; idx = b{u} + 1u; }}
        if (v{u}.z > best) {{ best = v{u}.z; idx = b{u} + 2u; }}
        if (v{u}.w > best) {{ best = v{u}.w; idx = b{u} + 3u; }}
      }}""" for u in range(4))
        loads = "".join(f"\n    let v{u} = L4[min(i + {u}u * WGS, {V4 - 1}u)];" for u in range(4))
        scan = f"""  for (var i = lid; i < {V4}u; i += 4u * WGS) {{{loads}{cmp}
  }}"""
        decl = "@group(0) @binding(0) var<storage, read> L4: array<vec4<f32>>;\n"
    else:
        scan = """  for (var i = lid; i < V; i += WGS) {
    let v = L[i];
    if (v > best || idx == 0xffffffffu) { best = v; idx = i; }
  }"""
        decl = "@group(0) @binding(0) var<storage, read> L: array<f32>;\n"
    return weight_decl("E", 3, fmt) + decl + f"""@group(0) @binding(1) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<vec4<f32>>;
const V: u32 = {V}u;
const H4: u32 = {Hd // 4}u;
const WGS: u32 = {WGS}u;
var<workgroup> bv: array<f32, {WGS}>;
var<workgroup> bi: array<u32, {WGS}>;
@compute @workgroup_size({WGS})
fn main(@builtin(local_invocation_index) lid: u32, {SUBGROUP_BUILTINS}) {{
  var best = -3.4e38;
  var idx = 0xffffffffu;
{scan}
  let sm = subgroupMax(best);
  let si = subgroupMin(select(0xffffffffu, idx, best == sm));
  if (lane == 0u) {{ bv[sg] = sm; bi[sg] = si; }}
  workgroupBarrier();
  var b = bv[0];
  var t = bi[0];
  for (var i = 1u; i < nsg; i++) {{
    let ov = bv[i];
    let oi = bi[i];
    if (ov > b || (ov == b && oi < t)) {{ b = ov; t = oi; }}
  }}
  if (lid == 0u) {{ IDS[0] = t; }}
  for (var k = lid; k < H4; k += WGS) {{ X[k] = ld_E(t * H4 + k); }}
}}
"""

