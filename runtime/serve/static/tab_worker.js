// A browser tab that joins a room as a worker and holds layers A-B (share.html?layers=A-B,
// 1-based inclusive): the room's wire, spoken from JavaScript.
//
// What it speaks, as the Python devices do (runtime/transport/, runtime/control.py,
// planner/frames.py, planner/scheduler/worker.py):
// * signalling: the relay's websocket (hello, peers, signal with an SDP offer/answer; the
//   smaller device id offers), then one RTCPeerConnection per peer with three negotiated,
//   ordered data channels, ids 0 residual, 1 reply, 2 weights;
// * framing (runtime/transport/framing.py): 0x00 + a whole message, or pieces
//   0x01, msg_id u32, index u32, total u32 + bytes, reassembled per peer and channel;
// * control messages (JSON on the reply channel): hello (its layers, 0-based half-open),
//   plan, heartbeat every 0.25 s (with the times of NTP's exchange, planner/hops.py),
//   stamps to the host with each heartbeat (when it had and sent each lap's frame, on
//   its own clock: the host's hop time per link), progress while it loads, fault, bye,
//   abort; others are logged and ignored;
// * residual frames (planner/frames.py: "SRFM", version 1, 32-byte header, float32
//   payload [tokens, hidden]); a frame runs the tab's layers (TabStage, static/tab_stage.js)
//   and goes on to the next stage, or back to the model host as a RESULT when it returns.
//
// Weights: over the tab's "weights" data channel from the model host, in the protocol of
// runtime/weights_share (its module doc is where that protocol is written down; this file
// speaks it: 'Q' requests, 'R' replies with a JSON header, op manifest then tensor slices of
// at most 1 MiB in the packed form of runtime/weights_codec.py, unpacked here). The
// manifest's sha256 must be the one the host's bundle gives (/tab/bundle.json, not the
// channel), and each tensor's bytes, unpacked, must match the manifest's sha256 (WebCrypto)
// before any byte reaches the GPU. The RoPE table comes in the bundle.
//
// Host gone (runtime/node.py's await_host): when nothing has come from the model host for
// HOST_SILENT_S, or its connection failed, the tab says "Host reconnecting", keeps its
// layers on the GPU and waits the room's host_wait_s (a minute) for it: the live
// connection stays (a host heard on it again is back), and the tab joins the relay again
// for the offer of the host's new process, then says hello again and takes its plan
// (same range: the layers kept, the KV cache emptied). When the wait passes: "Room over".
//
// Not spoken here: rooms with a key (relay nonce, hello proof), a re-deal (Replan), KV
// cache slots other than 0 (one question in flight), float16 residuals. Each is refused
// with a line in the log and on the page, never a crash.

import { TabStage } from "/static/tab_stage.js";

export const CHANNELS = ["residual", "reply", "weights"];
const PIECE_HEADER = 13;
const MAX_IN = 64 * 1024 * 1024;  // cap on one reassembled message, bytes (framing.py's default)
const HEARTBEAT_MS = 250;
const KIND = { PREFILL: 1, DECODE: 2, RESULT: 3, RETURN: 4, ROLLBACK: 5, WAKE: 6 };
const HEADER = 32;
const MAX_STAMPS = 128;  // per Stamps message (runtime/control.py)
const RATE_WINDOW_S = 10;  // a device's tok/s, as runtime/serve/page.py counts it
// once its layers are loaded, the tab takes the model host as gone after this long without a
// wire message from it (it sends a heartbeat every 0.25 s); a host heard again on the same
// connection is back
const HOST_SILENT_S = 3;
const WEIGHTS_WAIT_MS = 30000;  // for each weights reply (peers.py fetch_range's timeout_s)
const HOST_WAIT_S = 60;  // a room that does not say its host_wait_s (runtime/control.py's HOST_WAIT_S)
const clockS = () => performance.now() / 1000;  // this tab's monotonic stamp clock, seconds

// -- framing -----------------------------------------------------------------------------

// The wire messages carrying `data` (Uint8Array): one whole message when it fits in
// `maxWire` bytes, else pieces of at most `maxWire` bytes.
export function encodeMessage(msgId, data, maxWire) {
  const n = data.length;
  if (maxWire <= PIECE_HEADER) throw new Error(`max wire bytes ${maxWire} leaves no room for data`);
  if (n + 1 <= maxWire) {
    const w = new Uint8Array(n + 1);
    w.set(data, 1);
    return [w];
  }
  const step = maxWire - PIECE_HEADER, out = [];
  for (let i = 0, off = 0; off < n; i++, off += step) {
    const body = data.subarray(off, Math.min(n, off + step));
    const w = new Uint8Array(PIECE_HEADER + body.length);
    const dv = new DataView(w.buffer);
    dv.setUint8(0, 1);
    dv.setUint32(1, msgId >>> 0, true);
    dv.setUint32(5, i, true);
    dv.setUint32(9, n, true);
    w.set(body, PIECE_HEADER);
    out.push(w);
  }
  return out;
}

