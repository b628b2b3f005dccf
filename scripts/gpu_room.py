#!/usr/bin/env python3
"""Rooms of wgpu stages sharing one GPU, predicted before they run (docs/validation.md).

Everything in one process, for one call on a GPU machine:

1. Make a random-weight checkpoint (scripts/make_gguf.py) of ``--shape`` in ``--mix``, with the
   tokenizer of ``--tokenizer-from`` (a GGUF; the vocabulary is then that tokenizer's), unless
   ``--gguf`` already exists.
2. Write the room's scenario beside ``--out``: three devices ``gpu0``-``gpu2`` that each run
   their own process (each its own wgpu device on the one GPU), the checkpoint held as stored
   (``weights: gguf``), float32 KV (what the wgpu backend stores).
3. Calibrate once, as ``splitroom calibrate --backend B`` does: the parts alone on this model
   (passes by layers x tokens x context, the head, prompt lookup's walks, the transport by frame
   size), then one 2-device room on loopback, plain, on calibration prompts.
4. Predict every configuration from that profile and write the predictions (JSON, with the
   time) to ``--out`` before any room runs.
5. Run each configuration ``--repeat`` times (``splitroom run --real``'s run_real: one
   process per device, WebRTC between them, loopback) and write measured beside predicted,
   with the parts of a hop: the profile's one-way transport (framing and WebRTC, measured
   by ping-pong), a stage's fixed cost (upload, submit and read-back: the pass curve's
   intercept), and the time per token one more device adds (3 stages - 2 stages).

The round trip is not emulated when runtime.testbed.netem.available() says no (the machine has no
netem or namespaces); the record says why.

Usage (docs/benchmarks.md gives the device call)::

    python scripts/gpu_room.py --tokenizer-from tok.gguf --gguf /tmp/l3b.gguf --out $OUT/gpu-room.json
    python scripts/gpu_room.py --small ...    # a tiny shape, quick calibration: checks the steps
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import make_gguf  # noqa: E402
from scripts.validate_heldout import CHAT_PROMPTS, judge, markdown, summary  # noqa: E402

#: the room's scenario; MODEL is replaced by the checkpoint's path
SCENARIO = """# written by scripts/gpu_room.py: device processes sharing one GPU
name: GPU room
seed: 7
model: {gguf: MODEL}
weights: gguf
context: 2048
kv_cache: f32
split: speed
devices:
  - {id: gpu0, name: GPU process 0, kind: computer, lends: 40 GB, memory_bandwidth: 4000 GB/s, compute: 60 TFLOPS}
  - {id: gpu1, name: GPU process 1, kind: computer, lends: 40 GB, memory_bandwidth: 4000 GB/s, compute: 60 TFLOPS}
  - {id: gpu2, name: GPU process 2, kind: computer, lends: 40 GB, memory_bandwidth: 4000 GB/s, compute: 60 TFLOPS}
network:
  rtt: 0 ms
  bandwidth: 10 Gbit/s
workload:
  questions: 2
  prompt_tokens: 32
  answer_tokens: ANSWER
decoding:
  prefill_chunk: 16
  speculative: null
  async_laps: 1
