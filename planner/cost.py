"""The cost of a useful token: US dollars per million tokens delivered to askers.

A device costs, per hour it serves (every hour of a run, idle or busy: stalls, stale
laps, rejected drafts and waiting are all paid for),

* rented: ``price.per_hour`` (USD/h), or
* owned: ``price.buy / (price.years * 8766 h)`` (straight-line depreciation over its
  life; 8766 = 365.25 x 24) + ``price.watts / 1000 * electricity`` (USD/kWh; the
  power while serving, taken as drawn the whole hour: an upper bound for idle time).

The room costs the sum over the devices that serve (the model host and every device
holding layers; guests only ask). Dollars per million useful tokens =
``room USD/h / (useful tokens per hour) * 1e6`` with useful tokens per second = answer
tokens delivered / the run's duration (``metrics["tokens"] / metrics["duration_s"]``).

:data:`MACHINES` is a small catalog of single complete machines people buy or rent to
run a model alone, each with its public list price, memory, bandwidth and power and
the source of each number; :func:`machines_that_hold` picks those that hold a model.

Units: USD, hours, watts, bytes, bytes/s, FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.deal import Deal, holds_layers
from planner.model import ModelSpec
from planner.privacy import TAIL_SUFFIX
from planner.room import DealOptions, Device, Price

HOURS_PER_YEAR = 8766.0  # 365.25 days x 24 h
#: Scenario default electricity price, USD per kWh: the US average residential price
#: for 2024, 16.48 cents/kWh (US EIA, Electric Power Monthly, table 5.3).
DEFAULT_ELECTRICITY_USD_PER_KWH = 0.1648


def usd_per_hour(price: Price, electricity_usd_per_kwh: float) -> float:
    """USD per hour of serving for ``price`` (module doc). Rent is taken as all-in (the
    provider pays the power). Raises ValueError when neither rent nor a purchase with a
    positive life is given."""
    if price.per_hour is not None:
        return price.per_hour
    if price.buy is None or not price.years or price.years <= 0:
        raise ValueError("a price needs per_hour, or buy with years > 0")
    return price.buy / (price.years * HOURS_PER_YEAR) + price.watts / 1000 * electricity_usd_per_kwh


def device_usd_per_hour(device: Device, electricity_usd_per_kwh: float) -> float | None:
    """USD per hour ``device`` costs while serving, or None when it has no price.

    ``Device.price`` wins; else ``Device.price_usd_per_h`` (rent, the older key)."""
    if device.price is not None:
        return usd_per_hour(device.price, electricity_usd_per_kwh)
    if device.price_usd_per_h is not None:
        return device.price_usd_per_h
    return None


@dataclass(frozen=True)
class TokenCost:
    """The cost of a room's useful tokens (see the module doc).

    Attributes:
        usd_per_million_tokens: USD per million useful tokens (None: nobody priced).
        room_usd_per_hour: sum over serving devices that have a price.
        useful_tokens_per_s: answer tokens delivered / run duration.
        per_device_usd_per_hour: serving device -> USD/h (None when unpriced).
        unpriced: serving devices without a price (counted as free).
    """

    usd_per_million_tokens: float | None
    room_usd_per_hour: float
    useful_tokens_per_s: float
    per_device_usd_per_hour: dict
    unpriced: tuple[str, ...]

    def to_json(self) -> dict:
        """Plain-JSON form (keys as the attributes)."""
        return {"usd_per_million_tokens": self.usd_per_million_tokens, "room_usd_per_hour": self.room_usd_per_hour,
                "useful_tokens_per_s": self.useful_tokens_per_s,
                "per_device_usd_per_hour": dict(self.per_device_usd_per_hour), "unpriced": list(self.unpriced)}


def token_cost(deal: Deal, devices: tuple[Device, ...] | list[Device], tokens: int, duration_s: float,
               electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH) -> TokenCost:
    """The cost of ``tokens`` useful tokens delivered in ``duration_s`` seconds by the
    serving devices of ``deal`` (host + stages). USD per million is None when no serving
    device has a price or nothing was delivered."""
    by_id = {d.id: d for d in devices}
    # a host's virtual tail device (privacy ends_local) is the host itself: not paid twice
    serving = [deal.host] + [s.device for s in deal.stages
                             if s.device != deal.host and not s.device.endswith(TAIL_SUFFIX)]
    per = {i: device_usd_per_hour(by_id[i], electricity_usd_per_kwh) for i in serving}
    unpriced = tuple(i for i in serving if per[i] is None)
    room = sum(v for v in per.values() if v is not None)
    rate = tokens / duration_s if duration_s > 0 else 0.0
    usd = None
    if len(unpriced) < len(serving) and rate > 0:
        usd = room / (rate * 3600) * 1e6
    return TokenCost(usd, room, rate, per, unpriced)


# --- a small catalog of single complete machines ------------------------------------------

@dataclass(frozen=True)
class Machine:
    """One complete machine that may run a model alone.

    Attributes:
        id, name: catalog id and human name.
        lends_bytes: memory a model may use (the GPU-visible share, see ``source``).
        memory_bandwidth_Bps, compute_flops: for the same roofline the simulator uses.
        price: list price (buy + life + watts) or rent.
        source: where each number comes from.
    """

    id: str
    name: str
    lends_bytes: int
    memory_bandwidth_Bps: float
    compute_flops: float
    price: Price
    source: str

    def device(self) -> Device:
        """This machine as a room's only device (a computer with WebGPU)."""
        return Device(id=self.id, name=self.name, kind="computer", lends_bytes=self.lends_bytes,
                      memory_bandwidth_Bps=self.memory_bandwidth_Bps, compute_flops=self.compute_flops,
                      price=self.price)