// In-order reassembly of one (peer, channel) stream; feed(wire) -> whole message or null;
// throws an Error (the partial message discarded) for a malformed piece.
export class Reassembler {
  constructor(maxBytes = MAX_IN) { this.max = maxBytes; this.skip = null; this.dropped = 0; this.reset(); }
  reset() { this.mid = null; this.next = 0; this.total = 0; this.got = 0; this.parts = []; }
  fail(why) { this.dropped++; this.reset(); return new Error(why); }
  feed(wire) {
    if (!wire.length) throw this.fail("empty wire message");
    const kind = wire[0];
    if (kind === 0) {
      if (this.mid !== null) throw this.fail(`whole message while message ${this.mid} was ${this.got}/${this.total} bytes in`);
      if (wire.length - 1 > this.max) throw this.fail(`message of ${wire.length - 1} bytes over the ${this.max}-byte cap`);
      return wire.slice(1);
    }
    if (kind !== 1) throw this.fail(`unknown wire kind ${kind}`);
    if (wire.length <= PIECE_HEADER) throw this.fail(`piece of ${wire.length} bytes has no data after its header`);
    const dv = new DataView(wire.buffer, wire.byteOffset, wire.byteLength);
    const mid = dv.getUint32(1, true), index = dv.getUint32(5, true), total = dv.getUint32(9, true);
    const body = wire.subarray(PIECE_HEADER);
    if (this.skip !== null) {
      if (mid === this.skip && index > 0) { this.dropped++; return null; }
      this.skip = null;
    }
    if (index === 0) {
      if (this.mid !== null) throw this.fail(`message ${mid} began while message ${this.mid} was ${this.got}/${this.total} bytes in`);
      if (total > this.max) { this.skip = mid; throw this.fail(`message of ${total} bytes over the ${this.max}-byte cap`); }
      this.mid = mid; this.total = total;
    } else if (this.mid !== mid || index !== this.next) {
      throw this.fail(`piece ${index} of message ${mid}, expected piece ${this.next} of message ${this.mid}`);
    } else if (total !== this.total) {
      throw this.fail(`piece ${index} of message ${mid} says ${total} bytes, piece 0 said ${this.total}`);
    }
    if (this.got + body.length > this.total) throw this.fail(`message ${mid} has more bytes than the ${this.total} announced`);
    this.parts.push(body.slice());
    this.got += body.length;
    this.next = index + 1;
    if (this.got !== this.total) return null;
    const out = new Uint8Array(this.total);
    let o = 0;
    for (const p of this.parts) { out.set(p, o); o += p.length; }
    this.reset();
    return out;
  }
}

// -- residual frames (planner/frames.py) ----------------------------------------------

// {kind, dtype, returns, slot, question, lap, first, tokens, hidden, x: Float32Array};
// throws an Error naming what is wrong, as decode_header does.
export function decodeFrame(u8) {
  if (u8.length < HEADER) throw new Error(`frame of ${u8.length} bytes is shorter than the ${HEADER}-byte header`);
  const dv = new DataView(u8.buffer, u8.byteOffset, u8.byteLength);
  if (u8[0] !== 0x53 || u8[1] !== 0x52 || u8[2] !== 0x46 || u8[3] !== 0x4d) throw new Error("bad magic");
  if (u8[4] !== 1) throw new Error(`frame version ${u8[4]}, this side speaks 1`);
  const kind = u8[5], dtype = u8[6], flags = u8[7];
  if (kind < 1 || kind > 6) throw new Error(`unknown frame kind ${kind}`);
  if (dtype > 1) throw new Error(`unknown dtype code ${dtype}`);
  const h = { kind, dtype, returns: (flags & 1) === 1, slot: (flags >> 1) & 15, question: dv.getUint32(8, true),
              lap: dv.getUint32(12, true), first: dv.getUint32(16, true), tokens: dv.getUint32(20, true),
              hidden: dv.getUint32(24, true) };
  const payload = dv.getUint32(28, true);
  if (payload !== h.tokens * h.hidden * (dtype === 0 ? 4 : 2)) throw new Error(`payload ${payload} bytes disagrees with ${h.tokens} x ${h.hidden}`);
  if (u8.length !== HEADER + payload) throw new Error(`frame is ${u8.length} bytes, header says ${HEADER + payload}`);
  if (flags >> 5) throw new Error(`unknown flags ${flags}`);
  if (dtype === 0) h.x = new Float32Array(u8.slice(HEADER).buffer);
  return h;
}

// Header + float32 payload `x` (none for control frames), kind `kind`.
export function encodeFrame(h, kind, x) {
  const n = x ? x.length * 4 : 0;
  const u8 = new Uint8Array(HEADER + n), dv = new DataView(u8.buffer);
  u8.set([0x53, 0x52, 0x46, 0x4d, 1, kind, 0, (h.returns ? 1 : 0) | (h.slot << 1)]);
  for (const [o, v] of [[8, h.question], [12, h.lap], [16, h.first], [20, x ? h.tokens : 0], [24, h.hidden], [28, n]]) {
    dv.setUint32(o, v, true);
  }
  if (x) u8.set(new Uint8Array(x.buffer, x.byteOffset, n), HEADER);
  return u8;
}

// -- weights, checked against the manifest ----------------------------------------------

function hex(buf) { return Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, "0")).join(""); }

// JSON as Python's json.dumps(sort_keys=True, separators=(",", ":")) writes it (ASCII input).
function canonical(v) {
  if (Array.isArray(v)) return "[" + v.map(canonical).join(",") + "]";
  if (v && typeof v === "object") return "{" + Object.keys(v).sort().map((k) => JSON.stringify(k) + ":" + canonical(v[k])).join(",") + "}";
  return JSON.stringify(v);
}

async function tabGet(what, layers, device) {
  const r = await fetch(`/tab/${what}?layers=${encodeURIComponent(layers)}&device=${encodeURIComponent(device)}`);
  if (!r.ok) throw new Error(`${what}: HTTP ${r.status}: ${(await r.json().catch(() => ({}))).error || r.statusText}`);
  return r;
}

