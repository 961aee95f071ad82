"""Odin for nerfstudio: primitive-level synchronization for distributed 3D Gaussian Splatting.

The core modules (rasterizer, RLG, schedule, runtime) import no nerfstudio, so gsplat's own trainer can use
them; the nerfstudio integration lives in :mod:`odin_nerfstudio.ns` and :mod:`odin_nerfstudio.method_configs`.
"""

__version__ = "0.1.0"
