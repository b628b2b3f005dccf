"""Engine presets: how far below the roofline a named inference engine decodes.

A scenario device may say ``engine: NAME`` instead of guessing its speed; the cost
model (sim/devices.py) then runs the roofline over the preset's ``efficiency`` (the
fraction of the device's memory bandwidth the engine reaches on decode) and adds its
fixed seconds per pass and per layer. A calibration profile or a measured
``ms_per_layer`` wins over a preset. Each number below comes from a public
single-device benchmark, cited beside it; efficiency = tokens/s x bytes read per
token / the device's memory bandwidth.

Only engines with a published figure we could check are here; add one with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENGINES", "Engine", "engine"]


@dataclass(frozen=True)
class Engine:
    """``efficiency`` in (0, 1]: decode time = bytes / (bandwidth x efficiency);
    ``pass_overhead_s`` / ``layer_overhead_s``: fixed seconds per pass / per layer;
    ``source``: where the numbers come from."""

    name: str
    efficiency: float
    pass_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    source: str = ""


ENGINES: dict[str, Engine] = {
    "roofline": Engine("roofline", 1.0, source="no engine: the memory/compute roofline itself (an upper bound)"),
    # llama.cpp PR #2917 (ggerganov, 2023-08-30), Apple M2 Ultra (800 GB/s, Apple's
    # figure), LLaMA 7B Q8_0 (6.67 GiB = 7.16e9 B) tg128: 62.05 tok/s
    # -> 7.16e9 x 62.05 / 800e9 = 0.555
    "llama.cpp-metal": Engine("llama.cpp-metal", 0.555,
                              source="llama.cpp PR #2917: M2 Ultra, LLaMA 7B Q8_0, 62.05 tok/s of 800 GB/s"),
    # llama.cpp issue #34 (slaren, 2023-08-12), Intel i9-13900K with DDR5-6400 (two
    # channels: 102.4 GB/s), 7B, 128 tokens generated with 8 threads: 18.27 tok/s; the
    # file is not named there, taken as LLaMA 7B Q4_0 (3.56 GiB = 3.82e9 B, the size
    # llama-bench reports in PR #2917): 3.82e9 x 18.27 / 102.4e9 = 0.68 (an assumption)
    "llama.cpp-cpu": Engine("llama.cpp-cpu", 0.68,
                            source="llama.cpp issue #34: i9-13900K DDR5-6400, 7B (Q4_0 assumed), 18.27 tok/s"),
}


def engine(name: str) -> Engine:
    """The preset called ``name``. Raises KeyError naming the known presets."""
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}") from None