// The weights channel's messages (runtime/weights_share/wire.py): kind u8 ('Q' request,
// 'R' reply) | header_len u32 LE | header JSON | payload.
export const WEIGHTS_Q = 0x51, WEIGHTS_R = 0x52;
export const PART_BYTES = 1 << 20;  // a slice asked at a time (peers.py PART_BYTES)
const WINDOW = 4;  // tensors in flight at once (peers.py WINDOW)
export function encodeWeights(kind, header, payload = new Uint8Array(0)) {
  const h = new TextEncoder().encode(JSON.stringify(header));
  const u8 = new Uint8Array(5 + h.length + payload.length);
  u8[0] = kind;
  new DataView(u8.buffer).setUint32(1, h.length, true);
  u8.set(h, 5);
  u8.set(payload, 5 + h.length);
  return u8;
}
// -> {kind, header, payload}; throws an Error when malformed
export function decodeWeights(u8) {
  if (u8.length < 5) throw new Error("weights message shorter than its header");
  const n = new DataView(u8.buffer, u8.byteOffset, u8.byteLength).getUint32(1, true);
  if ((u8[0] !== WEIGHTS_Q && u8[0] !== WEIGHTS_R) || 5 + n > u8.length) throw new Error("bad kind or header length");
  let header;
  try { header = JSON.parse(new TextDecoder().decode(u8.subarray(5, 5 + n))); } catch { throw new Error("header is not JSON"); }
  if (!header || typeof header !== "object" || Array.isArray(header)) throw new Error("header is not a JSON object");
  return { kind: u8[0], header, payload: u8.subarray(5 + n) };
}

// The float32 bytes (Uint8Array, 4 * nValues) of a tensor in runtime/weights_codec.py's
// packed form: magic "SRA4" | u32 version 1 | u64 n_values | u64 n_blocks | u64 n_raw |
// raw-block bitmap | d f32[packed] | m f32[packed] | codes, 2 a byte, low nibble first |
// raw blocks f32[n_raw * 32] | tail f32. A packed value is float32(d * q) + m rounded to
// float32, as numpy computes it (each step rounded once: a double holds d * q exactly and
// the sum's rounding to float32 through a double is the float32 sum's). Throws an Error
// when malformed; the caller checks the result's sha256.
export function unpackWeights(u8, nValues) {
  const B = 32, HEAD = 32;
  if (u8.length < HEAD) throw new Error("shorter than a packed header");
  const dv = new DataView(u8.buffer, u8.byteOffset, u8.byteLength);
  if (u8[0] !== 0x53 || u8[1] !== 0x52 || u8[2] !== 0x41 || u8[3] !== 0x34 || dv.getUint32(4, true) !== 1) {
    throw new Error("not a packed tensor (magic or version)");
  }
  const n = Number(dv.getBigUint64(8, true)), nb = Number(dv.getBigUint64(16, true)), nRaw = Number(dv.getBigUint64(24, true));
  if (n !== nValues || nb !== Math.floor(n / B) || nRaw > nb) throw new Error(`header says ${n} values in ${nb} blocks (${nRaw} raw); expected ${nValues}`);
  const np = nb - nRaw, bitmapLen = Math.ceil(nb / 8);
  const want = HEAD + bitmapLen + np * (8 + B / 2) + nRaw * B * 4 + (n - nb * B) * 4;
  if (u8.length !== want) throw new Error(`${u8.length} bytes where the header implies ${want}`);
  const out = new Float32Array(n), outB = new Uint8Array(out.buffer);
  let oD = HEAD + bitmapLen, oM = oD + 4 * np, oQ = oM + 4 * np, oR = oQ + np * B / 2, raws = 0;
  for (let i = 0; i < nb; i++) {
    const base = i * B;
    if ((u8[HEAD + (i >> 3)] >> (i & 7)) & 1) {
      outB.set(u8.subarray(oR, oR + B * 4), base * 4);
      oR += B * 4;
      raws++;
      continue;
    }
    const d = dv.getFloat32(oD, true), m = dv.getFloat32(oM, true);
    oD += 4; oM += 4;
    for (let j = 0; j < B / 2; j++) {
      const c = u8[oQ + j];
      out[base + 2 * j] = Math.fround(d * (c & 15)) + m;
      out[base + 2 * j + 1] = Math.fround(d * (c >> 4)) + m;
    }
    oQ += B / 2;
  }
  if (raws !== nRaw) throw new Error("the raw-block bitmap does not match its count");
  outB.set(u8.subarray(oR, oR + (n - nb * B) * 4), nb * B * 4);
  return outB;
}