"""


def cuts(n: int, layers: int) -> list[tuple[int, int]]:
    """``n`` stages over ``layers`` layers, 0-based half-open, the first stages one layer
    longer when they do not divide evenly (28 in 3: 0-10, 10-19, 19-28)."""
    out, start = [], 0
    for i in range(n):
        size = layers // n + (1 if i < layers % n else 0)
        out.append((start, start + size))
        start += size
    return out


def stages(n: int, layers: int) -> str:
    """``--set`` value pinning ``n`` stages over ``layers`` layers (:func:`cuts`, typed 1-based)."""
    return "stages=[" + ", ".join(f'{{device: gpu{i}, layers: "{a + 1}-{b}"}}'
                                  for i, (a, b) in enumerate(cuts(n, layers))) + "]"


def configurations(layers: int, rtts_ms: tuple[float, ...] = (), loopback: bool = True) -> list[tuple[str, list[str]]]:
    """(name, --set overrides) of each room: 2 and 3 stages, plain and prompt lookup, on
    loopback (``loopback``) and at each round trip of ``rtts_ms`` (milliseconds, applied in
    the device processes: run_real's ``in_process_delay``)."""
    ngram = ["decoding.speculative={drafter: ngram, draft_tokens: 4}"]
    rows = []
    for rtt in ((0.0,) if loopback else ()) + tuple(rtts_ms):
        where = "loopback" if rtt == 0 else f"{rtt:g} ms in process"
        for n in (2, 3):
            base = [stages(n, layers), "host=gpu0", f"workload.prompts={json.dumps(CHAT_PROMPTS)}",
                    f"network.rtt={rtt:g} ms"]
            rows.append((f"{n} stages, {where}, plain", base))
            rows.append((f"{n} stages, {where}, ngram k=4", base + ngram))
    return rows


def _median_s(fn, n: int) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def hop_alone(hidden: int, backend: str, n: int = 300) -> dict:
    """The parts of a hop timed alone, seconds (median of ``n``): ``gpu_round_trip_s``, one
    token's residual (``[1, hidden]`` float32) written to a GPU buffer, copied to a mapped
    buffer in one submitted command and read back (what a stage pays per pass beyond its
    kernels; wgpu only); ``framing_s``, runtime.codec's encode and decode of that frame."""
    import numpy as np

    from planner.frames import FrameHeader, FrameKind
    from runtime.codec import decode_frame, encode_frame
    x = np.random.default_rng(0).standard_normal((1, hidden)).astype(np.float32)
    h = FrameHeader(FrameKind.DECODE, 0, 1, 40, 1, hidden)
    out = {"framing_s": _median_s(lambda: decode_frame(encode_frame(h, x)), n * 10)}
    if backend == "wgpu":
        import wgpu

        from runtime.backends.wgpu_backend import get_device
        dev = get_device()[1]
        U = wgpu.BufferUsage
        buf = dev.create_buffer(size=x.nbytes, usage=U.STORAGE | U.COPY_DST | U.COPY_SRC)
        stg = dev.create_buffer(size=x.nbytes, usage=U.MAP_READ | U.COPY_DST)

        def trip():
            dev.queue.write_buffer(buf, 0, x)
            enc = dev.create_command_encoder()
            enc.copy_buffer_to_buffer(buf, 0, stg, 0, x.nbytes)
            dev.queue.submit([enc.finish()])
            stg.map_sync(wgpu.MapMode.READ, 0, x.nbytes)
            bytes(stg.read_mapped(0, x.nbytes, copy=False))
            stg.unmap()
        trip()
        out["gpu_round_trip_s"] = _median_s(trip, n)
    return out


def idle_passes(model_dir: str, backend: str, layers: int, gaps_ms: tuple[float, ...], rounds: int = 40) -> dict:
    """``{gap_ms: factor}``: one-token passes of a ``layers``-layer stage after each idle gap
    over the same passes back to back (runtime.calibrate.measure_idle, which calibration
    runs on wgpu for the profile's ``idle`` curve)."""
    from runtime.calibrate import measure_idle
    c = measure_idle(model_dir, backend, "gguf", layers, tuple(sorted({0.0, *(g / 1000 for g in gaps_ms)})), rounds)
    return {f"{x * 1000:g}": y for x, y in zip(c.xs, c.ys)}


def weight_bytes(model_dir: str, backend: str, ranges: list[tuple[int, int, bool]]) -> list[dict]:
    """What a stage of each range (0-based half-open, host: embedding and head) holds against
    the GGUF's bytes for that range: ``held_bytes`` (wgpu: its GPU weight buffers less the
    RoPE table; numpy: the arrays' bytes), ``file_bytes`` (gguf-py's tensor table) and
    their ratio (issue 21's goal: at most 1.15)."""
    import gc

    import gguf

    from runtime import gguf_blocks as gb
    from runtime.backends import StageSpec, make_stage
    from runtime.calibrate import _precision
    from runtime.config import ModelConfig
    from runtime.weights import gguf_source
    cfg = ModelConfig.load(model_dir)
    table = gb.tensor_table(gguf.GGUFReader(str(gguf_source(model_dir))))
    sizes, emb, head = gb.stored_sizes(table, cfg.n_layers)
    out = []
    for a, b, host in ranges:
        st = make_stage(backend, model_dir, StageSpec(a, b, host), max_ctx=64, precision=_precision("gguf"))
        if backend == "wgpu":
            held = st.bytes_weights - 64 * cfg.head_dim * 4  # the cos | sin table, [max_ctx, head_dim] float32
        else:
            held = sum(m.nbytes for L in st.layers for m in (L.wqkv, L.wo, L.wgu, L.wd, L.ln1, L.ln2))
            held += (st.embedding.nbytes + st.norm.nbytes) if host else 0
        want = sum(sizes[a:b]) + ((emb + head + table["output_norm.weight"].nbytes) if host else 0)
        out.append({"range": f"{a + 1}-{b}" + (" with embedding and head" if host else ""), "held_bytes": int(held),
                    "file_bytes": int(want), "ratio": held / want})
        del st
        gc.collect()
    return out


def hop_parts(profile, cfg_hidden: int, preds: list[dict]) -> dict:
    """What one hop costs (module doc, step 5), seconds."""
    from planner.frames import frame_bytes
    tr = profile.transport
    one = frame_bytes(1, cfg_hidden)
    dev = next(iter(profile.devices.values()))
    c = dev.stage.contexts[0]
    out = {"frame_bytes_1_token": one,
           "transport_one_way_s": tr.one_way_s(one) if tr is not None else None,
           "stage_fixed_s": dev.stage.pass_s(0, 1, c), "per_layer_s": dev.stage.pass_s(1, 1, c) - dev.stage.pass_s(0, 1, c),
           "room_notes": profile.notes.get("room")}
    by_where: dict[str, dict[str, dict]] = {}
    for p in preds:
        if p["name"].endswith("plain") and "measured_tokens_per_s" in p:
            n, where = p["name"].split(" ")[0], p["name"].split(", ")[1]
            by_where.setdefault(where, {})[n] = p
    added = {}
    for where, plain in by_where.items():
        if "2" in plain and "3" in plain:
            hops = [r["parts"]["hop_p50_s"] for n in ("2", "3") for r in plain[n]["measured_runs"]
                    if r["parts"]["hop_p50_s"]]
            added[where] = {
                "per_device_added_measured_s": 1 / plain["3"]["measured_tokens_per_s"]
                - 1 / plain["2"]["measured_tokens_per_s"],
                "per_device_added_predicted_s": 1 / plain["3"]["predicted"]["tokens_per_s"]
                - 1 / plain["2"]["predicted"]["tokens_per_s"],
                "room_hop_p50_s": statistics.median(hops) if hops else None}
    if "loopback" in added:
        out.update(added["loopback"])
    out["per_device_added"] = added
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="the checkpoint (made here when it does not exist)")
    ap.add_argument("--tokenizer-from", help="a GGUF whose tokenizer the new checkpoint takes")
    ap.add_argument("--shape", default="llama-3b", choices=tuple(make_gguf.SHAPES))
    ap.add_argument("--mix", default="q8_0", choices=make_gguf.MIXES)
    ap.add_argument("--backend", default="wgpu", choices=("wgpu", "numpy"))
    ap.add_argument("--out", required=True, help="predictions and results (JSON); the scenario and profile beside")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--answer-tokens", type=int, default=64)
    ap.add_argument("--small", action="store_true", help="quick calibration (checks the steps, no predictions)")
    ap.add_argument("--only", help="run only the configurations whose name contains one of these texts "
                    "(separated by ;)")
    ap.add_argument("--rtt-ms", default="", help="also run every configuration at these round trips (ms, comma-"
                    "separated), applied in the device processes (runtime.transport.emulate_delay)")
    ap.add_argument("--no-loopback", action="store_true", help="only the --rtt-ms rooms")
    ap.add_argument("--idle-gaps", help="only time one-token passes of --idle-layers layers after idle gaps of "
                    "these many ms (comma-separated), then exit")
    ap.add_argument("--idle-layers", type=int, default=14)
    ap.add_argument("--hop-only", type=int, metavar="HIDDEN", help="only time a hop's parts alone for this width")
    ap.add_argument("--deadline-s", type=float, default=None, help="start no room after this many seconds "
                    "from the start (the rooms left are recorded as not run)")
    ap.add_argument("--weight-bytes", action="store_true", help="also record what the 2- and 3-stage ranges hold "
                    "against the file's bytes (after the predictions, before the rooms)")
    a = ap.parse_args()
    began = time.time()
    say = (lambda s: print(s, flush=True))
    if a.hop_only:
        print(json.dumps(hop_alone(a.hop_only, a.backend)))
        return 0
    out = Path(a.out)
    gguf = Path(a.gguf)
    if not gguf.exists():
        if not a.tokenizer_from:
            ap.error(f"{gguf} does not exist: give --tokenizer-from to make it")
        t0 = time.time()
        n = make_gguf.write(gguf, a.shape, a.mix, seed=0, tokenizer_from=a.tokenizer_from)
        say(f"made {gguf}: {n / 1e9:.2f} GB ({a.shape}, {a.mix}) in {time.time() - t0:.0f} s")
    scn_path = out.with_suffix(".scenario.yaml")
    scn_path.write_text(SCENARIO.replace("MODEL", str(gguf.resolve())).replace("ANSWER", str(a.answer_tokens)))

    from planner.deal import deal
    from runtime.testbed import netem
    from runtime.config import ModelConfig
    from splitroom.calibration import build_profile, measure, measure_room_overheads, save_profile, with_room_overheads
    from splitroom.real import run_real
    from splitroom.real_configs import prompt_token_counts, real_model_dir, real_prompts
    from splitroom.real_predict import predict_real_run
    from splitroom.scenario import load

    base = load(str(scn_path))
    model_dir = str(real_model_dir(base))
    cfg = ModelConfig.load(model_dir)
    if a.idle_gaps:
        gaps = tuple(float(g) for g in a.idle_gaps.split(",") if g.strip())
        rec = {"at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "model": str(gguf), "mix": a.mix,
               "layers": a.idle_layers, "factors": idle_passes(model_dir, a.backend, a.idle_layers, gaps)}
        out.write_text(json.dumps(rec, indent=1))
        say(json.dumps(rec))
        return 0
    t0 = time.time()
    say(f"calibrating ({a.backend}, {base.model.layers} layers, weights gguf) ...")
    profile = build_profile(base, measure(a.backend, quick=a.small, log=lambda s: say("  " + s), model_dir=model_dir,
                                          weights="gguf"))
    profile = with_room_overheads(profile, measure_room_overheads(base, profile, log=lambda s: say("  " + s),
                                                                  answer_tokens=12 if a.small else 32,
                                                                  backend=a.backend))
    save_profile(profile, out.with_suffix(".profile.yaml"))
    calibrated_s = time.time() - t0
    say(f"calibrated in {calibrated_s:.0f} s")

    netns_ok, why = netem.available()
    rtts = tuple(float(x) for x in a.rtt_ms.split(",") if x.strip())
    only = [x.strip() for x in (a.only or "").split(";") if x.strip()]
    configs = [c for c in configurations(base.model.layers, rtts, not a.no_loopback)
               if not only or any(o in c[0] for o in only)]
    preds = []
    for name, sets in configs:
        scn = load(str(scn_path), sets)
        d = deal(scn.devices, scn.model, scn.options)
        rtt_s = scn.network.rtt_s
        m = predict_real_run(scn, d, profile, rtt_s, prompt_token_counts(model_dir, real_prompts(scn)),
                             in_process_delay=rtt_s > 0)
        preds.append({"name": name, "sets": sets, "rtt_s": rtt_s, "netns": False, "in_process_delay": rtt_s > 0,
                      "predicted": m})
    record = {"predicted_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "model": {"gguf": str(gguf), "bytes": gguf.stat().st_size, "shape": a.shape, "mix": a.mix,
                        "layers": cfg.n_layers, "hidden": cfg.hidden, "vocab": cfg.vocab},
              "backend": a.backend, "calibration_s": calibrated_s, "profile_notes": profile.notes,
              "network_emulation": ("in process (runtime.transport.emulate_delay: each device process holds what "
                                    "it sends rtt/2 below SCTP)" if rtts else "none")
              + (" ; namespaces available, not used" if netns_ok else f"; no namespaces ({why})"),
              "load_at_start": os.getloadavg(), "configurations": preds}
    out.write_text(json.dumps(record, indent=1))
    say(f"{len(preds)} predictions written to {out} at {record['predicted_at']}, before any room ran")
    for p in preds:
        say(f"  {p['name']}: predicted {p['predicted']['tokens_per_s']:.2f} tok/s, "
            f"first token {p['predicted']['ttft_s'] * 1000:.0f} ms")

    if a.weight_bytes:
        ranges = [(x, y, x == 0) for k in (2, 3) for x, y in cuts(k, cfg.n_layers)]
        record["weight_bytes"] = weight_bytes(model_dir, a.backend, ranges)
        out.write_text(json.dumps(record, indent=1))
        for w in record["weight_bytes"]:
            say(f"  layers {w['range']}: holds {w['held_bytes'] / 1e6:.1f} MB for {w['file_bytes'] / 1e6:.1f} MB "
                f"of the file, x{w['ratio']:.4f}")
    for p in preds:
        scn = load(str(scn_path), p["sets"])
        d = deal(scn.devices, scn.model, scn.options)
        runs = []
        if a.deadline_s is not None and time.time() - began > a.deadline_s:
            p["not_run"] = f"past --deadline-s {a.deadline_s:g}"
            say(f"  {p['name']}: not run ({p['not_run']})")
            continue
        for r in range(a.repeat):
            t1 = time.time()
            res = run_real(scn, d, backend=a.backend, netns=False, timeout_s=300, log=lambda s: None, profile=profile,
                           in_process_delay=p["in_process_delay"])
            m, cal = res.measured, res.calibration
            runs.append({"tokens_per_s": m["tokens_per_s"], "ttft_s": m["ttft_s"], "ttft_each_s": m.get("ttft_each_s"),
                         "tokens_per_lap": m["tokens_per_lap"], "answered": m["answered"], "lap_s": m.get("lap_s"),
                         "inter_token_s": m.get("inter_token_s"), "breakdown": m.get("breakdown"),
                         "parts": {"s_per_layer": cal.get("s_per_layer", {}), "hop_p50_s": cal.get("hop_p50_s"),
                                   "hop_s": cal.get("hop_s"), "head_s_per_row": cal.get("head_s_per_row")},
                         "network": res.network, "in_process_delay": cal.get("in_process_delay"),
                         "room_wall_s": time.time() - t1, "answer_head": res.answers[0]["text"][:80]})
            say(f"  {p['name']} run {r + 1}: {m['tokens_per_s']:.2f} tok/s, {m['tokens_per_lap']:.2f} tokens/lap, "
                f"first token {m['ttft_s'] * 1000:.0f} ms (predicted {p['predicted']['tokens_per_s']:.2f}); "
                f"room {time.time() - t1:.0f} s")
        p["measured_runs"] = runs
        judge(p)
        out.write_text(json.dumps(record, indent=1))

    done = [p for p in preds if "measured_runs" in p]
    record["summary"] = summary(done)
    record["hop"] = {**hop_parts(profile, cfg.hidden, done), **hop_alone(cfg.hidden, a.backend)}
    record["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out.write_text(json.dumps(record, indent=1))
    say(markdown(record, done))
    say(json.dumps(record["hop"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
