"""Candidate set C(t): the primitives a task may read, found before it reads by frustum and bounding-sphere culling.

C(t) must be a conservative superset of what the rasterizer will see (the active set A(t)). It is culled against
:meth:`CullRegion.drawable` of the camera the task renders with (a provable bound of what gsplat's projection can
draw: radius box, EWA Jacobian with its field-of-view clamp, eps2d blur, the ceil), widened by ``margin`` of the
image size on every side (its near plane moved towards the camera by ``1 + margin`` times the radius below) so
that a row that moves a little after the read is already in C(t). Each Gaussian is bounded by the sphere of radius
``3 * max(scale)`` around its mean; it is a candidate unless its mean lies outside one of five half-spaces by more
than that radius times a factor: the near plane's, and for the four widened sides one of the row's own direction
(below). No far plane is used (conservative). Whether the superset held is checked after the fact by the runtime's
validation, never assumed.

Why not the sphere alone: gsplat's radius is ``ceil(3 sqrt(lambda_max))`` of the linearized 2D covariance, one
radius for a square box, and the Jacobian is taken at the mean's slopes x / z, y / z clamped to
``1.3 tan(fov / 2)`` (Lx, Ly). A Gaussian close to the camera and off a corner of the frustum reaches, along the
image's short side, about ``sqrt(1 + Lx^2 + Ly^2) / sqrt(1 + side^2)`` times its sphere (1.27 for a portrait
540x960 camera at f = 800): beyond the former fixed 1.1 radius factor, which let such rows escape C(t)
(``docs/architecture.md``). That worst case holds only off the corners: the factor is the row's own,
``sqrt(1 + ax^2 + ay^2)`` of its clamped slopes, so a row beside the image at mid-height gets about
``sqrt(1 + side^2)`` (what the sphere test's plane norm gave), and C(t) stays within 10% of the sphere test's size
with cameras inside the content (BENCHMARKS.md, bench_escapes). And the blur and the ceil add pixels of the
render's resolution, which the resolution schedule makes up to four times coarser than the task's camera: a fixed
pixel pad at the task's resolution fell short on small images.
Culling a task does not scan all N rows: :class:`BoundingSpheres` keeps the spheres in blocks of ``BLOCK_ROWS``
rows that are close in space (Morton order), each with its box of centres and its largest radius; a task tests
the N / ``BLOCK_ROWS`` block bounds (one small matrix product), then exactly the rows of the blocks that may meet
its region (about twice |C(t)| on a street). The per-row test is element-wise arithmetic (no matrix product whose
rounding could depend on the batch), so a row's answer is the same whether it is tested alone, in a block, or
among all N; the block test only skips blocks that are outside by a relative slack far above float32 rounding.
The result is therefore exactly the full scan's.

:meth:`CullRegion.drawable` is the second region culled this way: a provable bound of what the rasterizer can
draw at all, which lets the escape check project only the few rows near C(t) instead of all N.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.row_order import morton_codes

BLOCK_ROWS = 64
"""Rows per block of :class:`BoundingSpheres`' spatial index (N / 64 boxes are tested per task)."""
REBUILD_GROWTH = 1.25
"""The index is rebuilt once its blocks' summed extent (box edges plus radius) has grown by this factor."""
_BLOCK_SLACK = 1e-5
"""Relative slack of the block test: far above float32 rounding of the per-row test, so no block is wrongly skipped."""
_POSITION_SLACK = 1.0
"""Pixels added to the drawable region's padding for the rasterizer's float32 rounding."""
_RADIUS_SLACK = 1.01
"""Factor on the drawable region's radius bound for the rasterizer's float32 rounding."""
_RADIUS_V1_SLACK = 0.32
"""gsplat's radius takes ``sqrt(max(0.01, b^2 - det))`` (0.1 when packed): at most ``sqrt(0.1) < 0.32`` above lambda."""


