"""Pure-torch, differentiable CPU rasterizer with the semantics of gsplat 1.4.0's `rasterization`.

Why: Odin's runtime, its tests and CI run on machines without a GPU, yet must train the same model that gsplat's
CUDA kernels train. This module reproduces gsplat's non-packed, pinhole path with torch ops only, so autograd
gives the backward pass and the `info` dict feeds gsplat's strategies unchanged.

What it reproduces (from gsplat's CUDA kernels, not only from its pure-torch reference module):
- projection: gsplat's `_quat_scale_to_covar_preci`, `_world_to_cam` and `_persp_proj` (EWA Jacobian with the
  field-of-view clamp), then the kernel's own last step: `eps2d` blur, antialiased compensation
  `sqrt(det / det_blur)`, radius `ceil(3 sqrt(lambda_max))`, culling of `z < near_plane`, `z > far_plane`,
  `det <= 0`, `radius <= radius_clip` and of Gaussians whose radius box misses the image;
- tile binning: a Gaussian is seen by the pixels of the tiles its radius box touches (gsplat's `isect_tiles`),
  in increasing depth, ties broken by Gaussian index (gsplat's stable radix sort);
- compositing per pixel (centre at `+0.5`): `alpha = min(0.999, opacity * exp(-sigma))`, skipped when
  `sigma < 0` or `alpha < 1/255`; compositing stops before the first Gaussian with `T * (1 - alpha) <= 1e-4`;
  `render = sum(alpha * T * color) + T_final * background`, `alpha_out = 1 - T_final`;
- absgrad: the sum over pixels of |d loss / d means2d| of each pixel's term, as the CUDA backward accumulates it.

How it stays fast without a kernel: the (pixel, Gaussian) pairs that can matter are enumerated per Gaussian from
its tile box intersected with the box of its `alpha >= 1/255` ellipse (a conservative bound; the exact test then
runs on each pair), front to back in chunks that skip pixels which have already stopped, sorted by pixel, and
composited with a segmented cumulative sum of `log(1 - alpha)` in float64. Only the pairs that gsplat composites
enter the autograd graph, so memory grows with them (about 250 bytes per composited pair with its backward).

Where it differs from gsplat, knowingly: float rounding (gsplat runs float32 with the fast `__expf`, so a pair
right at the `1/255` or `1e-4` thresholds may be decided differently; compositing here is float64 along each
pixel); culled entries of means2d / depths / conics hold their projected values, where gsplat leaves them
uninitialized; `info` has no tile-intersection buffers ("isect_ids", "flatten_ids", "isect_offsets").
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from typing_extensions import Literal

from odin_nerfstudio.adapter.gsplat import _persp_proj, _quat_scale_to_covar_preci, _spherical_harmonics, _world_to_cam

RENDER_MODES = ("RGB", "D", "ED", "RGB+D", "RGB+ED")
RASTERIZE_MODES = ("classic", "antialiased")
ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.999
TRANSMITTANCE_MIN = 1e-4
CHUNK_PAIRS = 1 << 20


def rasterization(
    means: Tensor,
    quats: Optional[Tensor],
    scales: Optional[Tensor],
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: Optional[int] = None,
    tile_size: int = 16,
    backgrounds: Optional[Tensor] = None,
    render_mode: Literal["RGB", "D", "ED", "RGB+D", "RGB+ED"] = "RGB",
    absgrad: bool = False,
    rasterize_mode: Literal["classic", "antialiased"] = "classic",
    covars: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Dict]:
    """Render N Gaussians into C pinhole cameras on the CPU, as gsplat's `rasterization(packed=False)`.

    Args:
        means: Gaussian centres. [N, 3]
        quats: Rotations, wxyz, not necessarily normalized. [N, 4] (ignored when `covars` is given)
        scales: Scales. [N, 3] (ignored when `covars` is given)
        opacities: Opacities in [0, 1]. [N]
        colors: Post-activation features [(C,) N, D], or SH coefficients [(C,) N, K, 3] when `sh_degree` is set.
        viewmats: World-to-camera transforms. [C, 4, 4]
        Ks: Pinhole intrinsics. [C, 3, 3]
        width, height: Image size in pixels.
        near_plane, far_plane: Depth range kept (camera z).
        radius_clip: Gaussians with a pixel radius <= this are culled.
        eps2d: Blur added to the projected 2D covariance.
        sh_degree: SH degree to evaluate; None when `colors` are features.
        tile_size: Tile side in pixels (decides which pixels may see a Gaussian, as in gsplat).
        backgrounds: Background colors. [C, D]
        render_mode: "RGB", "D", "ED", "RGB+D" or "RGB+ED".
        absgrad: Attach `info["means2d"].absgrad` [C, N, 2] during backward.
        rasterize_mode: "classic", or "antialiased" (opacities times the compensation factor).
        covars: Optional world covariances; only their upper triangle is read, as gsplat does. [N, 3, 3]

    Returns:
        render [C, H, W, X] (X = D, 1 or D + 1 by `render_mode`), alpha [C, H, W, 1], and `info` with gsplat's
        non-packed keys: "radii" [C, N] int32, "means2d" [C, N, 2], "depths" [C, N], "conics" [C, N, 3],
        "opacities" [C, N], "camera_ids" None, "gaussian_ids" None, "tile_width", "tile_height",
        "tiles_per_gauss" [C, N] int32, "width", "height", "tile_size", "n_cameras".
    """
    C = viewmats.shape[0]
    _check_inputs(
        means,
        quats,
        scales,
        opacities,
        colors,
        viewmats,
        Ks,
        sh_degree,
        backgrounds,
        render_mode,
        rasterize_mode,
        covars,
        width,
        height,
        tile_size,
    )
    if covars is None:
        covars, _ = _quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    else:
        covars = covars.triu() + covars.triu(1).transpose(-1, -2)
    radii, means2d, depths, conics, compensations, covars2d = project(
        means,
        covars,
        viewmats,
        Ks,
        width,
        height,
        near_plane,
        far_plane,
        radius_clip,
        eps2d,
        rasterize_mode == "antialiased",
    )
    opacities = opacities.repeat(C, 1)
    if compensations is not None:
        opacities = opacities * compensations

    if sh_degree is None:
        features = colors.expand(C, -1, -1)
    else:
        camtoworlds = torch.inverse(viewmats)
        dirs = means[None, :, :] - camtoworlds[:, None, :3, 3]
        features = _spherical_harmonics(sh_degree, dirs, colors.expand(C, -1, -1, -1))
        features = torch.clamp_min(features + 0.5, 0.0)
    if render_mode in ("RGB+D", "RGB+ED"):
        features = torch.cat((features, depths[..., None]), dim=-1)
        if backgrounds is not None:
            backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(C, 1)], dim=-1)
    elif render_mode in ("D", "ED"):
        features = depths[..., None]
        if backgrounds is not None:
            backgrounds = backgrounds.new_zeros(C, 1)

    tile_width, tile_height = math.ceil(width / tile_size), math.ceil(height / tile_size)
    tile_lo, tile_hi = tile_box(means2d, radii, tile_size, tile_width, tile_height)
    gaussian_ids, pixel_ids = composited_pairs(
        means2d, conics, covars2d, opacities, depths, radii, tile_lo, tile_hi, width, height, tile_size
    )
    render, alpha = composite(
        means2d, conics, opacities, features, gaussian_ids, pixel_ids, width, height, backgrounds, absgrad
    )
    if render_mode in ("ED", "RGB+ED"):
        render = torch.cat([render[..., :-1], render[..., -1:] / alpha.clamp(min=1e-10)], dim=-1)

    info = {
        "camera_ids": None,
        "gaussian_ids": None,
        "radii": radii,
        "means2d": means2d,
        "depths": depths,
        "conics": conics,
        "opacities": opacities,
        "tile_width": tile_width,
        "tile_height": tile_height,
        "tiles_per_gauss": ((tile_hi - tile_lo).prod(dim=-1) * (radii > 0)).int(),
        "width": width,
        "height": height,
        "tile_size": tile_size,
        "n_cameras": C,
    }
    return render, alpha, info


def project(
    means: Tensor,
    covars: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    eps2d: float,
    calc_compensations: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor], Tensor]:
    """Project 3D Gaussians into C pinhole cameras as gsplat's `fully_fused_projection` kernel does.

    Differs from gsplat's `_fully_fused_projection` reference where that one differs from the kernel: it honours
    `radius_clip`, culls `det <= 0` instead of clamping it, and keeps culled entries finite (behind-camera
    Gaussians are projected from a dummy point) so that their zero gradients stay zero.

    Args:
        means: [N, 3]; covars: [N, 3, 3]; viewmats: [C, 4, 4]; Ks: [C, 3, 3].

    Returns:
        radii [C, N] int32 (0 = culled), means2d [C, N, 2], depths [C, N], conics [C, N, 3] (upper triangle of
        the inverse blurred covariance), compensations [C, N] or None, blurred 2D covariances [C, N, 2, 2]
        (detached).
    """
    means_c, covars_c = _world_to_cam(means, covars, viewmats)
    depths = means_c[..., 2]
    in_range = (depths >= near_plane) & (depths <= far_plane)
    safe_point = torch.tensor([0.0, 0.0, 1.0], dtype=means.dtype)
    means_c = torch.where(in_range[..., None], means_c, safe_point)
    means2d, covars2d = _persp_proj(means_c, covars_c, Ks, width, height)

    det_orig = covars2d[..., 0, 0] * covars2d[..., 1, 1] - covars2d[..., 0, 1] * covars2d[..., 1, 0]
    covars2d = covars2d + torch.eye(2, dtype=means.dtype) * eps2d
    det = covars2d[..., 0, 0] * covars2d[..., 1, 1] - covars2d[..., 0, 1] * covars2d[..., 1, 0]
    valid = in_range & (det > 0)
    det = torch.where(valid, det, torch.ones_like(det))
    compensations = torch.sqrt(torch.clamp(det_orig / det, min=0.0)) if calc_compensations else None
    conics = torch.stack(
        [
            covars2d[..., 1, 1] / det,
            -(covars2d[..., 0, 1] + covars2d[..., 1, 0]) / 2.0 / det,
            covars2d[..., 0, 0] / det,
        ],
        dim=-1,
    )

    with torch.no_grad():
        b = (covars2d[..., 0, 0] + covars2d[..., 1, 1]) / 2
        radius = torch.ceil(3.0 * torch.sqrt(b + torch.sqrt(torch.clamp(b**2 - det, min=0.01))))
        x, y = means2d[..., 0], means2d[..., 1]
        inside = (x + radius > 0) & (x - radius < width) & (y + radius > 0) & (y - radius < height)
        keep = valid & (radius > radius_clip) & inside
        radii = torch.where(keep, radius, torch.zeros_like(radius)).int()
    return radii, means2d, depths, conics, compensations, covars2d.detach()


@torch.no_grad()
def tile_box(
    means2d: Tensor, radii: Tensor, tile_size: int, tile_width: int, tile_height: int
) -> Tuple[Tensor, Tensor]:
    """Tile range [lo, hi) that each Gaussian's radius box touches, as gsplat's `isect_tiles`.

    Args:
        means2d: [C, N, 2]; radii: [C, N].

    Returns:
        lo, hi: [C, N, 2] int64 tile coordinates (x, y), clamped to the tile grid.
    """
    limit = torch.tensor([tile_width, tile_height])
    tile_xy = means2d / tile_size
    tile_radius = (radii.to(means2d.dtype) / tile_size)[..., None]
    lo = torch.floor(tile_xy - tile_radius).long().clamp(min=0).minimum(limit)
    hi = torch.ceil(tile_xy + tile_radius).long().clamp(min=0).minimum(limit)
    return lo, hi


@torch.no_grad()
def composited_pairs(
    means2d: Tensor,
    conics: Tensor,
    covars2d: Tensor,
    opacities: Tensor,
    depths: Tensor,
    radii: Tensor,
    tile_lo: Tensor,
    tile_hi: Tensor,
    width: int,
    height: int,
    tile_size: int,
    chunk_pairs: int = CHUNK_PAIRS,
) -> Tuple[Tensor, Tensor]:
    """The (pixel, Gaussian) pairs that gsplat composites, sorted by pixel then front to back.

    Gaussians are visited front to back in chunks of about `chunk_pairs` candidate pairs; pixels whose
    compositing has stopped drop out of later chunks, which bounds memory when large Gaussians pile up.

    Args:
        means2d: [C, N, 2]; conics: [C, N, 3]; covars2d: [C, N, 2, 2]; opacities: [C, N]; depths: [C, N];
        radii: [C, N]; tile_lo, tile_hi: [C, N, 2].

    Returns:
        gaussian_ids [M] (flat index c * N + n) and pixel_ids [M] (flat index (c * H + y) * W + x).
    """
    C, N = radii.shape
    order = torch.argsort(depths, dim=1, stable=True) + torch.arange(C)[:, None] * N
    ids = order.reshape(-1)
    ids = ids[radii.reshape(-1)[ids] > 0]
    camera = ids // N
    mean = means2d.reshape(-1, 2)[ids]
    opacity = opacities.reshape(-1)[ids]

    # Pixel box: the Gaussian's tiles cut down to the box (with a rounding margin) of its alpha >= 1/255
    # ellipse, d^T conic d = 2 sigma <= 2 log(255 opacity).
    sigma_max = torch.log(torch.clamp(opacity, min=1e-30) / ALPHA_MIN).clamp(min=0.0)
    variance = torch.diagonal(covars2d.reshape(-1, 2, 2)[ids], dim1=-2, dim2=-1)
    extent = torch.sqrt(2.0 * sigma_max[:, None] * variance) * 1.001 + 0.01
    extent = torch.where(torch.isfinite(extent) & (variance > 0), extent, torch.full_like(extent, float("inf")))
    size = torch.tensor([width, height])
    box_lo = torch.maximum(
        tile_lo.reshape(-1, 2)[ids] * tile_size, torch.floor(mean - 0.5 - extent).clamp(-1, max(width, height)).long()
    )
    box_hi = torch.minimum(
        torch.minimum(tile_hi.reshape(-1, 2)[ids] * tile_size, size) - 1,
        torch.ceil(mean - 0.5 + extent).clamp(-1, max(width, height)).long(),
    )
    box_size = (box_hi - box_lo + 1).clamp(min=0)
    counts = box_size[:, 0] * box_size[:, 1]
    # One row per Gaussian: pixel-centre offset from its box corner, conic, opacity, box width, first pixel id.
    table = torch.cat(
        [
            mean - box_lo.to(mean.dtype) - 0.5,
            conics.reshape(-1, 3)[ids],
            opacity[:, None],
            box_size[:, :1].to(mean.dtype),
        ],
        1,
    )
    first_pixel = (camera * height + box_lo[:, 1]) * width + box_lo[:, 0]

    # Front to back in chunks; boxes whose pixels have all stopped are skipped, as gsplat's tiles stop early.
    log_t_pixel = torch.zeros(C * height * width, dtype=torch.float64)
    stopped = torch.zeros(C * height * width, dtype=torch.bool)
    kept_ids, kept_pixels = [], []
    for lo, hi in _chunks(counts, chunk_pairs):
        running = _box_sums(
            (~stopped).view(C, height, width), camera[lo:hi], box_lo[lo:hi], box_lo[lo:hi] + box_size[lo:hi]
        )
        chunk_counts = torch.where(running > 0, counts[lo:hi], 0)
        owner, pixel_ids, alpha = _hits(table[lo:hi], first_pixel[lo:hi], chunk_counts, width)
        live = ~stopped[pixel_ids]
        pixel_ids, sort = torch.sort(pixel_ids[live], stable=True)
        owner, alpha = owner[live][sort], alpha[live][sort]
        log_t = torch.log1p(-alpha.double())
        log_t_after = torch.cumsum(log_t, 0)
        log_t_after = log_t_after - (log_t_after - log_t)[segment_starts(pixel_ids)] + log_t_pixel[pixel_ids]
        kept = log_t_after > math.log(TRANSMITTANCE_MIN)
        stopped[pixel_ids[~kept]] = True
        log_t_pixel.index_add_(0, pixel_ids[kept], log_t[kept])
        kept_ids.append(ids[lo + owner[kept]])
        kept_pixels.append(pixel_ids[kept])
    pixel_ids, sort = torch.sort(torch.cat(kept_pixels), stable=True)
    return torch.cat(kept_ids)[sort], pixel_ids


def _chunks(counts: Tensor, chunk_pairs: int) -> List[Tuple[int, int]]:
    """Consecutive ranges [lo, hi) of Gaussians holding about `chunk_pairs` candidate pairs each (at least one)."""
    ends = torch.cumsum(counts, 0)
    ranges, lo = [], 0
    while lo < len(counts) or not ranges:
        done = int(ends[lo - 1]) if lo > 0 else 0
        hi = max(int(torch.searchsorted(ends, done + chunk_pairs, right=True)), lo + 1)
        ranges.append((lo, min(hi, len(counts))))
        lo = hi
    return ranges


def _box_sums(mask: Tensor, camera: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """Number of set pixels of `mask` in each box [lo, hi) (x, y, clamped to the image) of its camera.

    Args:
        mask: [C, H, W] bool; camera: [G]; lo, hi: [G, 2].

    Returns:
        [G] int64 counts, from an integral image (exact only for non-empty boxes).
    """
    C, H, W = mask.shape
    integral = torch.zeros(C, H + 1, W + 1, dtype=torch.int64)
    integral[:, 1:, 1:] = mask.long().cumsum(1).cumsum(2)
    size = torch.tensor([W, H])
    lo, hi = lo.clamp(min=0).minimum(size), hi.clamp(min=0).minimum(size)
    x0, y0, x1, y1 = lo[:, 0], lo[:, 1], hi[:, 0], hi[:, 1]
    return integral[camera, y1, x1] - integral[camera, y0, x1] - integral[camera, y1, x0] + integral[camera, y0, x0]


def _hits(table: Tensor, first_pixel: Tensor, counts: Tensor, width: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Enumerate each Gaussian's pixel box row by row and keep the pairs with sigma >= 0 and alpha >= 1/255.

    Args:
        table: per Gaussian (offset_x, offset_y, conic_a, conic_b, conic_c, opacity, box_width). [G, 7]
        first_pixel: flat pixel id of each box's top-left pixel. [G]; counts: pixels per box. [G]

    Returns:
        owner [M] (row of `table`), pixel_ids [M], alpha [M], in Gaussian order.
    """
    owner = torch.repeat_interleave(torch.arange(len(counts)), counts)
    local = torch.arange(len(owner)) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    offset_x, offset_y, conic_a, conic_b, conic_c, opacity, box_w = table.index_select(0, owner).unbind(1)
    local = local.double()
    row = torch.floor((local + 0.5) / box_w.double())
    col = (local - row * box_w.double()).to(table.dtype)
    row = row.to(table.dtype)
    dx, dy = offset_x - col, offset_y - row
    sigma = 0.5 * (conic_a * dx * dx + conic_c * dy * dy) + conic_b * dx * dy
    alpha = torch.clamp_max(opacity * torch.exp(-sigma), ALPHA_MAX)
    hit = (sigma >= 0) & (alpha >= ALPHA_MIN)
    owner = owner[hit]
    pixel_ids = first_pixel[owner] + row[hit].long() * width + col[hit].long()
    return owner, pixel_ids, alpha[hit]


