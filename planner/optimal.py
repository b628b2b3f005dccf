"""``split: optimal``: the devices, host, layer ranges and ring order that maximise
predicted decode tokens per second under the memory each device lends.

The objective is the analytic lap of :mod:`planner.lapcost` (head + stages + hops,
one token per lap), minimised over

* the model host ``h`` (any device with WebGPU, capacity and room for the embedding,
  head and draft; or the scenario's forced ``host``),
* the set ``S`` of other devices that hold layers (each at least one; the host too),
* the ring order of ``S`` (host -> ... -> host, links may be asymmetric),
* the cut points (how many layers each holds, at most what it holds in memory).

With layers of one size and a per-layer cost per device, the problem separates: for a
fixed ``(h, S)`` the compute part ``sum n_i * s_i`` does not depend on the order, and is
minimised by giving every member one layer and the rest to the fastest first, each up
to what it holds (an exchange argument: moving a layer to a faster device with room
never costs more). The hop part is the cheapest Hamiltonian cycle through ``S + h``,
found for every ``S`` at once by Held-Karp over subsets (O(2^m m^2) per host, m the
other devices; vectorised with numpy by subset size). So up to
:data:`EXACT_MAX_DEVICES` devices the search is exact; tests/unit/test_optimal.py
compares it with brute force over every order and every cut.

Layers of different sizes (``ModelSpec.layer_sizes``): the host, set and order are
chosen as above with the mean layer size, then the cuts for that order are found
exactly by a dynamic program over cut points with each range's own bytes (capacity)
and time (bytes over the mean). Exact in the cuts, not in the order.

More than :data:`EXACT_MAX_DEVICES` devices: a heuristic. For each of the
:data:`HEURISTIC_HOSTS` hosts with the smallest lower bound, the sets are the host plus
the k fastest other devices (k = 0, 1, ...); each is ordered by nearest neighbour and
improved by 2-opt. A 40-device room takes about 1 s, 100 devices some 10 s (2-core
development machine). The deal's notes give its gap to a lower bound:
``min over hosts of head + the cheapest compute with every device available and no
one-layer minimum + (two cheapest hops out of and into the host when it cannot hold
the model alone)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from planner.deal import SPLITS, Deal, DealError, Stage, _finish, computes, deal, holds_layers, pick_host, usable_bytes
from planner.lapcost import LapCost
from planner.model import ModelSpec
from planner.room import DealOptions, Device, Network

#: Exact search (Held-Karp over subsets) up to this many eligible devices; above, the
#: heuristic. 12 devices: 12 hosts x 2^11 subsets x 11^2 transitions, under 1 s.
EXACT_MAX_DEVICES = 12
#: Heuristic: only this many hosts are tried, those whose lap lower bound is smallest.
HEURISTIC_HOSTS = 8


@dataclass(frozen=True)
class Plan:
    """The best ring found: host, stages ``(device, start, end)`` in chain order (the
    host's first), predicted lap seconds, whether the search was exact, and a lower
    bound on any deal's lap (seconds; equals ``lap_s`` when exact)."""

    host: str
    stages: tuple[tuple[str, int, int], ...]
    lap_s: float
    exact: bool
    bound_s: float


def _eligible(devices: Sequence[Device]) -> list[Device]:
    return [d for d in devices if d.webgpu and computes(d) and d.lends_bytes > 0]


def _caps(devs: list[Device], model: ModelSpec, options: DealOptions) -> tuple[dict, dict]:
    """Layers each device holds as a worker and as the host (capped at the model)."""
    L = model.layers
    if model.uniform:
        worker = {d.id: min(L, holds_layers(d, model, options, False)) for d in devs}
        host = {d.id: min(L, holds_layers(d, model, options, True)) for d in devs}
        return worker, host
    # per-layer sizes: an optimistic count (the smallest layers), so the search is a
    # relaxation; the cut DP then checks each range's real bytes
    kv = model.kv_bytes(options.kv_tokens, options.kv_cache)
    prefix, acc = [], 0
    for size in sorted(model.layer_sizes):
        acc += size + kv
        prefix.append(acc)

    def count(free: int) -> int:
        return sum(1 for p in prefix if p <= free)

    worker, host = {}, {}
    for d in devs:
        worker[d.id] = count(usable_bytes(d, options))
        host[d.id] = count(usable_bytes(d, options) - model.host_extra_bytes)
    return worker, host


def _greedy_counts(members: list[str], s: dict[str, float], cap: dict[str, int], L: int
                   ) -> dict[str, int] | None:
    """One layer each, the rest to the fastest first up to ``cap``; None if infeasible.
    ``members`` must be sorted fastest first."""
    if len(members) > L or any(cap[m] < 1 for m in members):
        return None
    counts = {m: 1 for m in members}
    left = L - len(members)
    for m in members:
        if left == 0:
            break
        take = min(cap[m] - 1, left)
        counts[m] += take
        left -= take
    return counts if left == 0 else None


def _held_karp(m: int, w_out: np.ndarray, w: np.ndarray, w_in: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest path host -> (every node of mask) -> back to host, for every mask.

    ``w_out[v]``: host -> v; ``w[u, v]``: u -> v; ``w_in[v]``: v -> host. Returns
    ``cycle[mask]`` (inf where unreachable; ``cycle[0] = 0``) and ``P[mask, v]`` (the path
    cost ending at v) for rebuilding the order.
    """
    n_masks = 1 << m
    P = np.full((n_masks, m), np.inf)
    for v in range(m):
        P[1 << v, v] = w_out[v]
    popcount = np.array([bin(x).count("1") for x in range(n_masks)])
    for size in range(2, m + 1):
        masks = np.nonzero(popcount == size)[0]
        for v in range(m):
            bit = 1 << v
            mv = masks[(masks & bit) != 0]
            if mv.size == 0:
                continue
            prev = P[mv ^ bit]  # [k, m]: paths over mask - v ending at u
            P[mv, v] = np.min(prev + w[:, v][None, :], axis=1)
    cycle = np.min(P + w_in[None, :], axis=1)
    cycle[0] = 0.0
    return cycle, P


def _rebuild_order(mask: int, P: np.ndarray, w: np.ndarray, w_in: np.ndarray) -> list[int]:
    """The node order of the cheapest cycle through ``mask`` (from the Held-Karp table)."""
    order = []
    last = int(np.argmin(P[mask] + w_in))
    cur_mask = mask
    while True:
        order.append(last)
        prev_mask = cur_mask ^ (1 << last)
        if prev_mask == 0:
            break
        target = P[cur_mask, last]
        cands = [u for u in range(w.shape[0]) if prev_mask & (1 << u)]
        last = min(cands, key=lambda u: abs(P[prev_mask, u] + w[u, last] - target))
        cur_mask = prev_mask
    return order[::-1]


def _layout(host: str, order: list[str], counts: dict[str, int]) -> tuple[tuple[str, int, int], ...]:
    out, at = [], 0
    for dev in [host] + order:
        out.append((dev, at, at + counts[dev]))
        at += counts[dev]
    return tuple(out)


def _cut_dp(chain: list[str], is_host: dict[str, bool], devs: dict[str, Device], model: ModelSpec,
            options: DealOptions, cost: LapCost) -> tuple[tuple[str, int, int], ...] | None:
    """Exact cuts for a fixed chain (each device >= 1 layer, each range within what its
    device holds at its own position): minimises the sum of stage times. O(k L^2)."""
    L, k = model.layers, len(chain)
    INF = float("inf")
    f = [[INF] * (L + 1) for _ in range(k + 1)]
    arg = [[-1] * (L + 1) for _ in range(k + 1)]
    f[0][0] = 0.0
    for i, dev in enumerate(chain):
        for j0 in range(L + 1):
            if f[i][j0] == INF:
                continue
            cap = holds_layers(devs[dev], model, options, is_host[dev], j0)
            for j in range(j0 + 1, min(L, j0 + cap) + 1):
                c = f[i][j0] + cost.stage_s(dev, j0, j)
                if c < f[i + 1][j]:
                    f[i + 1][j], arg[i + 1][j] = c, j0
    if f[k][L] == INF:
        return None
    cuts, j = [L], L
    for i in range(k, 0, -1):
        j = arg[i][j]
        cuts.append(j)
    cuts = cuts[::-1]
    return tuple((dev, cuts[i], cuts[i + 1]) for i, dev in enumerate(chain))


def search(devices: Sequence[Device], model: ModelSpec, options: DealOptions, cost: LapCost,
           exact_max: int = EXACT_MAX_DEVICES) -> Plan:
    """The ring of least predicted lap (module doc). Raises DealError when no host and
    set of devices can hold the model in what they lend (less the headroom)."""
    devs = _eligible(devices)
    if options.host is not None:
        hosts = [d for d in devs if d.id == options.host]
        if not hosts:
            raise DealError(f"host {options.host!r} cannot hold layers (no WebGPU, zero capacity or lends nothing)")
    else:
        hosts = devs
    if not devs:
        raise DealError("no device can hold a layer (no WebGPU, zero capacity or lends nothing)")
    L = model.layers
    cap_w, cap_h = _caps(devs, model, options)
    s = {d.id: cost.layer_s(d.id) for d in devs}
    by_speed = sorted(devs, key=lambda d: (s[d.id], d.id))
    exact = len(devs) <= exact_max
    best: tuple[float, str, tuple] | None = None
    bound = float("inf")
    memo: dict = {}

    via = cost.return_path == "via_stages"

    def hop(a: str, b: str) -> float:
        """One forward hop (``direct``), or the hop and its return (``via_stages``)."""
        v = memo.get((a, b))
        if v is None:
            v = memo[(a, b)] = cost.hop_s(a, b) + (cost.hop_s(b, a) if via else 0.0)
        return v
    min_pair = min((hop(a.id, b.id) for a in devs for b in devs if a is not b), default=0.0)
    per_host = []
    for h in hosts:
        if cap_h[h.id] < 1:
            continue
        others = [d for d in by_speed if d.id != h.id]
        cap = dict(cap_w)
        cap[h.id] = cap_h[h.id]
        head = cost.head_s(h.id)
        # lower bound for this host: every device available, no one-layer minimum, and
        # the fewest devices that can hold the model joined by the cheapest hops
        left, lb = L, 0.0
        for d in by_speed:
            take = min(cap[d.id], left)
            lb += take * s[d.id]
            left -= take
        if left:
            continue  # this host and everyone else cannot hold the model
        k_min, held = 0, cap[h.id]
        for c in sorted((cap[d.id] for d in others), reverse=True):
            if held >= L:
                break
            held, k_min = held + c, k_min + 1
        hop_lb = 0.0
        if k_min and via:  # a path of k_min edges from the host, each paid both ways
            hop_lb = min(hop(h.id, d.id) for d in others) + (k_min - 1) * min_pair
        elif k_min:
            out_in = min(hop(h.id, d.id) for d in others) + min(hop(d.id, h.id) for d in others)
            hop_lb = max(out_in + (k_min - 1) * min_pair, (k_min + 1) * min_pair)
        host_lb = head + lb + hop_lb
        bound = min(bound, host_lb)
        per_host.append((host_lb, h, others, cap, head, lb))
    per_host.sort(key=lambda x: (x[0], x[1].id))
    if not exact:
        per_host = per_host[:HEURISTIC_HOSTS]  # the hosts with the smallest lower bounds
    for host_lb, h, others, cap, head, lb in per_host:
        if best is not None and model.uniform and host_lb >= best[0]:
            continue  # no ring from this host can beat the best found
        if exact:
            cand = _exact_for_host(h.id, others, s, cap, L, head, cost, best[0] if best else float("inf"))
        else:
            cand = _heuristic_for_host(h.id, others, s, cap, L, head, hop, min_pair, lb,
                                       best[0] if best else float("inf"), via)
        if cand is not None and not model.uniform:
            cand = _cut_by_bytes(h.id, [x[0] for x in cand[1]], by_speed, model, options, cost)
        if cand is not None and (best is None or cand[0] < best[0] - 1e-15):
            best = (cand[0], h.id, cand[1])
    if best is None:
        raise DealError("no host and set of devices can hold the model in what they lend")
    lap, host, stages = best
    if not model.uniform:
        exact = False
    return Plan(host=host, stages=stages, lap_s=lap, exact=exact, bound_s=lap if exact else min(bound, lap))


def _cut_by_bytes(h: str, chain: list[str], by_speed: list[Device], model: ModelSpec, options: DealOptions,
                  cost: LapCost):
    """Per-layer sizes: exact cuts (by bytes) for the ring found with counts; if that
    ring cannot hold its ranges, the host plus the k fastest others (k = 0, 1, ...)."""
    by_id = {d.id: d for d in by_speed}
    tries = [chain] + [[h] + [d.id for d in by_speed if d.id != h][:k] for k in range(len(by_speed))]
    for ch in tries:
        cut = _cut_dp(ch, {c: c == h for c in ch}, by_id, model, options, cost)
        if cut is not None:
            return cost.lap_s(h, cut), cut
    return None


def _exact_for_host(h: str, others: list[Device], s: dict, cap: dict, L: int, head: float, cost: LapCost,
                    incumbent: float):
    m = len(others)
    ids = [d.id for d in others]
    w_out = np.array([cost.hop_s(h, v) for v in ids])
    w_in = np.array([cost.hop_s(v, h) for v in ids])
    w = np.array([[cost.hop_s(u, v) if u != v else np.inf for v in ids] for u in ids]) if m else np.zeros((0, 0))
    if cost.return_path == "via_stages":  # every hop is paid both ways; the path ends where it turns back
        w_out, w, w_in = w_out + w_in, w + w.T, np.zeros(m)
    cycle, P = _held_karp(m, w_out, w, w_in) if m else (np.zeros(1), None)
    # the host and `others` are sorted fastest first; members of a mask keep that order
    h_rank = sum(1 for d in others if (s[d.id], d.id) < (s[h], h))
    best = None
    s_min = min([s[h]] + [s[i] for i in ids])
    order_idx = np.argsort(cycle, kind="stable")
    for mask in order_idx:
        mask = int(mask)
        hop = float(cycle[mask])
        if not np.isfinite(hop):
            continue
        if head + hop + L * s_min >= min(incumbent, best[0] if best else np.inf):
            break  # masks come cheapest cycle first: nothing later can win
        members = [ids[i] for i in range(m) if mask >> i & 1]
        members.insert(sum(1 for x in members if ids.index(x) < h_rank), h)
        counts = _greedy_counts(members, s, cap, L)
        if counts is None:
            continue
        lap = head + hop + sum(counts[x] * s[x] for x in members)
        if best is None or lap < best[0] - 1e-15:
            order = [ids[i] for i in _rebuild_order(mask, P, w, w_in)] if mask else []
            best = (lap, _layout(h, order, counts))
    return best


def _heuristic_for_host(h: str, others: list[Device], s: dict, cap: dict, L: int, head: float, hop,
                        min_pair: float, compute_lb: float, incumbent: float, via: bool = False):
    """Host ``h`` plus its k fastest others, k = 0, 1, ...; rings by nearest neighbour +
    2-opt. A k is skipped when even its cheapest possible ring cannot beat the best lap,
    and the loop stops when no larger k can (hops grow by at least ``min_pair`` each)."""
    best = None
    for k in range(len(others) + 1):
        limit = min(incumbent, best[0] if best else float("inf"))
        edges = k if via else k + 1  # hops of a path there and back / of a ring
        if k and head + compute_lb + edges * min_pair >= limit:
            break
        if k + 1 > L:
            break
        chosen = [d.id for d in others[:k]]
        members = sorted([h] + chosen, key=lambda x: (s[x], x))
        counts = _greedy_counts(members, s, cap, L)
        if counts is None:
            continue
        compute = sum(counts[x] * s[x] for x in members)
        if k and head + compute + edges * min_pair >= limit:
            continue
        order = _nn_two_opt(h, chosen, hop, via)
        lap = head + compute + _ring_cost(h, order, hop, via)
        if best is None or lap < best[0] - 1e-15:
            best = (lap, _layout(h, order, counts))
    return best


def _ring_cost(h: str, order: list[str], hop, via: bool = False) -> float:
    """Hop seconds of the ring ``h -> order -> h``; with ``via`` the path ``h -> order``
    only (``hop`` then already counts each hop's return)."""
    ring = [h] + order + ([] if via else [h])
    return sum(hop(a, b) for a, b in zip(ring, ring[1:]) if a != b)


def _nn_two_opt(h: str, nodes: list[str], hop, via: bool = False) -> list[str]:
    """Nearest-neighbour ring from ``h`` through ``nodes``, improved by 2-opt (segment
    reversal) until no move helps (at most 10 passes)."""
    left, order, cur = list(nodes), [], h
    while left:
        nxt = min(left, key=lambda v: (hop(cur, v), v))
        order.append(nxt)
        left.remove(nxt)
        cur = nxt
    best = _ring_cost(h, order, hop, via)
    for _ in range(10):
        improved = False
        for i in range(len(order) - 1):
            for j in range(i + 1, len(order)):
                cand = order[:i] + order[i:j + 1][::-1] + order[j + 1:]
                c = _ring_cost(h, cand, hop, via)
                if c < best - 1e-15:
                    order, best, improved = cand, c, True
        if not improved:
            break
    return order


def optimal_deal(devices: Sequence[Device], model: ModelSpec, options: DealOptions,
                 network: Network | None = None, return_path: str = "direct") -> Deal:
    """The deal of :func:`search`, as a :class:`Deal` (``split="optimal"``) whose notes
    say what was chosen and why, and how much faster than the ``speed`` deal it is
    predicted to decode (both by :class:`planner.lapcost.LapCost`); ``Deal.predicted``
    holds the numbers (seconds and tokens per second).

    Raises DealError for duplicate ids or a room that cannot hold the model.
    """
    devices = sorted(devices, key=lambda d: d.id)
    ids = [d.id for d in devices]
    if len(set(ids)) != len(ids):
        raise DealError(f"duplicate device id: {', '.join(sorted({i for i in ids if ids.count(i) > 1}))}")
    cost = LapCost(devices, model, network or Network(), return_path)
    plan = search(devices, model, options, cost)
    stages = tuple(Stage(d, a, e) for d, a, e in plan.stages)
    compute = sum(cost.stage_s(d, a, e) for d, a, e in plan.stages)
    head = cost.head_s(plan.host)
    ring_ids = [plan.host] + [s.device for s in stages[1:]] + [plan.host]
    hops = cost.hops_s(plan.host, [s.device for s in stages])
    ring = " -> ".join(ring_ids) if len(stages) > 1 else f"{plan.host} alone"
    notes = [f"split optimal: {plan.host} hosts, ring {ring}: predicted lap {plan.lap_s * 1e3:.2f} ms "
             f"(layers {compute * 1e3:.2f} ms, hops {hops * 1e3:.2f} ms, head {head * 1e3:.2f} ms), "
             f"{1 / plan.lap_s:.2f} tok/s plain decoding"]
    if plan.exact:
        notes.append("exact: every host, set of devices, ring order (Held-Karp) and cut checked")
    else:
        gap = (plan.lap_s - plan.bound_s) / plan.bound_s if plan.bound_s > 0 else 0.0
        why = "layers of different sizes: order from the mean size, cuts exact" if not model.uniform else \
            f"more than {EXACT_MAX_DEVICES} devices: fastest-k sets, nearest neighbour + 2-opt rings"
        notes.append(f"heuristic ({why}); at most {gap:.1%} slower than the lower bound "
                     f"{plan.bound_s * 1e3:.2f} ms")
    s = {d.id: cost.layer_s(d.id) for d in _eligible(devices)}
    used = {st.device for st in stages}
    for d in sorted(_eligible(devices), key=lambda d: (s[d.id], d.id)):
        if d.id not in used:
            notes.append(f"{d.id} asks only: {s[d.id] * 1e3:.2f} ms per layer; another hop "
                         "would cost more than its layers save")
    predicted = {"lap_s": plan.lap_s, "tokens_per_s": 1 / plan.lap_s, "exact": plan.exact,
                 "bound_lap_s": plan.bound_s}
    try:
        sp = deal(devices, model, replace(options, split="speed"))
        sp_lap = cost.lap_s(sp.host, [(x.device, x.start, x.end) for x in sp.stages])
        predicted["speed_tokens_per_s"] = 1 / sp_lap
        predicted["speedup_vs_speed"] = sp_lap / plan.lap_s
        notes.append(f"vs split speed ({sp.host} hosts, {len(sp.stages)} stage{'s' if len(sp.stages) != 1 else ''}"
                     f"{'' if sp.fits else ', does not fit'}): {1 / sp_lap:.2f} tok/s predicted, "
                     f"optimal is {sp_lap / plan.lap_s:.2f}x as fast")
    except DealError as e:
        notes.append(f"split speed cannot deal this room ({e})")
    pick = pick_host(devices, options.host)[0] if options.host is None else options.host
    if plan.host != pick:
        notes.append(f"{plan.host} hosts instead of the rules' pick {pick}: a faster ring")
    holds = {d.id: holds_layers(d, model, options, d.id == plan.host, 0 if d.id == plan.host else None)
             for d in devices}
    out = _finish(devices, model, options, plan.host, "optimal", stages, holds, notes)
    return replace(out, predicted=predicted)


SPLITS["optimal"] = optimal_deal

#: A deal predicted more than this many times slower than ``split: optimal``'s earns a
#: warning (:func:`slower_than_optimal`). A product choice (a gap a person notices),
#: not a measured figure.
SLOWER_THAN_OPTIMAL_RATIO = 1.2


def slower_than_optimal(d: Deal, devices: Sequence[Device], model: ModelSpec, options: DealOptions,
                        network: Network | None = None, return_path: str = "direct",
                        ratio: float = SLOWER_THAN_OPTIMAL_RATIO,
                        how: str | None = None) -> str | None:
    """One line saying that deal ``d`` is predicted more than ``ratio`` times slower than
    ``split: optimal``'s deal of the same room, with both predicted rates (tokens per
    second, :class:`planner.lapcost.LapCost`, plain decoding) and the deal to use; None
    when it is not, when ``d`` is the optimal deal itself, or when optimal cannot deal
    the room or its deal does not fit. A forced ``host`` stays forced. ``how`` ends the
    line: how to get the better deal with the tool that prints it; by default the
    scenario settings that give it (pinned stages override ``split``, so with
    ``options.stages`` set the line says to drop them too).
    """
    pinned = options.stages is not None
    if (d.split == "optimal" and not pinned) or not d.stages:
        return None
    if how is None:
        how = ("use split: optimal without the pinned stages (--set stages=null --set split=optimal)" if pinned
               else "use split: optimal (--set split=optimal)")
    try:
        best = optimal_deal(devices, model, replace(options, split="optimal", stages=None), network, return_path)
    except DealError:
        return None
    if not best.fits or best.predicted is None:
        return None
    cost = LapCost(list(devices), model, network or Network(), return_path)
    lap = cost.lap_s(d.host, [(s.device, s.start, s.end) for s in d.stages])
    best_lap = best.predicted["lap_s"]
    if not lap > ratio * best_lap:
        return None
    use = ", ".join(f"{s.device} {s.shown}" for s in best.stages)
    return (f"warning: this deal ({d.split}) is predicted at {1 / lap:.1f} tok/s, {lap / best_lap:.2f}x slower "
            f"than split: optimal's {1 / best_lap:.1f} tok/s ({best.host} hosts: {use}); {how}")

