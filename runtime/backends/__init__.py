"""Compute backends. Each offers a :class:`runtime.backends.base.Stage` over a layer range.

* ``numpy`` (:mod:`runtime.backends.numpy_backend`): the float32 reference.
* ``wgpu`` (:mod:`runtime.backends.wgpu_backend`): WGSL compute shaders through the ``wgpu``
  package (Vulkan: Mesa lavapipe on CPUs, vendor drivers on GPUs).

Use :func:`make_stage` to build either by name.
"""

from __future__ import annotations

from pathlib import Path

from .base import Stage, StageSpec

BACKENDS = ("numpy", "wgpu")


def make_stage(
    backend: str,
    model_dir: Path | str,
    spec: StageSpec,
    max_ctx: int = 2048,
    **kwargs,
) -> Stage:
    """Build a stage of ``backend`` (``"numpy"`` or ``"wgpu"``) reading only ``spec``'s tensors.

    Raises:
        ValueError: unknown backend or layer range.
    """
    from ..config import ModelConfig
    from ..weights import load_range

    cfg = ModelConfig.load(model_dir)
    weights = load_range(model_dir, spec.start, spec.end, with_embedding=spec.host, with_head=spec.host)
    if backend == "numpy":
        from .numpy_backend import NumpyStage

        return NumpyStage(cfg, spec, weights, max_ctx=max_ctx, **kwargs)
    if backend == "wgpu":
        from .wgpu_backend import WgpuStage

        return WgpuStage(cfg, spec, weights, max_ctx=max_ctx, **kwargs)
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Stage", "StageSpec", "make_stage"]