@dataclass(frozen=True)
class CullRegion:
    """What a bounding sphere must meet to be kept: a near plane and the image's four sides, widened, each reached
    by the sphere's radius times a factor that depends on the row's direction.

    A row with camera-space mean (x, y, z) and 3-sigma radius r = ``3 * max(scale)`` is kept when
    ``z >= near_plane - near_scale r`` and, for each side with slope ``left`` (x / z of the image's left edge
    widened by ``pad_x`` pixels; the other three alike, :attr:`sides`), ``x - left z >= -side_scales[0] m r``, where
    ``m = sqrt(1 + ax^2 + ay^2)``, ``ax = min(|x / z|, limits[0])``, ``ay = min(|y / z|, limits[1])`` for a row with
    ``z >= slope_depth`` and ``ax, ay = limits`` for nearer rows (the largest m). With limits (0, 0), m = 1 and
    ``side_scales = k (1 + left^2) ** 0.5``: a sphere of radius k r against the side's plane (:meth:`sphere`). The
    camera has no skew (``K[0, 1] == 0``).

    Attributes:
        camera: the camera.
        pad_x: pixels added left and right of the image.
        pad_y: pixels added above and below the image.
        near_plane: the near plane (moved towards the camera by ``near_scale`` r).
        near_scale: factor on the 3-sigma radius for the near plane.
        side_scales: factors on m r for the left, right, top and bottom sides.
        limits: the largest |x / z| and |y / z| that enter m.
        slope_depth: rows at this depth or further take their own slopes in m, nearer ones the limits.
    """

    camera: Camera
    pad_x: float
    pad_y: float
    near_plane: float
    near_scale: float
    side_scales: tuple[float, float, float, float]
    limits: tuple[float, float] = (0.0, 0.0)
    slope_depth: float = math.inf

    @classmethod
    def sphere(cls, camera: Camera, pad_x: float, pad_y: float, radius_scale: float, near_plane: float) -> CullRegion:
        """The plain sphere test: a sphere of radius ``radius_scale`` r not entirely outside the near plane or one
        of the image's sides widened by ``pad_x``, ``pad_y`` pixels (C(t)'s region before the drawable region)."""
        norms = tuple(math.hypot(1.0, s) for s in _sides(camera, pad_x, pad_y))
        return cls(camera, pad_x, pad_y, near_plane, radius_scale, tuple(radius_scale * n for n in norms))

    @classmethod
    def candidates(cls, camera: Camera, margin: float, near_plane: float = 0.01) -> CullRegion:
        """C(t)'s region for a task that renders with ``camera``: its drawable region widened by ``margin``."""
        return cls.drawable(camera, near_plane=near_plane).widened(margin)

    def widened(self, margin: float) -> CullRegion:
        """This region with ``margin`` of the image's width and height added on every side, and its near plane
        moved by ``1 + margin`` times as much (the sphere test's near plane before the drawable region): room
        for a row that moves a little after the read. The side factors stay (wider sides only loosen the test)."""
        camera = self.camera
        pad_x, pad_y = self.pad_x + margin * camera.width, self.pad_y + margin * camera.height
        return replace(self, pad_x=pad_x, pad_y=pad_y, near_scale=self.near_scale * (1.0 + margin))

    @classmethod
    def drawable(cls, camera: Camera, eps2d: float = 0.3, near_plane: float = 0.01) -> CullRegion:
        """A region outside which gsplat's projection (CUDA kernel and the CPU port) gives every Gaussian radius 0.

        Why it holds, for the pinhole projection with screen blur ``eps2d`` and a normalized quaternion. A
        Gaussian with camera-space mean (x, y, z) and largest scale s is drawn only if z >= near_plane (> 0) and
        its radius box meets the image: u + r > 0, u - r < W, v + r > 0, v - r < H, where u = fx x / z + cx
        (v alike) and r = ceil(3 sqrt(v1)), v1 = b + sqrt(max(0.01, b^2 - det)) (0.1 when packed) of the
        blurred 2D covariance J Sigma J^T + eps2d I. So v1 <= lambda_max(J Sigma J^T) + eps2d + 0.32 and
        lambda_max(J Sigma J^T) <= s^2 lambda_max(J J^T). With the row's own t = (x / z, y / z) clamped to the
        projection's limits (|t_x| <= Lx, |t_y| <= Ly), J J^T = D (I + t t^T) D / z^2 with D = diag(fx, fy), so
        lambda_max(J J^T) <= f^2 (1 + t_x^2 + t_y^2) / z^2 <= f^2 m^2 / z^2 with f = max(fx, fy) and
        m = sqrt(1 + ax^2 + ay^2), ax = min(|x / z|, Lx), ay = min(|y / z|, Ly): m is the row's own, not the
        worst case over the image (a row beside the image at mid-height has ay ~ 0). Hence, with
        c0 = 3 sqrt(eps2d + 0.32) + 1 (the ceil), r <= 3 s f m / z + c0, and u + r > 0 implies, times z / fx > 0,
        x - left z > -(f / fx) m 3 s with left = -(cx + c0) / fx: a half-plane test of the mean with side factor
        f / fx (f / fy for the top and bottom). A drawn row has z >= near_plane = ``slope_depth``, so x / z is
        its own; nearer rows take the limits. And z >= near_plane implies z >= near_plane - 3 s (``near_scale``
        1). The side factors are multiplied by ``_RADIUS_SLACK`` and the padding grows by ``_POSITION_SLACK``
        pixels for the projection's float32 rounding.

        Args:
            camera: the camera the rasterizer projects with (at the resolution it renders).
            eps2d: the rasterizer's screen-space blur, px^2.
            near_plane: the rasterizer's near plane, > 0.
        """
        if near_plane <= 0:
            raise ValueError(f"the drawable region needs near_plane > 0, got {near_plane}")
        fx, fy = float(camera.K[0, 0]), float(camera.K[1, 1])
        cx, cy = float(camera.K[0, 2]), float(camera.K[1, 2])
        width, height = camera.width, camera.height
        lim_x = max(cx, width - cx) / fx + 0.3 * 0.5 * width / fx
        lim_y = max(cy, height - cy) / fy + 0.3 * 0.5 * height / fy
        pad = 3.0 * math.sqrt(eps2d + _RADIUS_V1_SLACK) + 1.0 + _POSITION_SLACK
        scale_x, scale_y = _RADIUS_SLACK * max(fx, fy) / fx, _RADIUS_SLACK * max(fx, fy) / fy
        return cls(camera, pad, pad, near_plane, 1.0, (scale_x, scale_x, scale_y, scale_y), (lim_x, lim_y), near_plane)

    @functools.cached_property
    def largest_factor(self) -> float:
        """The largest m of any row: ``sqrt(1 + limits[0]^2 + limits[1]^2)`` (the block test's, cull_region.h's)."""
        lim_x, lim_y = self.limits
        return math.sqrt(1.0 + lim_x * lim_x + lim_y * lim_y)

    @functools.cached_property
    def pose(self) -> tuple[list[list[float]], list[float]]:
        """The camera's world-to-camera rotation (3 rows) and translation as Python floats (read once)."""
        viewmat = self.camera.viewmat
        return viewmat[:3, :3].tolist(), viewmat[:3, 3].tolist()

    @functools.cached_property
    def sides(self) -> tuple[float, float, float, float]:
        """The widened image's left, right, top and bottom edges as slopes x / z and y / z."""
        return _sides(self.camera, self.pad_x, self.pad_y)

    @functools.cached_property
    def vector(self) -> list[float]:
        """The region as the kernel ops take it (``cuda/csrc`` cull_region.h), 25 floats: rotation (row-major),
        translation, near plane, near factor, the left/right/top/bottom slopes, their side factors, the limits
        and the slope depth (as :func:`_meets` takes them)."""
        rotation, translation = self.pose
        values = [v for row in rotation for v in row] + list(translation) + [self.near_plane, self.near_scale]
        return values + [*self.sides, *self.side_scales, *self.limits, self.slope_depth]

    def planes(self) -> list[tuple[tuple[float, float, float], float, float]]:
        """The five half-spaces in camera space as (normal n, radius factor k, bound b): a row of 3-sigma radius r
        is kept if n.p + k' r >= b with k' <= k (the near factor; a side's factor times the largest m)."""
        left, right, top, bottom = self.sides
        scale_left, scale_right, scale_top, scale_bottom = (s * self.largest_factor for s in self.side_scales)
        return [
            ((0.0, 0.0, 1.0), self.near_scale, self.near_plane),
            ((1.0, 0.0, -left), scale_left, 0.0),
            ((-1.0, 0.0, right), scale_right, 0.0),
            ((0.0, 1.0, -top), scale_top, 0.0),
            ((0.0, -1.0, bottom), scale_bottom, 0.0),
        ]