GB = 10**9
#: Life of a bought machine: 3 years (the issue's example; a common depreciation period).
_LIFE = 3.0
MACHINES: tuple[Machine, ...] = (
    Machine("framework-desktop-128", "Framework Desktop, Ryzen AI Max+ 395, 128 GB", 96 * GB, 256e9, 59e12,
            Price(buy=1999.0, years=_LIFE, watts=120.0),
            "Framework list price USD 1,999 for the 128 GB configuration (frame.work, 2025); 256 GB/s "
            "LPDDR5X-8000 (AMD); up to 96 GB assignable to the GPU (AMD Variable Graphics Memory); 120 W "
            "configurable TDP (AMD); about 59 TFLOPS f16 (40 RDNA 3.5 CUs at 2.9 GHz; derived, assumed)"),
    Machine("dgx-spark", "NVIDIA DGX Spark (GB10), 128 GB", 119 * GB, 273e9, 100e12,
            Price(buy=3999.0, years=_LIFE, watts=140.0),
            "NVIDIA DGX Spark Founders Edition list price USD 3,999 (NVIDIA, Oct 2025); 128 GB LPDDR5x at "
            "273 GB/s and GB10 140 W TDP (NVIDIA product page / Hot Chips 2025); about 9 GB kept by the OS "
            "(assumed); 100 TFLOPS f16 dense as in scenarios/gb10_m5.yaml (assumed)"),
    Machine("mac-studio-m3-ultra-96", "Apple Mac Studio, M3 Ultra, 96 GB", 72 * GB, 819e9, 28e12,
            Price(buy=3999.0, years=_LIFE, watts=270.0),
            "Apple US list price USD 3,999 (Mac Studio M3 Ultra 96 GB, March 2025); 819 GB/s (Apple); "
            "GPU may wire about 75% of memory by default (macOS; assumed); 270 W under load and 28 TFLOPS "
            "f16 (assumed, not published by Apple)"),
    Machine("mac-studio-m3-ultra-512", "Apple Mac Studio, M3 Ultra, 512 GB", 480 * GB, 819e9, 28e12,
            Price(buy=9499.0, years=_LIFE, watts=270.0),
            "Apple US list price USD 9,499 (M3 Ultra 32-core CPU / 80-core GPU, 512 GB, March 2025); "
            "819 GB/s (Apple); GPU wired limit raised to about 480 GB (sysctl iogpu.wired_limit_mb; "
            "assumed); power and compute as the 96 GB model (assumed)"),
    Machine("h100-80-rent", "One NVIDIA H100 80 GB, rented", 80 * GB, 3.35e12, 989e12,
            Price(per_hour=3.0),
            "H100 SXM 80 GB: 3.35 TB/s HBM3, 989 TFLOPS dense BF16 (NVIDIA H100 datasheet); about "
            "USD 3 per hour on demand for one GPU (typical cloud price in 2025-2026; assumed)"),
)


def machines_that_hold(model: ModelSpec, options: DealOptions) -> list[Machine]:
    """Catalog machines that hold the whole ``model`` alone at ``options``' context, KV
    precision and headroom (as the model host: embedding, head and draft included)."""
    return [m for m in MACHINES if holds_layers(m.device(), model, options, True, 0) >= model.layers]
