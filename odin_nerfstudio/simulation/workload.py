"""What the simulator replays of a scene: per training view its candidate set C(v), its write set, its size, and
the Relative Locality Graph its schedule is compiled from.

Why the real sets: Odin's gain is the conflict structure of the schedule (which rows consecutive steps share), so
the simulator takes it from the scene itself, through the runtime's own culling:

- a COLMAP scene (``odin-synth`` output, fern): the model is the one odin-splat starts from (splatfacto's
  initialisation: a Gaussian per SfM point, isotropic scale the mean distance to its 3 nearest points); C(v) is
  the runtime's :class:`~odin_nerfstudio.runtime.culling_index.CullingIndex` culled for the view's camera, and the
  write set A(v) is approximated by the rows the camera draws (projected radius > 0,
  :func:`~odin_nerfstudio.rendering.rasterize.drawn_rows`), a superset of the rows with a non-zero gradient. The
  views are the training split ``odin-schedule`` and ns-train use, and the schedule is compiled from the same
  point sets (``rlg_points``), so a simulated step holds the real run's views. A model trained past its first
  densification has more rows; these sets are those of the start of training.
- point sets (``citygen``'s city, no images): each view's SfM points stand for its rows, C(v) = A(v) = its points.

The rows are in the order the model keeps them (a COLMAP scene's initial Gaussians in Z-order, as the runtime puts
them, ``core/row_order.py``; the city's points in the generator's order, which follows its streets): the sharded
mode cuts its shards along that order, and each view has the regional order's key (``scheduling/regions.py``),
so a sharded simulation schedules as ``odin-train --sharded`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.row_order import spatial_order
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.culling.initial import RlgPointSets, initial_log_scales
from odin_nerfstudio.rendering.rasterize import drawn_rows
from odin_nerfstudio.adapter.gsplat import GsplatAdapter
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.scheduling.cli import training_views
from odin_nerfstudio.scheduling.regions import view_keys
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.scheduling.tracks import load_reconstruction, read_colmap_tracks

ROW_BYTES = 260
"""Bytes one active row adds to a worker's exchanged update: its int64 row, the float32 gradients of gsplat's
59 parameters per Gaussian (SH degree 3), and its densification statistics (bench_train's street: 43 KB for 165
rows per rank and step)."""


@dataclass(frozen=True, eq=False)
class Workload:
    """A scene's views as the simulator replays them.

    Attributes:
        name: what the scene is.
        candidates: per view, C(v), sorted int64 [M_v].
        writes: per view, its write set (A(v) or its stand-in), sorted int64 [A_v], inside C(v).
        pixels: per view, its image's pixels, [V] int64.
        rlg: the views' Relative Locality Graph (the schedule's input).
        num_rows: N, the model's rows.
        sizes: per view, the |C(v)| its task cost is computed from (default: the candidate sets' sizes; a real
            run's recorded sizes when replaying it).
        view_keys: per view, the regional order's key [V] (``regions.view_keys``: where along the row order the
            view's SfM points lie); None: the workload has no regional order.
    """

    name: str
    candidates: list[Tensor]
    writes: list[Tensor]
    pixels: np.ndarray
    rlg: RelativeLocalityGraph
    num_rows: int
    sizes: np.ndarray | None = None
    view_keys: np.ndarray | None = None

    def __post_init__(self) -> None:
        views = len(self.candidates)
        if not (len(self.writes) == len(self.pixels) == self.rlg.num_views == views):
            raise ValueError(f"workload {self.name}: views disagree (candidates {views}, writes {len(self.writes)}, "
                             f"pixels {len(self.pixels)}, RLG {self.rlg.num_views})")

    @property
    def num_views(self) -> int:
        """V, the training views."""
        return len(self.candidates)

    def size(self, view: int) -> int:
        """The |C(v)| the task cost of ``view`` is computed from."""
        return int(self.sizes[view]) if self.sizes is not None else self.candidates[view].numel()

    def with_sizes(self, sizes: dict[int, float]) -> Workload:
        """This workload with the task sizes of the views in ``sizes`` replaced (a real run's recorded |C(t)|)."""
        merged = np.array([self.candidates[v].numel() for v in range(self.num_views)], dtype=np.float64)
        for view, size in sizes.items():
            merged[view] = size
        return replace(self, sizes=merged)

    def schedule(self, config: ScheduleConfig) -> Schedule:
        """The schedule of these views for ``config`` (W, B, K, seed, order), as the datamanager compiles it
        (``Schedule`` refuses the regional order of a workload without view keys)."""
        return Schedule(self.rlg, config, self.pixels, view_keys=self.view_keys)

    def mean_candidate_share(self) -> float:
        """Mean |C(v)| / N: how much of the model a view reads (dense scenes near 1, streets small)."""
        return float(np.mean([c.numel() for c in self.candidates])) / max(self.num_rows, 1)

    @classmethod
    def from_point_sets(cls, name: str, point_sets: Sequence[np.ndarray], pixels: int = 128 * 96) -> Workload:
        """A workload whose rows are SfM points: C(v) = A(v) = view v's sorted point ids. Without positions, the
        row order is the geometry: a view's regional key is its median row (a view without points: row 0)."""
        sets = [torch.as_tensor(np.unique(np.asarray(ids, dtype=np.int64))) for ids in point_sets]
        num_rows = int(max((int(s.max()) + 1 for s in sets if s.numel()), default=0))
        rlg = RelativeLocalityGraph.from_point_sets([s.numpy() for s in sets])
        keys = np.array([int(s[s.numel() // 2]) if s.numel() else 0 for s in sets], dtype=np.int64)
        return cls(name, sets, sets, np.full(len(sets), pixels, dtype=np.int64), rlg, num_rows, view_keys=keys)

    @classmethod
    def from_colmap(
        cls,
        scene: Path,
        eval_interval: int = 8,
        downscale: int = 1,
        margin: float | None = None,
        rlg_points: RlgPointSets = "in-view",
    ) -> Workload:
        """A COLMAP scene's training views on its initial model (see the module); ``downscale`` divides the
        images' sides as ``--pipeline.datamanager.camera-res-scale-factor`` would, ``rlg_points`` picks the RLG's
        point sets as ``--pipeline.datamanager.rlg-points`` does. Rows and regional keys are Z-ordered in COLMAP's
        frame, a run's in the dataparser's (oriented and scaled): the regions may differ where views lie near a
        region's border, and the order of views within a region may differ."""
        scene = Path(scene)
        if not scene.is_dir():
            raise FileNotFoundError(f"--scene {scene} does not exist; pass a folder holding sparse/0/")
        sparse = scene / "sparse" / "0"
        tracks = read_colmap_tracks(sparse)
        names = training_views(scene, sparse, eval_interval)
        reconstruction = load_reconstruction(sparse)
        by_name = {image.name: image for image in reconstruction.images.values()}
        cameras = [colmap_camera(reconstruction, by_name[name], downscale) for name in names]
        # The runtime keeps its rows in Z-order from the start (the RLG's point sets are COLMAP ids: it needs no rows).
        params = initial_model(tracks.points_xyz)
        order = spatial_order(params["means"])
        params = {key: value[order] for key, value in params.items()}
        # The datamanager's regional keys come from the SfM point sets, whatever the RLG's.
        sfm_sets = tracks.for_names(names, "in-view" if rlg_points == "candidates" else rlg_points)
        keys = view_keys(sfm_sets, tracks.point3d_ids, tracks.points_xyz)
        point_sets = "candidates" if rlg_points == "candidates" else sfm_sets
        return cls.from_model(scene.name, params, cameras, point_sets, margin, keys)

    @classmethod
    def from_model(
        cls,
        name: str,
        params: dict[str, Tensor],
        cameras: Sequence[Camera],
        point_sets: Sequence[np.ndarray] | Literal["candidates"] | None = None,
        margin: float | None = None,
        keys: np.ndarray | None = None,
    ) -> Workload:
        """The views ``cameras`` [V] of a model (``means``, log-``scales``, ``quats``): C(v) culled by the runtime's
        index, A(v) the drawn rows; the RLG from ``point_sets`` (SfM tracks), from the C(v) with ``"candidates"``
        (``--pipeline.datamanager.rlg-points candidates``), or from the drawn rows when None. ``keys``: the views'
        regional keys (default: ``regions.view_keys`` of ``point_sets`` as rows of the model where given, else of
        the drawn rows)."""
        defaults = OdinRuntimeConfig()
        margin = defaults.candidate_margin if margin is None else margin
        index = CullingIndex(params, GsplatAdapter(), margin, defaults.near_plane)
        candidates, writes = [], []
        for view, camera in enumerate(cameras):
            candidate = index.candidates(Task(0, 0, 0, view, camera))
            rows = {key: params[key][candidate] for key in ("means", "quats", "scales")}
            candidates.append(candidate)
            writes.append(candidate[drawn_rows(camera, rows, near_plane=defaults.near_plane)])
        pixels = np.array([camera.width * camera.height for camera in cameras], dtype=np.int64)
        if point_sets is None or isinstance(point_sets, str):  # the drawn rows, or "candidates"
            sets = [rows.numpy() for rows in (writes if point_sets is None else candidates)]
        else:
            sets = list(point_sets)
        rlg = RelativeLocalityGraph.from_point_sets(sets)
        num_rows = int(params["means"].shape[0])
        if keys is None:
            given = point_sets is not None and not isinstance(point_sets, str)
            key_sets = sets if given else [rows.numpy() for rows in writes]
            keys = view_keys(key_sets, np.arange(num_rows), params["means"].numpy())
        return cls(name, candidates, writes, pixels, rlg, num_rows, view_keys=keys)


def initial_model(points: np.ndarray) -> dict[str, Tensor]:
    """splatfacto's initial Gaussians on SfM ``points`` [P, 3]: means, log-scales (``culling/initial.py``) and
    identity quaternions, float32."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    scales = initial_log_scales(points)
    quats = np.zeros((len(points), 4))
    quats[:, 0] = 1.0
    return {
        "means": torch.as_tensor(points, dtype=torch.float32),
        "scales": torch.as_tensor(np.repeat(scales[:, None], 3, axis=1), dtype=torch.float32),
        "quats": torch.as_tensor(quats, dtype=torch.float32),
    }


def colmap_camera(reconstruction, image, downscale: int = 1) -> Camera:
    """The runtime camera of a COLMAP image (world-to-camera in OpenCV axes, as COLMAP's), its sides / downscale."""
    colmap = reconstruction.cameras[image.camera_id]
    pose = image.cam_from_world() if callable(image.cam_from_world) else image.cam_from_world
    viewmat = np.eye(4)
    viewmat[:3] = pose.matrix()
    K = np.array(colmap.calibration_matrix(), dtype=np.float64)
    K[:2] /= downscale
    width, height = int(colmap.width) // downscale, int(colmap.height) // downscale
    return Camera(torch.as_tensor(viewmat, dtype=torch.float32), torch.as_tensor(K, dtype=torch.float32), width, height)