def _sides(camera: Camera, pad_x: float, pad_y: float) -> tuple[float, float, float, float]:
    """``camera``'s image widened by ``pad_x``, ``pad_y`` pixels: its left, right, top and bottom slopes."""
    (fx, _, cx), (_, fy, cy), _ = camera.K.tolist()
    left, right = (-pad_x - cx) / fx, (camera.width + pad_x - cx) / fx
    top, bottom = (-pad_y - cy) / fy, (camera.height + pad_y - cy) / fy
    return left, right, top, bottom


def _meets(centres: Tensor, radii: Tensor, region: CullRegion, shift: float = 0.0) -> Tensor:
    """Whether each sphere (centres [3, ...], 3-sigma radii [...]) meets ``region``, bool [...]; with ``shift``,
    whether it may once its centre has moved by at most ``shift``: its slopes are then at most
    ``(|x| + shift) / (z - shift)`` and each side's ``x - left z`` moves by at most ``shift (1 + left^2) ** 0.5``.

    Element-wise only (never a matrix product), in a fixed order of operations, so each row's answer does not
    depend on the other rows tested with it: the full scan, the block index and validation agree bit for bit.
    Without ``shift`` these are cull_region.h's float32 operations in its order.
    """
    ((r00, r01, r02), (r10, r11, r12), (r20, r21, r22)), (t0, t1, t2) = region.pose
    cx, cy, cz = centres[0], centres[1], centres[2]
    x = cx * r00 + cy * r01 + cz * r02 + t0
    y = cx * r10 + cy * r11 + cz * r12 + t1
    z = cx * r20 + cy * r21 + cz * r22 + t2
    slope_x, slope_y, depth = x.abs(), y.abs(), z
    if shift:
        slope_x, slope_y, depth = slope_x + shift, slope_y + shift, z - shift
    lim_x, lim_y = region.limits
    own = depth >= region.slope_depth
    ax = torch.where(own, torch.clamp(slope_x / depth, max=lim_x), lim_x)
    ay = torch.where(own, torch.clamp(slope_y / depth, max=lim_y), lim_y)
    spread = radii * torch.sqrt(1.0 + ax * ax + ay * ay)
    near = region.near_plane - radii * region.near_scale
    reach = [spread * scale for scale in region.side_scales]
    if shift:
        near = near - shift
        reach = [r + shift * math.hypot(1.0, side) for r, side in zip(reach, region.sides)]
    left, right, top, bottom = region.sides
    inside = z >= near
    inside &= (x - left * z) >= -reach[0]
    inside &= (right * z - x) >= -reach[1]
    inside &= (y - top * z) >= -reach[2]
    inside &= (bottom * z - y) >= -reach[3]
    return inside