// The weights of `bundle`'s range over the weights channel, in the buffer layout the bundle
// gives (its tensors, then the RoPE table it carries): the manifest asked for with
// ask({op: "manifest", ...}) -> [header, payload], its sha256 checked against
// bundle.manifest_sha256, then each tensor in slices, packed where the host has that form,
// its sha256 checked. progress(fraction of the tensors' stored bytes). Throws an Error
// naming what failed; nothing is returned unchecked.
export async function fetchRange(ask, bundle, progress = () => {}) {
  if (!crypto.subtle) throw new Error("no WebCrypto here (a page on http:// other than 127.0.0.1 or localhost is not a secure context)");
  const want = bundle.manifest_sha256;
  if (typeof want !== "string" || !/^[0-9a-f]{64}$/.test(want)) throw new Error("the bundle gives no manifest sha256 to check the weights against");
  const [, mbytes] = await ask({ op: "manifest", start: bundle.start, end: bundle.end, embedding: false, head: false });
  let manifest;
  try { manifest = JSON.parse(new TextDecoder().decode(mbytes)); } catch { throw new Error("the weights manifest from the host is not JSON"); }
  if (!manifest || typeof manifest.tensors !== "object") throw new Error("the weights manifest from the host is malformed");
  const body = Object.fromEntries(Object.entries(manifest).filter(([k]) => k !== "sha256"));
  const msha = hex(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(canonical(body))));
  if (msha !== manifest.sha256) throw new Error("the weights manifest does not match its own sha256");
  if (msha !== want) throw new Error(`weights manifest sha256 ${msha.slice(0, 12)}... is not the ${want.slice(0, 12)}... the host's bundle gives: these weights are not loaded`);
  if (manifest.start !== bundle.start || manifest.end !== bundle.end) throw new Error("the manifest is of another range");
  const buf = new Uint8Array(bundle.bytes), jobs = [];
  for (const t of bundle.tensors) {
    let off = t.offset;
    for (const name of t.parts) {
      const m = manifest.tensors[name];
      if (!m || m.dtype !== "F32" || !Number.isInteger(m.nbytes)) throw new Error(`${name}: not a float32 tensor of the manifest`);
      jobs.push([name, m, off]);
      off += m.nbytes;
    }
    if (off !== t.offset + t.shape.reduce((a, c) => a * c, 1) * 4) throw new Error(`${t.name} of layer ${t.layer}: parts do not fill it`);
  }
  const rope = Uint8Array.from(atob(bundle.rope.b64), (c) => c.charCodeAt(0));
  if (rope.length !== bundle.rope.shape[0] * bundle.rope.shape[1] * 4) throw new Error("the bundle's RoPE table has the wrong size");
  buf.set(rope, bundle.rope.offset);
  const total = jobs.reduce((n, [, m]) => n + m.nbytes, 0);
  let got = 0;
  const one = async ([name, m, off]) => {
    const ask1 = async (offset, length, form) => {
      const req = { op: "tensor", name, offset, length };
      const [h, p] = await ask(form === "raw" ? req : { ...req, form: "packed" });
      if (h.name !== name || h.offset !== offset || (form && h.form !== form)) throw new Error(`${name}: wrong slice in the host's reply`);
      return [h, p];
    };
    const [h, p0] = await ask1(0, Math.min(PART_BYTES, m.nbytes), null);
    const form = h.form, size = h.total;
    if (!["raw", "packed"].includes(form) || !Number.isInteger(size) || size <= 0 || size > m.nbytes
        || (form === "raw" && size !== m.nbytes) || p0.length !== Math.min(PART_BYTES, size)) {
      throw new Error(`${name}: wrong slice in the host's reply`);
    }
    const wire = new Uint8Array(size);
    const take = (p, offset) => {
      if (offset + p.length > size) throw new Error(`${name}: more bytes than the host announced`);
      wire.set(p, offset);
      got += p.length * m.nbytes / size;  // progress in stored bytes
      progress(got / total);
    };
    take(p0, 0);
    for (let o = PART_BYTES; o < size; o += PART_BYTES) {
      const [, p] = await ask1(o, Math.min(PART_BYTES, size - o), form);
      if (p.length !== Math.min(PART_BYTES, size - o)) throw new Error(`${name}: wrong slice in the host's reply`);
      take(p, o);
    }
    let raw = wire;
    if (form === "packed") {
      try { raw = unpackWeights(wire, m.nbytes / 4); } catch (e) { throw new Error(`${name}: malformed packed form: ${e.message}`); }
    }
    if (hex(await crypto.subtle.digest("SHA-256", raw)) !== m.sha256) throw new Error(`${name}: its bytes do not match the manifest's sha256`);
    buf.set(raw, off);
  };
  const queue = jobs.slice();
  let failed = false;
  await Promise.all(Array.from({ length: WINDOW }, async () => {
    try {
      while (queue.length && !failed) await one(queue.shift());
    } catch (e) {
      failed = true;  // the others ask nothing more
      throw e;
    }
  }));
  return buf.buffer;
}

// -- the room --------------------------------------------------------------------------

function waitFor(target, event, test, ms, what) {
  return new Promise((ok, no) => {
    if (test()) { ok(); return; }
    const timer = setTimeout(() => no(new Error(`${what}: nothing within ${ms / 1000} s`)), ms);
    target.addEventListener(event, () => { if (test()) { clearTimeout(timer); ok(); } });
  });
}

function remoteMaxMessage(sdp) {  // RFC 8841 section 6, as webrtc.py's remote_max_message_size
  const m = /^a=max-message-size:(\d+)\s*$/m.exec(sdp);
  if (!m) return 65536;
  const v = Number(m[1]);
  return v > 0 ? v : 262144;
}

