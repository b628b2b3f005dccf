"""A deal predicted much slower than ``split: optimal``'s says so in one line, with both
figures and the deal to use.

The room: 10 layers of 1 GB (no embedding, no KV), decode memory bound. The desktop
lends 100 GB at 10 GB/s, the laptop 40 GB at 50 GB/s: the desktop hosts (most memory;
the laptop lends less than half, so the copy-speed rule does not apply) and the speed
split keeps all 10 layers there. By hand (planner/lapcost.py: layers' bytes over
bandwidth plus 0.1 ms sampling): desktop alone 10 x 0.1 s + 0.1 ms = 1.0001 s a lap,
1.0 tok/s; laptop alone 10 x 0.02 s + 0.1 ms = 0.2001 s, 5.0 tok/s; 1.0001 / 0.2001 =
4.998, printed 5.00x.
"""

from __future__ import annotations

from dataclasses import replace

import json

from typer.testing import CliRunner

from planner.deal import deal
from planner.model import ModelSpec
from planner.optimal import slower_than_optimal
from planner.room import DealOptions, Device
from splitroom.cli import app

GB = 10**9
MODEL = ModelSpec(id="toy", name="toy", layers=10, hidden=64, layer_bytes=GB, layer_active_bytes=GB,
                  layer_flops_per_token=0.0, kv_bytes_per_token=0)


def room(laptop_Bps: float = 50e9) -> list[Device]:
    return [Device(id="desktop", kind="computer", lends_bytes=100 * GB, memory_bandwidth_Bps=10e9,
                   compute_flops=1e15),
            Device(id="laptop", kind="computer", lends_bytes=40 * GB, memory_bandwidth_Bps=laptop_Bps,
                   compute_flops=1e15)]


def test_the_biggest_lender_hosting_slowly_is_named_with_both_figures():
    devices = room()
    d = deal(devices, MODEL, DealOptions())
    assert [(s.device, s.shown) for s in d.stages] == [("desktop", "1-10")]
    line = slower_than_optimal(d, devices, MODEL, DealOptions())
    assert line is not None and "\n" not in line
    assert "(speed)" in line and "1.0 tok/s" in line and "5.00x" in line and "5.0 tok/s" in line
    assert "laptop hosts: laptop 1-10" in line and "split: optimal" in line


def test_a_memory_split_over_a_slow_big_lender_is_warned_about():
    # 100:40 gives the desktop 7 layers, the laptop 3: 7 x 0.1 + 3 x 0.02 = 0.76 s plus
    # two hops, over 3.7x the laptop alone (0.2001 s).
    devices = room()
    opts = DealOptions(split="memory")
    d = deal(devices, MODEL, opts)
    assert [(s.device, s.shown) for s in d.stages] == [("desktop", "1-7"), ("laptop", "8-10")]
    line = slower_than_optimal(d, devices, MODEL, opts)
    assert line is not None and "(memory)" in line and "laptop hosts: laptop 1-10" in line


def test_no_warning_within_the_ratio_nor_for_the_optimal_deal():
    # laptop at 11.5 GB/s: 1.0001 / (10 / 11.5 + 0.0001) = 1.150x, under 1.2x.
    devices = room(11.5e9)
    d = deal(devices, MODEL, DealOptions())
    assert slower_than_optimal(d, devices, MODEL, DealOptions()) is None
    devices = room()
    best = deal(devices, MODEL, DealOptions(split="optimal"))
    assert slower_than_optimal(best, devices, MODEL, DealOptions(split="optimal")) is None


def test_pinned_stages_with_a_slow_device_are_warned_about():
    # Pinned desktop 1-5, laptop 6-10: 5 x 0.1 + 5 x 0.02 = 0.6 s plus two hops,
    # against 0.2001 s for the laptop alone: about 3x.
    from planner.room import PinnedStage
    devices = room()
    opts = DealOptions(stages=(PinnedStage("desktop", 0, 5), PinnedStage("laptop", 5, 10)))
    d = deal(devices, MODEL, opts)
    line = slower_than_optimal(d, devices, MODEL, opts)
    assert line is not None and "(pinned)" in line and "laptop hosts: laptop 1-10" in line
    # Pinned stages override split, so "--set split=optimal" alone would give the same
    # 0.6 s lap: the line names the setting that changes the deal, and still warns when
    # split: optimal was given beside the pinned stages.
    assert line.endswith("(--set stages=null --set split=optimal)")
    both = replace(opts, split="optimal")
    line = slower_than_optimal(deal(devices, MODEL, both), devices, MODEL, both)
    assert line is not None and "stages=null" in line
    assert 2.95 < float(line.split("x slower")[0].rsplit(" ", 1)[1]) < 3.05  # 0.6 s / 0.2001 s, by hand above


SCENARIO = """\
name: slow host
model: {name: toy, layers: 10, hidden: 64, kv_bytes_per_token: 0 B, layer_bytes: 1 GB}
devices:
  - {id: desktop, lends: 100 GB, memory_bandwidth: 10 GB/s, compute: 1000 TFLOPS}
  - {id: laptop, lends: 40 GB, memory_bandwidth: 50 GB/s, compute: 1000 TFLOPS}
workload: {questions: 1, prompt_tokens: 4, answer_tokens: 3}
"""