_LO, _HI, _RADIUS, _ONE = slice(0, 3), slice(3, 6), 6, 7
_LARGEST = slice(3, 7)
"""The rows of a block's bounds that grow by ``amax``: largest centre and largest radius."""


def block_coefficients(region: CullRegion, magnitude: float) -> Tensor:
    """The block test's float64 [5, 8] coefficients for ``region`` (how, in :meth:`_Blocks.meeting`): per plane,
    the box corners' min and max weights [6], the radius factor and the offset with its slack."""
    (r0, r1, r2), translation = region.pose
    coefficients = []
    for (n0, n1, n2), scale, bound in region.planes():
        world = [n0 * r0[j] + n1 * r1[j] + n2 * r2[j] for j in range(3)]
        spread = abs(n0) * sum(map(abs, r0)) + abs(n1) * sum(map(abs, r1)) + abs(n2) * sum(map(abs, r2))
        offset = n0 * translation[0] + n1 * translation[1] + n2 * translation[2]
        reach = abs(n0 * translation[0]) + abs(n1 * translation[1]) + abs(n2 * translation[2]) + abs(bound)
        coefficients.append(
            [min(w, 0.0) for w in world]
            + [max(w, 0.0) for w in world]
            + [
                scale * (1.0 + _BLOCK_SLACK),
                offset - bound + _BLOCK_SLACK * (reach + spread * magnitude),
            ]
        )
    return torch.tensor(coefficients, dtype=torch.float64)


