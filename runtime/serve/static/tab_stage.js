// A browser tab's stage: layers A-B of the model on this tab's GPU through WebGPU.
//
// The WGSL source comes from the host (runtime/serve/tab_stage.py stage_bundle, generated
// by runtime/backends/wgsl.py: the kernels of the wgpu backend, one source), and so does
// the dispatch plan; this file only creates the buffers, binds them as the wgpu backend
// does (runtime/backends/wgpu_backend.py: 0 X, 1 W, 2 Y, 3 Params, 4 norm weight, 5 W2;
// RoPE and attention 0 QKV, 1 K cache, 2 V cache, 3 RoPE table or output, 4 Params) and
// dispatches, per layer: QKV (+RMSNorm), RoPE into the cache, attention, output (+residual),
// gate/up (+RMSNorm, SwiGLU), down (+residual).
//
// forward(hidden: Float32Array [n * hidden], n, firstPos) -> Float32Array, the residual
// after the tab's layers; the KV cache keeps the positions seen, so each call continues
// where the last ended (as Stage.forward in runtime/backends/base.py).

export class TabStage {
  static async create(bundle, weights, device) {
    const s = new TabStage();
    await s.init(bundle, weights, device);
    return s;
  }

  async init(b, weights, device) {
    if (!device) {
      if (!navigator.gpu) throw new Error("no WebGPU here (navigator.gpu is missing)");
      const adapter = await navigator.gpu.requestAdapter();
      if (!adapter) throw new Error("no WebGPU adapter found");
      this.adapterInfo = adapter.info ? `${adapter.info.vendor} ${adapter.info.architecture}` : "unknown";
      device = await adapter.requestDevice({ requiredLimits: {
        maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
        maxBufferSize: adapter.limits.maxBufferSize } });
    }
    this.dev = device;
    this.b = b;
    const S = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    const T = b.max_tokens;
    const buf = (n) => device.createBuffer({ size: Math.max(16, n), usage: S });
    const upload = (offset, nbytes) => {
      const g = device.createBuffer({ size: Math.max(16, nbytes), usage: GPUBufferUsage.STORAGE, mappedAtCreation: true });
      new Uint8Array(g.getMappedRange()).set(new Uint8Array(weights, offset, nbytes));
      g.unmap();
      return g;
    };
    this.x = buf(T * b.hidden * 4);
    this.qkv = buf(T * b.qkv_width * 4);
    this.att = buf(T * b.q_dim * 4);
    this.act = buf(T * b.ffn * 4);
    this.params = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    this.rope = upload(b.rope.offset, b.rope.shape[0] * b.rope.shape[1] * 4);
    this.staging = device.createBuffer({ size: T * b.hidden * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const mk = (code) => device.createComputePipeline({ layout: "auto",
      compute: { module: device.createShaderModule({ code }), entryPoint: "main" } });
    this.p = {};
    for (const [tb, k] of Object.entries(b.kernels)) {
      this.p[tb] = { qkv: mk(k.qkv), o: mk(k.o), gu: mk(k.gu), d: mk(k.d) };
    }
    this.pRope = mk(b.rope_kernel);
    this.pAtt = mk(b.attention_kernel);
    const bind = (pipe, entries) => device.createBindGroup({ layout: pipe.getBindGroupLayout(0),
      entries: Object.entries(entries).map(([k, v]) => ({ binding: Number(k), resource: { buffer: v } })) });
    const byLayer = {};
    for (const t of b.tensors) {
      const n = t.shape.reduce((a, c) => a * c, 1) * 4;
      (byLayer[t.layer] ||= {})[t.name] = upload(t.offset, n);
    }
    this.layers = [];
    for (let i = b.start; i < b.end; i++) {
      const w = byLayer[i];
      const kc = buf(b.max_ctx * b.kv_dim * 4), vc = buf(b.max_ctx * b.kv_dim * 4);
      const L = { tb: {} };
      for (const tb of Object.keys(b.kernels)) {
        const p = this.p[tb];
        L.tb[tb] = {
          qkv: bind(p.qkv, { 0: this.x, 1: w.wqkv, 2: this.qkv, 3: this.params, 4: w.ln1 }),
          o: bind(p.o, { 0: this.att, 1: w.wo, 2: this.x, 3: this.params }),
          gu: bind(p.gu, { 0: this.x, 1: w.wg, 2: this.act, 3: this.params, 4: w.ln2, 5: w.wu }),
          d: bind(p.d, { 0: this.act, 1: w.wd, 2: this.x, 3: this.params }),
        };
      }
      L.rope = bind(this.pRope, { 0: this.qkv, 1: kc, 2: vc, 3: this.rope, 4: this.params });
      L.att = bind(this.pAtt, { 0: this.qkv, 1: kc, 2: vc, 3: this.att, 4: this.params });
      this.layers.push(L);
    }
    this.position = 0;
  }

  async forward(hidden, n, firstPos) {
    const b = this.b, out = new Float32Array(n * b.hidden);
    if (firstPos + n > b.max_ctx) throw new Error(`positions up to ${firstPos + n} exceed the tab's cache of ${b.max_ctx}`);
    for (let i = 0; i < n; i += b.max_tokens) {
      const m = Math.min(b.max_tokens, n - i);
      const tb = m === 1 ? "1" : "8", r = b.variants[tb], ty = Math.ceil(m / Number(tb));
      const q = this.dev.queue;
      q.writeBuffer(this.x, 0, hidden, i * b.hidden, m * b.hidden);
      q.writeBuffer(this.params, 0, new Uint32Array([m, firstPos + i, 0, 0]));
      const enc = this.dev.createCommandEncoder();
      const cp = enc.beginComputePass();
      const run = (pipe, group, gx, gy) => { cp.setPipeline(pipe); cp.setBindGroup(0, group); cp.dispatchWorkgroups(gx, gy); };
      const p = this.p[tb];
      for (const L of this.layers) {
        const g = L.tb[tb];
        run(p.qkv, g.qkv, b.qkv_width / r, ty);
        run(this.pRope, L.rope, b.n_heads + 2 * b.n_kv_heads, m);
        run(this.pAtt, L.att, b.n_heads, m);
        run(p.o, g.o, b.hidden / r, ty);
        run(p.gu, g.gu, b.ffn / r, ty);
        run(p.d, g.d, b.hidden / r, ty);
      }
      cp.end();
      enc.copyBufferToBuffer(this.x, 0, this.staging, 0, m * b.hidden * 4);
      q.submit([enc.finish()]);
      await this.staging.mapAsync(GPUMapMode.READ, 0, m * b.hidden * 4);
      out.set(new Float32Array(this.staging.getMappedRange(0, m * b.hidden * 4)), i * b.hidden);
      this.staging.unmap();
    }
    this.position = firstPos + n;
    return out;
  }
}
