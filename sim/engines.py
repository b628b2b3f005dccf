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
    # llama.cpp PR #15802 (JohannesGaessler, 2025-09), RTX 3090 (936 GB/s, NVIDIA's
    # figure), llama 8B Q4_0 (4.33 GiB = 4.649e9 B, as llama-bench reports it) at a
    # microbatch of 1 (one token per pass: decode): 155.02 tok/s
    # -> 4.649e9 x 155.02 / 936e9 = 0.770
    "llama.cpp-cuda": Engine("llama.cpp-cuda", 0.770,
                             source="llama.cpp PR #15802: RTX 3090, llama 8B Q4_0, ubatch 1, 155.02 tok/s of 936 GB/s"),
    # vLLM 0.23.0, one request at a time (a concurrency sweep by J. Musgrave,
    # johnmusgrave.com "vLLM throughput-latency sweep on NVIDIA A100"): A100 40GB
    # (1555 GB/s), Llama-3.1-8B-Instruct BF16 (8.03e9 x 2 = 16.06e9 B), 1024-token
    # prompts: about 75 tok/s -> 16.06e9 x 75 / 1555e9 = 0.775 (the post says 77%)
    "vllm": Engine("vllm", 0.775,
                   source="vLLM 0.23 sweep (johnmusgrave.com): A100 40GB, Llama-3.1-8B BF16, concurrency 1, ~75 tok/s"),
    # Hugging Face transformers eager generate() in float16, bitsandbytes issue #347
    # (frankxyy, 2023-04-26): RTX 3090 (936 GB/s), LLaMA 7B (6.74e9 x 2 = 13.48e9 B):
    # 32.89 ms a token -> 13.48e9 / 0.03289 / 936e9 = 0.438 (the rest is Python,
    # kernel launches and an un-fused attention; not split into overheads: one figure)
    "hf-eager": Engine("hf-eager", 0.438,
                       source="bitsandbytes issue #347: RTX 3090, LLaMA 7B fp16 in transformers, 32.89 ms/token"),
    # bitsandbytes LLM.int8() in transformers, the same issue and machine: 154.55 ms a
    # token for int8 weights (6.74e9 B) -> 6.74e9 / 0.15455 / 936e9 = 0.0466
    "bnb-int8": Engine("bnb-int8", 0.0466,
                       source="bitsandbytes issue #347: RTX 3090, LLaMA 7B LLM.int8(), 154.55 ms/token"),
    # bitsandbytes NF4 (4 bits + an fp32 absmax per 64 = 4.5 bits a weight):
    # bitsandbytes issue #611 (vince62s, 2023-11-22) decodes Mistral-7B at 36.5 tok/s in
    # NF4 and 48.6 in FP16 on one GPU; with FP16 at hf-eager's 0.438 of the bandwidth,
    # NF4 reads 4.5/16 of the bytes in 48.6/36.5 of the time:
    # 0.438 x (4.5/16) x (36.5/48.6) = 0.0925 (assumes issue #611's FP16 runs at hf-eager's efficiency)
    "bnb-nf4": Engine("bnb-nf4", 0.0925,
                      source="bitsandbytes issue #611: NF4 36.5 vs FP16 48.6 tok/s, Mistral-7B; FP16 at hf-eager's 0.438"),
    # MLX (mlx-lm), mlx-examples PR #1069 (awni, 2024-10-24): M2 Ultra (800 GB/s),
    # Llama 3.1 70B in 16-bit (70.6e9 x 2 = 141.1e9 B), weights wired: 4.7 tok/s
    # -> 141.1e9 x 4.7 / 800e9 = 0.829
    "mlx": Engine("mlx", 0.829, source="mlx-examples PR #1069: M2 Ultra, Llama 3.1 70B 16-bit wired, 4.7 tok/s"),
    # WebGPU in a browser (WebLLM): Ruan et al., "WebLLM" (arXiv 2412.15803) retain "up
    # to 80%" of native MLC-LLM on the same device; native MLC-LLM, mlc-ai/llm-perf-bench
    # README: RTX 4090 (1008 GB/s), Llama2-7B q4f16_1 (4 bits + an f16 scale per 32 =
    # 4.5 bits: 6.74e9 x 4.5 / 8 = 3.79e9 B): 204.8 tok/s -> 3.79e9 x 204.8 / 1008e9
    # = 0.770; x 0.8 = 0.616 (an upper bound: "up to")
    "webgpu-browser": Engine("webgpu-browser", 0.616,
                             source="WebLLM (arXiv 2412.15803) up to 80% of MLC-LLM; MLC-LLM RTX 4090 Llama2-7B "
                                    "q4f16_1 204.8 tok/s (llm-perf-bench)"),
}


def engine(name: str) -> Engine:
    """The preset called ``name``. Raises KeyError naming the known presets."""
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}") from None
