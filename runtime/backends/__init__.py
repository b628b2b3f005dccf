"""Compute backends. Each offers a :class:`runtime.backends.base.Stage` over a layer range.

* ``numpy`` (:mod:`runtime.backends.numpy_backend`): the float32 reference.
* ``wgpu`` (:mod:`runtime.backends.wgpu_backend`): WGSL compute shaders through the ``wgpu``
  package (Vulkan: Mesa lavapipe on CPUs, vendor drivers on GPUs). It computes every
  architecture the numpy backend does (Llama, Mistral's window, Qwen2 biases, Qwen3 q/k norms,
  RoPE scaling from the numpy backend's tables, tied or untied heads); :func:`wgpu_unsupported`
  names what it lacks (odd widths), and :func:`make_stage` refuses it.

Use :func:`make_stage` to build either by name.
"""

from __future__ import annotations

from pathlib import Path

from .base import Stage, StageSpec

BACKENDS = ("numpy", "wgpu")


def wgpu_unsupported(cfg) -> list[str]:
    """The features of ``cfg`` (a :class:`runtime.config.ModelConfig`) the wgpu backend does
    not compute, in words; empty when it runs the model. Its kernels (runtime/backends/wgsl.py)
    compute q/k/v and output biases, q/k norms, a sliding window, any attention width and RoPE
    scaling (the numpy backend's tables), and need widths that are multiples of 4."""
    out = []
    odd = [f"{k} {v}" for k, v in (("hidden", cfg.hidden), ("ffn", cfg.ffn), ("vocab", cfg.vocab), ("head_dim", cfg.head_dim)) if v % 4]
    if odd:
        out.append("widths not a multiple of 4 (" + ", ".join(odd) + ")")
    return out


def make_stage(
    backend: str,
    model_dir: Path | str,
    spec: StageSpec,
    max_ctx: int = 2048,
    precision=None,
    weights: dict | None = None,
    **kwargs,
) -> Stage:
    """Build a stage of ``backend`` (``"numpy"`` or ``"wgpu"``) reading only ``spec``'s tensors.

    ``weights``: the range's tensors already in memory (``{hf_name: float32 array}`` as
    :func:`runtime.weights.load_range` returns them, or with ``precision.weights == "gguf"``
    float32 arrays and :class:`runtime.gguf_blocks.QTensor` blocks as
    :func:`runtime.weights.load_range_native` does, e.g. put together from a peer's copy
    and this device's disk); then only ``model_dir``'s config is read.

    Raises:
        ValueError: unknown backend or layer range.
        UnsupportedModel: the backend does not compute a feature of the model (one line naming it).
        PrecisionError (a ValueError): a precision the backend does not implement.

    ``precision`` (:class:`runtime.precision.Precision`, default float32) chooses how weights
    and the KV cache are stored; a backend that lacks the choice refuses it before loading.
    """
    from ..config import ModelConfig, UnsupportedModel
    from ..precision import FLOAT32, check_backend

    precision = precision or FLOAT32
    if backend in BACKENDS:
        check_backend(backend, precision)
    if not precision.is_reference and backend in ("numpy", "wgpu"):
        kwargs["precision"] = precision
    from ..weights import load_range, load_range_native

    cfg = ModelConfig.load(model_dir)
    if backend == "wgpu" and wgpu_unsupported(cfg):
        raise UnsupportedModel(f"the wgpu backend does not compute {'; '.join(wgpu_unsupported(cfg))} "
                               f"of {cfg.name or cfg.arch}; use --backend numpy")
    if weights is None:
        load = load_range_native if precision.weights == "gguf" else load_range
        weights = load(model_dir, spec.start, spec.end, with_embedding=spec.host, with_head=spec.host)
    if backend == "numpy":
        from .numpy_backend import NumpyStage

        return NumpyStage(cfg, spec, weights, max_ctx=max_ctx, **kwargs)
    if backend == "wgpu":
        from .wgpu_backend import WgpuStage

        return WgpuStage(cfg, spec, weights, max_ctx=max_ctx, **kwargs)
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Stage", "StageSpec", "make_stage", "wgpu_unsupported"]