export class TabWorker {
  // opts: {relay, room, device, peers, host, layers ("A-B"), iceServers, relayOnly, show(status, detail)}
  constructor(opts) {
    this.o = opts;
    this.show = opts.show || (() => {});
    this.links = {};
    this.reasm = {};
    this.msgId = 0;
    this.log = [];
    this.status = "Standing by";
    this.error = null;
    this.stats = { frames_in: 0, frames_out: 0, rejected: 0, tokens: 0, passes: 0 };
    this.ms = [];  // [tokens, ms] per stage run, the tab's own clock
    this.queue = Promise.resolve();
    this.stage = null;
    this.plan = null;
    this.slotQuestion = new Map();
    this.slotKv = new Map();
    this.heardMs = {};
    this.waiting = [];  // frames that came before the layers were loaded
    this.beatIn = {};  // peer -> [its last heartbeat's sent_s, heard at]
    this.stampsIn = []; this.stampsOut = [];  // [lap, peer, t] for the host's hop times
    this.passTimes = [];  // [t, positions] of the latest passes (tok/s)
    this.told = -1;  // the last percent told the host
    this.weightsId = 0;
    this.weightsWaiting = new Map();  // request id -> (error, [header, payload]) => void
  }

  // this tab's tok/s: the positions of its passes of the last RATE_WINDOW_S, the first left out, over their span
  tokensPerS() {
    const now = clockS(), w = this.passTimes.filter(([t]) => now - t <= RATE_WINDOW_S);
    if (w.length < 2 || w[w.length - 1][0] <= w[0][0]) return null;
    return w.slice(1).reduce((n, [, k]) => n + k, 0) / (w[w.length - 1][0] - w[0][0]);
  }

  progress(percent) {
    if (percent <= this.told) return;
    this.told = percent;
    if (this.links[this.o.host]) this.control(this.o.host, { type: "progress", percent });
  }

  stamp(list, lap, peer) { list.push([lap, peer, clockS()]); if (list.length > MAX_STAMPS) list.shift(); }

  heartbeats() {
    const h = this.o.host, heard = this.heardMs[h];
    if (this.loaded && !this.over && !this.away && heard !== undefined && performance.now() - heard > HOST_SILENT_S * 1000) {
      this.lost(h, `nothing from it for ${HOST_SILENT_S} s`);
    }
    for (const p of Object.keys(this.links)) {
      const now = clockS(), last = this.beatIn[p];
      this.control(p, last ? { type: "heartbeat", sent_s: now, echo_s: last[0], held_s: now - last[1] }
                           : { type: "heartbeat", sent_s: now });
      if (p === this.o.host && (this.stampsIn.length || this.stampsOut.length)) {
        this.control(p, { type: "stamps", arrived: this.stampsIn.splice(0), sent: this.stampsOut.splice(0) });
      }
    }
  }

  note(line) { this.log.push(line); if (this.log.length > 200) this.log.shift(); console.log("[tab] " + line); }
  say(status, detail) { this.status = status; this.show(status, detail || ""); }

  async start() {
    const o = this.o;
    if (!/^[A-Za-z0-9_.-]{1,64}$/.test(o.device)) throw new Error(`device id ${JSON.stringify(o.device)}: 1-64 letters, digits, . _ -`);
    this.say("Standing by", `joining room ${o.room} as ${o.device}`);
    const bundle = await (await tabGet("bundle.json", o.layers, o.device)).json();  // the host checks the range
    this.range = [bundle.start, bundle.end];
    this.shown = `${bundle.start + 1}-${bundle.end}`;
    await this.connect();
    this.beat = setInterval(() => this.heartbeats(), HEARTBEAT_MS);
    this.broadcast({ type: "hello", device: o.device, host: false, layers: this.range, lends: 0 });
    const weights = await this.loadWeights(bundle);
    this.stage = await TabStage.create(bundle, weights);
    this.progress(100);
    this.bundle = bundle;
    this.mb = weights.byteLength / 1e6;
    this.note(`layers ${this.shown} loaded (${this.mb.toFixed(0)} MB, adapter ${this.stage.adapterInfo})`);
    this.loaded = true;
    this.serving();
    for (const [src, u8] of this.waiting.splice(0)) this.onResidual(src, u8);
  }

  // The weights of the bundle's range from the model host (fetchRange over the weights
  // channel), "Loading N%" on the screen and to the host as they arrive (99% at most: 100%
  // once the GPU holds them). Throws fetchRange's Error when a check fails.
  async loadWeights(bundle) {
    const shown = `${bundle.start + 1}-${bundle.end}`;
    let last = -1;
    this.say("Loading 0%", `layers ${shown} from ${this.o.host}`);
    this.progress(0);
    return fetchRange((req) => this.askWeights(req), bundle, (f) => {
      const percent = Math.min(99, Math.floor(f * 100));
      if (percent === last) return;
      last = percent;
      this.say(`Loading ${percent}%`, `layers ${shown} from ${this.o.host}`);
      this.progress(percent);
    });
  }

  serving() {
    if (this.loaded && this.plan) this.say(`Serving · Layers ${this.shown} · ${this.mb.toFixed(0)} MB · ${this.o.model || "the room's model"}`);
  }

  async connect() {
    const o = this.o, sig = await this.signalling();
    try {
      await Promise.all(o.peers.map((p) => this.link(p, sig, 60000)));
    } finally {
      sig.ws.close();  // the relay saw the SDP exchange and nothing after it
    }
    this.note(`connected to ${o.peers.join(", ")}`);
  }