def test_plan_and_simulate_print_the_warning_once(tmp_path):
    f = tmp_path / "slow.yaml"
    f.write_text(SCENARIO)
    for args in (["plan", str(f)], ["simulate", str(f), "--no-progress"], ["plan", str(f), "--json"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, (r.stdout, r.stderr)
        lines = [x for x in r.stderr.splitlines() if "slower than split: optimal" in x]
        assert len(lines) == 1, r.stderr
        assert "laptop hosts: laptop 1-10" in lines[0]
    r = CliRunner().invoke(app, ["plan", str(f), "--set", "split=optimal"])
    assert r.exit_code == 0 and "slower than split: optimal" not in r.stderr


def test_join_auto_warns_once_when_the_memory_deal_costs_hops(caplog):
    # Three devices of one speed, each lending 1 GiB: the 540 MB model fits on the host
    # alone, so dealing it by memory over three adds hops and nothing else.
    import logging
    from splitroom.join_cmd import plan_room
    with caplog.at_level(logging.WARNING, logger="splitroom.join"):
        chain = plan_room({d: {"layers": None, "lends": 1 << 30} for d in "abc"}, "a", 30)
    assert [d for d, _, _ in chain] == ["a", "b", "c"]
    lines = [r.getMessage() for r in caplog.records if "slower than split: optimal" in r.getMessage()]
    assert len(lines) == 1 and "(a hosts: a 1-30)" in lines[0] and "--layers" in lines[0]


def test_run_real_and_serve_print_the_warning_once_too(tmp_path):
    # the same room on the real commands: the deal is made (and warned about) before any
    # device starts; here the toy model has no weights, so each then refuses in one line
    f = tmp_path / "slow.yaml"
    f.write_text(SCENARIO)
    for args in (["run", str(f), "--real", "--loopback", "--timeout", "20"], ["serve", str(f), "--port", "0"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "'toy' has no weights here" in r.stderr, (args, r.stderr)
        lines = [x for x in r.stderr.splitlines() if "slower than split: optimal" in x]
        assert len(lines) == 1 and "laptop hosts: laptop 1-10" in lines[0], r.stderr


MEASURED_SCENARIO = """\
name: measured slow host
model: {name: toy, layers: 10, hidden: 64, kv_bytes_per_token: 0 B, layer_bytes: 1 GB, head_bytes: 5 GB}
devices:
  - {id: desktop, lends: 100 GB, memory_bandwidth: 10 GB/s, compute: 1000 TFLOPS}
  - {id: laptop, lends: 40 GB, memory_bandwidth: 10 GB/s, compute: 1000 TFLOPS}
measured: {ms_per_layer: {desktop: 100 ms, laptop: 20 ms}}
workload: {questions: 1, prompt_tokens: 4, answer_tokens: 3}
"""


def test_plan_redeal_that_keeps_the_slow_host_prints_the_warning_once(tmp_path):
    # Declared, both devices are alike (1 GB / 10 GB/s = 0.1 s a layer, the 5 GB head
    # 0.5 s): desktop alone 10 x 0.1 + 0.5 + 0.1 ms = 1.5001 s a lap, the laptop alone the
    # same, so plain `plan` (desktop hosts: it lends the most) warns of nothing. Measured,
    # the laptop takes 20 ms a layer (the head scales with it, planner/lapcost.py: 0.5 x
    # 0.02 / 0.1 = 0.1 s). `plan --redeal` keeps the desktop hosting with its layer 1 and
    # puts 2-10 on the laptop: 0.1 + 9 x 0.02 + 0.5001 + two hops of 0.5 ms (Network's 1 ms
    # round trip; the 160-byte frame, a 32-byte header and 2 x 64, adds 1.3 us each at
    # 125 MB/s) = 0.7811 s, 1.3 tok/s; the laptop alone: 10 x 0.02 + 0.1001 = 0.3001 s,
    # 3.3 tok/s; 0.7811 / 0.3001 = 2.60x.
    f = tmp_path / "measured.yaml"
    f.write_text(MEASURED_SCENARIO)
    r = CliRunner().invoke(app, ["plan", str(f)])
    assert r.exit_code == 0 and "slower than split: optimal" not in r.stderr, r.stderr
    r = CliRunner().invoke(app, ["plan", str(f), "--redeal", "--json"])
    assert r.exit_code == 0, (r.stdout, r.stderr)
    d = json.loads(r.stdout)
    assert d["host"] == "desktop"
    assert [(s["device"], s["start"], s["end"]) for s in d["stages"]] == [("desktop", 0, 1), ("laptop", 1, 10)]
    lines = [x for x in r.stderr.splitlines() if "slower than split: optimal" in x]
    assert len(lines) == 1, r.stderr
    assert "(speed) is predicted at 1.3 tok/s, 2.60x slower than split: optimal's 3.3 tok/s" in lines[0]
    assert "(laptop hosts: laptop 1-10)" in lines[0]