@dataclass
class _Blocks:
    """Rows in Morton order cut into blocks of ``BLOCK_ROWS``, each with a bound of its spheres.

    Attributes:
        rows: per block, its rows, int64 [B, BLOCK_ROWS] (-1 pads the last block).
        spheres: per block, its rows' centre x, y, z and radius, [B, 4, BLOCK_ROWS] (NaN pads; a block's
            spheres are one contiguous chunk, so gathering the blocks a cull keeps is one copy).
        slot_of: each row's position in ``rows.flatten()``, int64 [N].
        bounds: per block, float64 [8, B]: smallest centre (3), largest centre (3), largest 3-sigma radius, and 1.
            Updates only grow them (a scatter of amin / amax), so they stay a bound.
        magnitude: the largest |coordinate| of any centre the index has held (scales the block test's slack).
        built_extent: :meth:`extent` at build time.
    """

    rows: Tensor
    spheres: Tensor
    slot_of: Tensor
    bounds: Tensor
    magnitude: float = 0.0
    built_extent: float = 0.0

    @classmethod
    def build(cls, centres: Tensor, radii: Tensor) -> _Blocks:
        """The index of spheres with centres [3, N] and radii [N]: O(N log N), once per rebuild."""
        n, device = radii.numel(), radii.device
        count = -(-n // BLOCK_ROWS)
        order = torch.argsort(morton_codes(centres), stable=True)
        rows = torch.full((count * BLOCK_ROWS,), -1, dtype=torch.int64, device=device)
        rows[:n] = order
        slot_of = torch.empty_like(order)
        slot_of[order] = torch.arange(n, device=device)
        spheres = torch.full((count * BLOCK_ROWS, 4), math.nan, dtype=centres.dtype, device=device)
        spheres[:n, :3] = centres.T[order]
        spheres[:n, 3] = radii[order]
        spheres = spheres.reshape(count, BLOCK_ROWS, 4).transpose(1, 2).contiguous()
        bounds = torch.full((8, count), -math.inf, dtype=torch.float64, device=device)
        bounds[_LO] = math.inf
        bounds[_ONE] = 1.0
        blocks = cls(rows.reshape(count, BLOCK_ROWS), spheres, slot_of, bounds)
        blocks._grow(slot_of // BLOCK_ROWS, centres, radii)
        blocks.built_extent = blocks.extent()
        return blocks

    def extent(self) -> float:
        """Summed over blocks, the box's edge lengths plus twice the radius: how loose the index is."""
        return float((self.bounds[_HI] - self.bounds[_LO]).sum() + 2.0 * self.bounds[_RADIUS].sum())

    @property
    def stale(self) -> bool:
        """Whether the blocks have grown by ``REBUILD_GROWTH`` since the build (then a rebuild pays off)."""
        return self.extent() > REBUILD_GROWTH * self.built_extent

    def _grow(self, blocks: Tensor, centres: Tensor, radii: Tensor) -> None:
        """Grow the bounds of ``blocks`` (int64 [R]) to hold spheres with centres [3, R] and radii [R]."""
        spheres = torch.cat([centres, radii[None]]).double()
        self.bounds[_LO].scatter_reduce_(1, blocks.expand(3, -1), spheres[:3], "amin")
        self.bounds[_LARGEST].scatter_reduce_(1, blocks.expand(4, -1), spheres, "amax")
        finite = centres.abs().nan_to_num(0.0, posinf=0.0)
        self.magnitude = max(self.magnitude, float(finite.max())) if finite.numel() else self.magnitude

    def update(self, rows: Tensor, centres: Tensor, radii: Tensor) -> None:
        """Move ``rows`` (int64 [R]) to their new centres [3, R] and radii [R], growing their blocks' bounds."""
        slots = self.slot_of.index_select(0, rows)
        blocks = slots // BLOCK_ROWS
        lanes = blocks * (4 * BLOCK_ROWS) + slots % BLOCK_ROWS
        positions = lanes + torch.arange(0, 4 * BLOCK_ROWS, BLOCK_ROWS, device=lanes.device)[:, None]
        self.spheres.view(-1).index_copy_(0, positions.flatten(), torch.cat([centres, radii[None]]).flatten())
        self._grow(blocks, centres, radii)

    def rows_in(self, region: CullRegion) -> Tensor:
        """The rows whose sphere meets ``region`` (unsorted), testing only the blocks :meth:`meeting` keeps."""
        blocks = torch.nonzero(self.meeting(region)).flatten()
        spheres = self.spheres.index_select(0, blocks)
        inside = _meets(spheres[:, :3].transpose(0, 1), spheres[:, 3], region)
        return self.rows.index_select(0, blocks)[inside]

    def meeting(self, region: CullRegion) -> Tensor:
        """Blocks whose bounds may meet ``region``, bool [B]: one float64 product [5, 8] x [8, B].

        For a plane n.p + k r >= b (p = R c + t in camera space, k the plane's largest factor of any row,
        ``CullRegion.planes``, so the block's largest radius bounds every row's own term; m = R^T n), the largest
        n.p over the box [lo, hi] is sum_j max(m_j, 0) hi_j + min(m_j, 0) lo_j, plus n.t. A block is skipped only
        when that, plus its radius term, falls short of b by more than ``_BLOCK_SLACK`` times the magnitudes the
        per-row float32 test adds (sum_ij |n_i R_ij| times the largest finite |coordinate|, |n|.|t|, the radius
        term, |b|), far above that test's rounding: a block holding a row the per-row test keeps is never skipped.
        Bounds that are NaN or infinite (such a row) make the product NaN or +inf, so their blocks are never
        skipped.
        """
        coefficients = block_coefficients(region, self.magnitude).to(self.bounds.device)
        return ~((coefficients @ self.bounds).amin(dim=0) < 0)


@dataclass
class BoundingSpheres:
    """The culling bounds of every Gaussian, column-major, with a block index that makes a cull O(|C| + N / 64).

    The centres are kept transposed and the radii precomputed; both, and the block index, are refreshed only on
    the rows a publication wrote. The index is built by :meth:`index` (or the first cull) and rebuilt once its
    blocks have grown by ``REBUILD_GROWTH`` (until then a block's box only grows, so it stays a bound of its
    rows, just a looser one).

    Attributes:
        centres: Gaussian centres in world space, [3, N].
        radii: 3-sigma bounding radii, ``3 * max(scale)``, [N].
    """

    centres: Tensor
    radii: Tensor
    _blocks: _Blocks | None = field(default=None, repr=False)

    @classmethod
    def of(cls, means: Tensor, scales: Tensor) -> BoundingSpheres:
        """Bounds of Gaussians with centres [N, 3] and activated (world-space) scales [N, 3]."""
        return cls(means.detach().T.contiguous(), 3.0 * scales.detach().max(dim=-1).values)

    @property
    def num_rows(self) -> int:
        """N."""
        return self.radii.numel()

    def update(self, rows: Tensor, means: Tensor, scales: Tensor) -> None:
        """Refresh the bounds of ``rows`` (int64 [R]) from their new centres [R, 3] and scales [R, 3]."""
        centres = means.detach().T.to(self.centres.dtype)
        radii = 3.0 * scales.detach().max(dim=-1).values.to(self.radii.dtype)
        self.centres.index_copy_(1, rows, centres)
        self.radii.index_copy_(0, rows, radii)
        if self._blocks is not None:
            self._blocks.update(rows, centres, radii)
            self.drop_stale_index()

    @property
    def blocks(self) -> _Blocks | None:
        """The block index, or None while it is not built (the next cull builds it)."""
        return self._blocks

    def drop_stale_index(self) -> None:
        """Drop the block index once it has grown by ``REBUILD_GROWTH`` (the next cull rebuilds it)."""
        if self._blocks is not None and self._blocks.stale:
            self._blocks = None

    def meets(self, region: CullRegion, rows: Tensor | None = None, grow: float = 1.0, shift: float = 0.0) -> Tensor:
        """Whether the spheres of ``rows`` (int64 [M]; all N if None) meet ``region``, bool [M]: the exact test.
        With ``grow`` and ``shift``: whether it may, once its radius has grown by at most ``grow`` and its centre
        moved by at most ``shift`` (a row's radius factor depends on where its centre is, :func:`_meets`)."""
        centres, radii = self.centres, self.radii
        if rows is not None:
            centres, radii = centres.index_select(1, rows), radii.index_select(0, rows)
        if grow != 1.0:
            radii = radii * grow
        return _meets(centres, radii, region, shift)

    def rows_in(self, region: CullRegion) -> Tensor:
        """The sorted rows whose sphere meets ``region``, int64 [M]: exactly ``nonzero(meets(region))``, in
        O(N / BLOCK_ROWS + rows of the blocks that may meet the region)."""
        if self.num_rows == 0:
            return torch.empty(0, dtype=torch.int64, device=self.radii.device)
        return torch.sort(self.index().rows_in(region)).values

    def index(self) -> _Blocks:
        """The block index, built now if it is not (O(N log N); the first cull would build it otherwise)."""
        if self._blocks is None:
            self._blocks = _Blocks.build(self.centres, self.radii)
        return self._blocks


def candidate_set(
    means: Tensor,
    scales: Tensor,
    camera: Camera,
    margin: float,
    near_plane: float = 0.01,
) -> Tensor:
    """The candidate set C(t): sorted rows of the Gaussians whose bounding sphere meets the frustum, int64 [M].

    Args:
        means: Gaussian centres in world space, [N, 3].
        scales: activated (world-space) scales, [N, 3].
        camera: the task's camera.
        margin: widening of the frustum (fraction of the image size; its near plane moves by 1 + margin times
            each radius, ``CullRegion.widened``).
        near_plane: the rasterizer's near plane.
    """
    region = CullRegion.candidates(camera, margin, near_plane)
    return torch.nonzero(BoundingSpheres.of(means, scales).meets(region)).flatten()