  // The relay's websocket, this tab said hello on it: {ws, bus, present, inbox}.
  async signalling() {
    const o = this.o;
    const ws = new WebSocket(`${o.relay}/room/${o.room}`);
    ws.binaryType = "arraybuffer";
    const present = new Set(), inbox = {};
    for (const p of o.peers) inbox[p] = [];
    const bus = new EventTarget();
    ws.onmessage = (ev) => {
      let m;
      try { m = JSON.parse(ev.data); } catch { return; }
      if (m.type === "peers" && Array.isArray(m.devices)) m.devices.forEach((d) => present.add(d));
      else if (m.type === "signal" && inbox[m.from] && m.data && typeof m.data.sdp === "string") inbox[m.from].push(m.data);
      bus.dispatchEvent(new Event("m"));
    };
    ws.onclose = () => bus.dispatchEvent(new Event("m"));
    await waitFor(ws, "open", () => ws.readyState === 1, 10000, "the relay");
    ws.send(JSON.stringify({ type: "hello", device: o.device }));
    return { ws, bus, present, inbox };
  }

  // A new connection to `peer` over the relay's `sig`, waiting at most `ms` for each step;
  // it replaces the peer's link (and its reassembly) only once its channels are open.
  async link(peer, { ws, bus, present, inbox }, ms) {
    const o = this.o;
    const pc = new RTCPeerConnection({ iceServers: o.iceServers || [], iceTransportPolicy: o.relayOnly ? "relay" : "all" });
    const lk = { pc, chans: null, maxWire: 65536 };
    lk.chans = CHANNELS.map((name, id) => {
      const ch = pc.createDataChannel(name, { ordered: true, negotiated: true, id });
      ch.binaryType = "arraybuffer";
      ch.onmessage = (ev) => { if (this.links[peer] === lk) this.onWire(peer, name, ev.data); };
      return ch;
    });
    const chans = lk.chans;
    pc.onconnectionstatechange = () => {
      if (["failed", "closed"].includes(pc.connectionState) && !this.over && this.links[peer] === lk) {
        this.lost(peer, `connection ${pc.connectionState}`);
      }
    };
    const gathered = () => waitFor(pc, "icegatheringstatechange", () => pc.iceGatheringState === "complete", 10000, "gathering candidates");
    const next = async (kind) => {
      await waitFor(bus, "m", () => inbox[peer].length > 0 || ws.readyState > 1, ms, `the ${kind} from ${peer}`);
      const d = inbox[peer].shift();
      if (!d || d.type !== kind) throw new Error(`expected an SDP ${kind} from ${peer}`);
      return d;
    };
    const send = () => ws.send(JSON.stringify({ type: "signal", to: peer, data: { type: pc.localDescription.type, sdp: pc.localDescription.sdp } }));
    try {
      if (o.device < peer) {  // the smaller id offers, as connect_room
        await waitFor(bus, "m", () => present.has(peer), ms, `${peer} joining the relay`);
        await pc.setLocalDescription(await pc.createOffer());
        await gathered();
        send();
        await pc.setRemoteDescription(await next("answer"));
      } else {
        await pc.setRemoteDescription(await next("offer"));
        await pc.setLocalDescription(await pc.createAnswer());
        await gathered();
        send();
      }
      lk.maxWire = remoteMaxMessage(pc.remoteDescription.sdp);
      await Promise.all(chans.map((ch) => waitFor(ch, "open", () => ch.readyState === "open", 30000, `the ${ch.label} channel to ${peer}`)));
    } catch (e) {
      pc.close();
      throw e;
    }
    const old = this.links[peer];
    for (const name of CHANNELS) this.reasm[peer + "\0" + name] = new Reassembler();
    this.links[peer] = lk;  // before the next task: no message of the new channels is missed
    if (old) old.pc.close();
  }

  // -- out
  sendRaw(peer, channel, wire) {  // one wire message as is (tests: what a bad peer sends)
    const lk = this.links[peer];
    const ch = lk && lk.chans[CHANNELS.indexOf(channel)];
    if (ch && ch.readyState === "open") ch.send(wire);
  }
  send(peer, channel, data) {
    const lk = this.links[peer];
    if (!lk) return;
    for (const w of encodeMessage(++this.msgId, data, channel === "residual" ? lk.maxWire : Math.min(lk.maxWire, 16384))) {
      this.sendRaw(peer, channel, w);
    }
  }
  control(peer, msg) { this.send(peer, "reply", new TextEncoder().encode(JSON.stringify(msg))); }
  broadcast(msg) { for (const p of Object.keys(this.links)) this.control(p, msg); }

  // -- in
  onWire(src, channel, data) {
    if (this.over) return;
    this.heardMs[src] = performance.now();
    if (this.away && src === this.o.host && !this.relinked) this.back(`${src} was heard again on the same connection`);
    if (!(data instanceof ArrayBuffer)) { this.stats.rejected++; this.note(`a text message from ${src} on ${channel} dropped (binary only)`); return; }
    let msg;
    try {
      msg = this.reasm[src + "\0" + channel].feed(new Uint8Array(data));
    } catch (e) {
      this.stats.rejected++;
      this.note(`a piece from ${src} on ${channel} dropped: ${e.message}`);
      return;
    }
    if (msg === null) return;
    if (channel === "reply") this.onControl(src, msg);
    else if (channel === "weights") this.onWeights(src, msg);
    else if (channel === "residual") {
      if (!this.loaded) this.waiting.push([src, msg]); else this.onResidual(src, msg);
    }
  }

  // One weights request to the model host -> [reply header, payload]; rejects with the
  // host's reason when it refuses, or when no reply comes within `ms`.
  askWeights(req, ms = WEIGHTS_WAIT_MS) {
    const h = this.o.host, id = ++this.weightsId;
    return new Promise((ok, no) => {
      const timer = setTimeout(() => { this.weightsWaiting.delete(id); no(new Error(`${h} did not answer a weights ${req.op} request within ${ms / 1000} s`)); }, ms);
      this.weightsWaiting.set(id, (err, r) => { clearTimeout(timer); if (err) no(err); else ok(r); });
      this.send(h, "weights", encodeWeights(WEIGHTS_Q, { ...req, id }));
    });
  }

