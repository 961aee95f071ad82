"""The one rasterization call Odin uses: gsplat 1.4.0's `rasterization` on CUDA, the pure-torch rasterizer on CPU.

Why: the runtime and its tests must train the same model with or without a GPU. The signature, defaults, shapes
and returned `(render, alpha, info)` are gsplat's, so callers (nerfstudio's splatfacto, gsplat's strategies) do
not know which backend ran. CPU tensors never reach gsplat's CUDA entry points; options the CPU backend lacks
raise a ValueError that says what to use instead.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor
from typing_extensions import Literal

from odin_nerfstudio.adapter.gsplat import _quat_scale_to_covar_preci, fully_fused_projection
from odin_nerfstudio.rendering import cpu_rasterizer
from odin_nerfstudio.core.camera import Camera


def rasterization(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [(C,) N, D] or [(C,) N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: Optional[int] = None,
    packed: bool = True,
    tile_size: int = 16,
    backgrounds: Optional[Tensor] = None,
    render_mode: Literal["RGB", "D", "ED", "RGB+D", "RGB+ED"] = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    rasterize_mode: Literal["classic", "antialiased"] = "classic",
    channel_chunk: int = 32,
    distributed: bool = False,
    camera_model: Literal["pinhole", "ortho", "fisheye"] = "pinhole",
    covars: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Dict]:
    """Rasterize N Gaussians into C cameras with gsplat 1.4.0's call; see `gsplat.rendering.rasterization`.

    CUDA tensors go to gsplat unchanged. CPU tensors go to `odin_nerfstudio.rendering.cpu_rasterizer.rasterization`, which
    supports the non-packed pinhole path: pass `packed=False`; `distributed` and other camera models raise.
    `sparse_grad` only acts with `packed=True` in gsplat and `channel_chunk` only bounds gsplat's kernel size, so
    on CPU both change nothing.

    Args:
        means [N, 3], quats [N, 4], scales [N, 3], opacities [N], colors [(C,) N, D] or SH [(C,) N, K, 3],
        viewmats [C, 4, 4], Ks [C, 3, 3], backgrounds [C, D], covars [N, 3, 3]; the rest as gsplat.

    Returns:
        render [C, H, W, X], alpha [C, H, W, 1], info (gsplat's meta dict).
    """
    tensors = {
        "means": means,
        "quats": quats,
        "scales": scales,
        "opacities": opacities,
        "colors": colors,
        "viewmats": viewmats,
        "Ks": Ks,
        "backgrounds": backgrounds,
        "covars": covars,
    }
    devices = {name: t.device.type for name, t in tensors.items() if t is not None}
    kinds = set(devices.values())
    if len(kinds) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")
    kind = kinds.pop()
    if kind == "cuda":
        from gsplat.rendering import rasterization as gsplat_rasterization

        return gsplat_rasterization(
            means,
            quats,
            scales,
            opacities,
            colors,
            viewmats,
            Ks,
            width,
            height,
            near_plane=near_plane,
            far_plane=far_plane,
            radius_clip=radius_clip,
            eps2d=eps2d,
            sh_degree=sh_degree,
            packed=packed,
            tile_size=tile_size,
            backgrounds=backgrounds,
            render_mode=render_mode,
            sparse_grad=sparse_grad,
            absgrad=absgrad,
            rasterize_mode=rasterize_mode,
            channel_chunk=channel_chunk,
            distributed=distributed,
            camera_model=camera_model,
            covars=covars,
        )
    if kind != "cpu":
        raise ValueError(f"rasterization runs on CUDA (gsplat) or CPU (pure torch), got device type {kind!r}")
    if packed:
        raise ValueError(
            "packed=True is not supported on CPU: pass packed=False (info then holds [C, N] tensors, "
            "as splatfacto and gsplat's DefaultStrategy with packed=False expect)"
        )
    if distributed:
        raise ValueError(
            "distributed=True needs gsplat's CUDA backend: on CPU render each rank's cameras with "
            "distributed=False (Odin synchronizes the Gaussians itself)"
        )
    if camera_model != "pinhole":
        raise ValueError(f"camera_model={camera_model!r} is not supported on CPU: use 'pinhole', or CUDA tensors")
    return cpu_rasterizer.rasterization(
        means,
        quats,
        scales,
        opacities,
        colors,
        viewmats,
        Ks,
        width,
        height,
        near_plane=near_plane,
        far_plane=far_plane,
        radius_clip=radius_clip,
        eps2d=eps2d,
        sh_degree=sh_degree,
        tile_size=tile_size,
        backgrounds=backgrounds,
        render_mode=render_mode,
        absgrad=absgrad,
        rasterize_mode=rasterize_mode,
        covars=covars,
    )


def projected_radii(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
) -> Tensor:
    """Screen radii [C, N] int32 the rasterizer would give each Gaussian (0: culled), without compositing.

    The same projection and culling as `rasterization`, on the same backend (gsplat's kernel on CUDA, the
    pure-torch one on CPU): the rows with radii > 0 are exactly those a render would make active. Odin uses it
    to check that a task's active set did not escape its candidate set.
    """
    if means.is_cuda:
        radii, *_ = fully_fused_projection(
            means,
            None,
            quats,
            scales,
            viewmats,
            Ks,
            width,
            height,
            eps2d=eps2d,
            near_plane=near_plane,
            far_plane=far_plane,
            radius_clip=radius_clip,
            packed=False,
        )
        return radii
    if means.device.type != "cpu":
        raise ValueError(f"projected_radii runs on CPU or CUDA tensors, got {means.device}")
    covars, _ = _quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    radii, *_ = cpu_rasterizer.project(
        means, covars, viewmats, Ks, width, height, near_plane, far_plane, radius_clip, eps2d, False
    )
    return radii


DRAWN_ROWS_READS = ("means", "quats", "scales")
"""The parameters :func:`drawn_rows` reads (a Gaussian's geometry)."""


def drawn_rows(camera: Camera, rows: Dict[str, Tensor], eps2d: float = 0.3, near_plane: float = 0.01) -> Tensor:
    """Which Gaussian rows (gsplat's layout: means [M, 3], quats [M, 4], log-scales [M, 3]) `camera` draws, bool [M].

    Each row is decided on its own by `projected_radii` (no compositing), so any subset of rows may be asked.
    """
    radii = projected_radii(
        rows["means"],
        rows["quats"],
        torch.exp(rows["scales"]),
        camera.viewmat[None],
        camera.K[None],
        camera.width,
        camera.height,
        near_plane=near_plane,
        eps2d=eps2d,
    )
    return radii[0] > 0
