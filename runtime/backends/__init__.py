"""Compute backends. Each offers a :class:`runtime.backends.base.Stage` over a layer range.

* ``numpy`` (:mod:`runtime.backends.numpy_backend`): the float32 reference.
* ``wgpu`` (:mod:`runtime.backends.wgpu_backend`): WGSL compute shaders through the ``wgpu``
  package (Vulkan: Mesa lavapipe on CPUs, vendor drivers on GPUs).

Use :func:`make_stage` to build either by name.
"""

from __future__ import annotations

from .base import Stage, StageSpec, make_stage

BACKENDS = ("numpy", "wgpu")

__all__ = ["BACKENDS", "Stage", "StageSpec", "make_stage"]