  onWeights(src, u8) {
    let m;
    try { m = decodeWeights(u8); } catch (e) { this.note(`a weights message from ${src} dropped: ${e.message}`); return; }
    if (m.kind !== WEIGHTS_R) { this.note(`a weights request from ${src} ignored: a tab serves no weights`); return; }
    const done = src === this.o.host ? this.weightsWaiting.get(m.header.id) : undefined;
    if (!done) { this.note(`a weights reply from ${src} ignored: no request of id ${String(m.header.id).slice(0, 20)} waits`); return; }
    this.weightsWaiting.delete(m.header.id);
    if (m.header.ok === true) done(null, [m.header, m.payload]);
    else done(new Error(`${src} refused a weights request: ${String(m.header.error).slice(0, 300)}`));
  }

  onControl(src, bytes) {
    let m;
    try { m = JSON.parse(new TextDecoder().decode(bytes)); } catch { this.note(`control message from ${src} ignored: not JSON`); return; }
    if (!m || typeof m.type !== "string") { this.note(`control message from ${src} ignored: no type`); return; }
    if (m.type === "heartbeat") {  // its times: one leg of NTP's exchange (the host's clock offsets)
      if (Number.isFinite(m.sent_s) && m.sent_s >= 0) this.beatIn[src] = [m.sent_s, clockS()];
      return;
    }
    if (m.type === "hello") return;
    if (src !== this.o.host) { this.note(`${m.type} from ${src} ignored: only the model host's count`); return; }
    if (m.type === "plan") this.onPlan(m);
    else if (m.type === "bye") this.end("Room over", "the host is done");
    else if (m.type === "abort") this.end("Room over", `the room cannot run: ${String(m.reason).slice(0, 300)}`);
    else this.note(`${m.type} from ${src} ignored: a tab does not take it`);
  }

  onPlan(p) {
    const stages = Array.isArray(p.stages) ? p.stages : [];
    const i = stages.findIndex((s) => Array.isArray(s) && s[0] === this.o.device);
    const sch = p.scheduler || {};
    let why = null;
    if (i < 0) why = "the plan deals this tab no layers";
    else if (stages[i][1] !== this.range[0] || stages[i][2] !== this.range[1]) why = `the plan deals this tab layers ${stages[i][1] + 1}-${stages[i][2]}, it holds ${this.shown}`;
    else if ((sch.dtype || 0) !== 0) why = "the room sends float16 residuals; a tab takes float32 only";
    else if ((sch.questions_in_flight || 1) !== 1) why = "the room answers several questions at once; a tab keeps one KV cache";
    if (why) { this.end("Not holding layers", why); return; }
    this.plan = { host: p.host, next: i + 1 < stages.length ? stages[i + 1][0] : null,
                  prev: i > 0 ? stages[i - 1][0] : p.host, hidden: sch.hidden, context: sch.context || null,
                  viaStages: sch.return_path === "via_stages" };
    this.note(`plan: ${stages.map((s) => `${s[0]} ${s[1] + 1}-${s[2]}`).join(", ")}`);
    this.serving();
  }

  reject(src, why) { this.stats.rejected++; this.note(`frame from ${src} rejected: ${why}`); }

  onResidual(src, u8) {
    let h;
    try { h = decodeFrame(u8); } catch (e) { this.reject(src, e.message); return; }
    if (h.kind === KIND.WAKE || h.kind === KIND.ROLLBACK) return;
    const P = this.plan;
    if (!P) { this.reject(src, "no plan yet"); return; }
    if (h.dtype !== 0) { this.reject(src, "a float16 residual"); return; }
    if (h.hidden !== P.hidden) { this.reject(src, `hidden ${h.hidden}, expected ${P.hidden}`); return; }
    if (h.kind === KIND.RETURN) {
      this.stamp(this.stampsIn, h.lap, src);
      this.stamp(this.stampsOut, h.lap, P.prev);
      this.send(P.prev, "residual", u8);
      return;
    }
    if (h.kind !== KIND.PREFILL && h.kind !== KIND.DECODE) { this.reject(src, `a kind ${h.kind} frame at a worker`); return; }
    const cap = Math.min(P.context || Infinity, this.bundle.max_ctx);
    if (h.first + h.tokens > cap) { this.reject(src, `positions ${h.first}-${h.first + h.tokens - 1} do not fit the cache of ${cap}`); return; }
    if (h.slot !== 0) { this.reject(src, `KV cache slot ${h.slot}; a tab keeps slot 0 only`); return; }
    let bad = 0;
    for (const v of h.x) if (!Number.isFinite(v)) bad++;
    if (bad) {
      const reason = `the residual it sent for lap ${h.lap} has ${bad} NaN/inf value${bad !== 1 ? "s" : ""}`;
      this.reject(src, reason);
      this.control(P.host, { type: "fault", lap_id: h.lap, device: src, reason });
      return;
    }
    // planner/scheduler/worker.py accept(): a new question starts at 0, a later first
    // position than the cache holds is stale; an earlier one rolls the cache back, which
    // this cache does by writing over those positions
    let kv = this.slotKv.get(h.slot) || 0;
    if (h.question !== this.slotQuestion.get(h.slot)) {
      if (h.first !== 0) { this.reject(src, "frame of a question this stage is not serving"); return; }
      this.slotQuestion.set(h.slot, h.question);
      kv = 0;
    }
    if (h.first > kv) { this.reject(src, `stale: starts at ${h.first}, cache holds ${kv}`); return; }
    this.slotKv.set(h.slot, h.first + h.tokens);
    this.stats.frames_in++;
    this.stamp(this.stampsIn, h.lap, src);
    this.passTimes.push([clockS(), h.tokens]);
    if (this.passTimes.length > 1024) this.passTimes.shift();
    if (this.o.onPass) this.o.onPass(this);
    this.queue = this.queue.then(() => this.run(h)).catch((e) => this.fail(e));
  }