def segment_starts(keys: Tensor) -> Tensor:
    """For each entry of a sorted key array, the index of the first entry with the same key. [M] -> [M]"""
    index = torch.arange(len(keys))
    first = torch.ones_like(keys, dtype=torch.bool)
    first[1:] = keys[1:] != keys[:-1]
    return torch.cummax(torch.where(first, index, 0), 0).values


def composite(
    means2d: Tensor,
    conics: Tensor,
    opacities: Tensor,
    features: Tensor,
    gaussian_ids: Tensor,
    pixel_ids: Tensor,
    width: int,
    height: int,
    backgrounds: Optional[Tensor],
    absgrad: bool,
) -> Tuple[Tensor, Tensor]:
    """Differentiable front-to-back alpha compositing of the given (pixel, Gaussian) pairs.

    Args:
        means2d: [C, N, 2]; conics: [C, N, 3]; opacities: [C, N]; features: [C, N, D];
        gaussian_ids, pixel_ids: [M], sorted by pixel then front to back (see `composited_pairs`);
        backgrounds: [C, D] or None; absgrad: hook `means2d.absgrad` [C, N, 2] onto the backward pass.

    Returns:
        render [C, H, W, D] and alpha [C, H, W, 1].
    """
    C, N, D = features.shape
    pixel_centres = torch.stack([pixel_ids % width, pixel_ids // width % height], dim=-1).to(means2d.dtype) + 0.5
    delta = means2d.reshape(-1, 2).index_select(0, gaussian_ids) - pixel_centres
    if absgrad and delta.requires_grad:

        def store_absgrad(grad: Tensor) -> None:
            absolute = torch.zeros(C * N, 2, dtype=grad.dtype).index_add_(0, gaussian_ids, grad.abs())
            means2d.absgrad = absolute.reshape(C, N, 2)

        delta.register_hook(store_absgrad)
    conic = conics.reshape(-1, 3).index_select(0, gaussian_ids)
    dx, dy = delta[:, 0], delta[:, 1]
    sigma = 0.5 * (conic[:, 0] * dx * dx + conic[:, 2] * dy * dy) + conic[:, 1] * dx * dy
    alpha = torch.clamp_max(opacities.reshape(-1).index_select(0, gaussian_ids) * torch.exp(-sigma), ALPHA_MAX)

    log_t = torch.log1p(-alpha.double())
    log_t_before = torch.cumsum(log_t, 0) - log_t
    log_t_before = log_t_before - log_t_before.index_select(0, segment_starts(pixel_ids))
    weights = alpha * torch.exp(log_t_before).to(alpha.dtype)
    n_pixels = C * height * width
    render = torch.zeros(n_pixels, D, dtype=features.dtype).index_add(
        0, pixel_ids, weights[:, None] * features.reshape(-1, D).index_select(0, gaussian_ids)
    )
    t_final = torch.exp(torch.zeros(n_pixels, dtype=log_t.dtype).index_add(0, pixel_ids, log_t)).to(alpha.dtype)
    render = render.reshape(C, height, width, D)
    t_final = t_final.reshape(C, height, width, 1)
    if backgrounds is not None:
        render = render + t_final * backgrounds[:, None, None, :]
    return render, 1.0 - t_final


def _check_inputs(
    means: Tensor,
    quats: Optional[Tensor],
    scales: Optional[Tensor],
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    sh_degree: Optional[int],
    backgrounds: Optional[Tensor],
    render_mode: str,
    rasterize_mode: str,
    covars: Optional[Tensor],
    width: int,
    height: int,
    tile_size: int,
) -> None:
    """Raise ValueError, naming the argument, where gsplat would assert."""
    N, C = means.shape[0], viewmats.shape[0]

    def require(condition: bool, message: str) -> None:
        if not condition:
            raise ValueError(message)

    require(means.shape == (N, 3), f"means must be [N, 3], got {tuple(means.shape)}")
    if covars is None:
        require(quats is not None and quats.shape == (N, 4), f"quats must be [N, 4] = [{N}, 4]")
        require(scales is not None and scales.shape == (N, 3), f"scales must be [N, 3] = [{N}, 3]")
    else:
        require(covars.shape == (N, 3, 3), f"covars must be [N, 3, 3], got {tuple(covars.shape)}")
    require(opacities.shape == (N,), f"opacities must be [N] = [{N}], got {tuple(opacities.shape)}")
    require(viewmats.shape == (C, 4, 4), f"viewmats must be [C, 4, 4], got {tuple(viewmats.shape)}")
    require(Ks.shape == (C, 3, 3), f"Ks must be [C, 3, 3] = [{C}, 3, 3], got {tuple(Ks.shape)}")
    require(render_mode in RENDER_MODES, f"render_mode must be one of {RENDER_MODES}, got {render_mode!r}")
    require(rasterize_mode in RASTERIZE_MODES, f"rasterize_mode must be one of {RASTERIZE_MODES}")
    require(width > 0 and height > 0 and tile_size > 0, "width, height and tile_size must be positive")
    if sh_degree is None:
        require(
            (colors.dim() == 2 and colors.shape[0] == N) or (colors.dim() == 3 and colors.shape[:2] == (C, N)),
            f"colors must be [N, D] or [C, N, D] when sh_degree is None, got {tuple(colors.shape)}",
        )
    else:
        require(
            (colors.dim() == 3 and colors.shape[0] == N and colors.shape[2] == 3)
            or (colors.dim() == 4 and colors.shape[:2] == (C, N) and colors.shape[3] == 3),
            f"colors must be SH coefficients [N, K, 3] or [C, N, K, 3], got {tuple(colors.shape)}",
        )
        require(
            0 <= sh_degree <= 4 and (sh_degree + 1) ** 2 <= colors.shape[-2],
            f"sh_degree {sh_degree} needs (sh_degree + 1)^2 <= K = {colors.shape[-2]} and sh_degree <= 4",
        )
    if backgrounds is not None:
        channels = 3 if sh_degree is not None else colors.shape[-1]
        require(backgrounds.shape == (C, channels), f"backgrounds must be [C, D] = [{C}, {channels}]")