  async run(h) {
    const t0 = performance.now();
    const y = await this.stage.forward(h.x, h.tokens, h.first);
    this.ms.push([h.tokens, performance.now() - t0]);
    this.stats.tokens += h.tokens;
    this.stats.passes++;
    if (this.o.onStats) this.o.onStats(this);
    const P = this.plan;
    if (P.next !== null) {
      this.stamp(this.stampsOut, h.lap, P.next);
      this.send(P.next, "residual", encodeFrame(h, h.kind, y));
      this.stats.frames_out++;
      return;
    }
    if (!h.returns) return;  // a prefill chunk that does not return: its work is in the KV cache
    const back = !P.viaStages || P.prev === P.host;
    this.stamp(this.stampsOut, h.lap, back ? P.host : P.prev);
    this.send(back ? P.host : P.prev, "residual", encodeFrame(h, back ? KIND.RESULT : KIND.RETURN, y));
    this.stats.frames_out++;
  }

  lost(peer, why) {
    if (this.over || (this.away && peer === this.o.host)) return;
    this.note(`lost ${peer}: ${why}`);
    if (peer !== this.o.host) return;
    if (!this.loaded) { this.end("Room over", `lost the model host (${why}) before this tab held its layers`); return; }
    this.awaitHost(why);
  }

  // "Host reconnecting": the layers kept, the host awaited for the room's host_wait_s on the
  // live connection and through the relay (its new process's offer); then "Room over".
  awaitHost(why) {
    const h = this.o.host, waitS = Number.isFinite(this.o.hostWaitS) ? this.o.hostWaitS : HOST_WAIT_S;
    this.away = true;
    this.relinked = false;
    this.say("Host reconnecting", `lost the model host ${h} (${why}); keeping layers ${this.shown}, waiting up to ${waitS} s`);
    this.awayTimer = setTimeout(() => this.end("Room over", `the model host ${h} did not come back within ${waitS} s`), waitS * 1000);
    const round = {};
    this.relinkRound = round;
    (async () => {
      round.sig = await this.signalling();
      if (this.relinkRound !== round || !this.away || this.over) { round.sig.ws.close(); return; }
      try {
        await this.link(h, round.sig, waitS * 1000);
      } finally {
        round.sig.ws.close();
      }
      if (this.relinkRound !== round || this.over) return;
      // the host's new process: an empty KV cache, hello again, its plan follows
      this.relinked = true;
      this.slotQuestion.clear();
      this.slotKv.clear();
      this.plan = null;
      this.heardMs[h] = performance.now();
      delete this.beatIn[h];
      this.stampsIn.length = 0;
      this.stampsOut.length = 0;
      this.control(h, { type: "hello", device: this.o.device, host: false, layers: this.range, lends: 0 });
      this.told = -1;
      this.progress(100);
      this.back("a new connection to its new process");
    })().catch((e) => { if (this.relinkRound === round && this.away) this.note(`reconnecting to ${h}: ${e.message || e}`); });
  }

  back(how) {
    this.away = false;
    clearTimeout(this.awayTimer);
    const round = this.relinkRound;
    this.relinkRound = null;
    if (round && round.sig && !this.relinked) round.sig.ws.close();  // the relay wait ends
    this.note(`${this.o.host} is back (${how}): resuming the room`);
    if (this.plan) this.serving(); else this.say("Standing by", `${this.o.host} is back; waiting for its plan`);
  }

  fail(e) { this.error = String(e && e.message ? e.message : e); this.note("error: " + this.error); this.end("Room over", this.error); }

  end(status, detail) {
    if (this.over) return;
    this.over = true;
    clearInterval(this.beat);
    clearTimeout(this.awayTimer);
    if (this.relinkRound && this.relinkRound.sig) this.relinkRound.sig.ws.close();
    this.note(`${status}: ${detail}`);
    this.say(status, detail);
    for (const lk of Object.values(this.links)) lk.pc.close();
  }
}

// share.html?layers=A-B[&device=ID][&peers=A,B]: join the room of the page's host as a worker.
export async function joinFromPage(state, params, show, onPass, onStats) {
  const t = state.tab;
  if (!t) throw new Error("this room takes no tabs that hold layers (the host serves no /tab routes)");
  const device = params.get("device") || "tab";
  const peers = (params.get("peers") || t.host).split(",").map((s) => s.trim()).filter((s) => s && s !== device);
  const w = new TabWorker({ relay: t.relay, room: t.room, device, peers, host: t.host, layers: params.get("layers"),
                            iceServers: t.ice_servers, relayOnly: t.relay_only, hostWaitS: t.host_wait_s, model: state.model,
                            show, onPass, onStats });
  window.tabWorker = w;
  try {
    await w.start();
  } catch (e) {
    w.fail(e);
  }
  return w;
}
