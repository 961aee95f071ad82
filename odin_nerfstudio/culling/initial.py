"""The model training starts from, and the candidate sets of its views: the RLG's ``rlg-points candidates``.

splatfacto starts a Gaussian on every SfM point, isotropic, its scale the mean distance to its 3 nearest other
points. A view's candidate set on that model (C(t), culled as the runtime culls it, :mod:`.candidates`) holds
the rows its first task may read, so two views whose sets meet are the views whose tasks the runtime will find
unsure of each other when they run in consecutive steps. The SfM points inside a view's field of view (the
``in-view`` sets) leave out the Gaussians whose bounding spheres reach into it from outside, and the tracks
(``observed``) leave out far content as well (``docs/architecture.md``, what bounds the overlap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion

RlgPointSets = Literal["in-view", "observed", "candidates"]
"""What stands for a view in the RLG: its SfM points in view, its SfM track observations, or its candidate set on
the initial model (``--pipeline.datamanager.rlg-points``)."""


def initial_log_scales(points: np.ndarray) -> np.ndarray:
    """splatfacto's initial log-scale of a Gaussian on each SfM point [P, 3]: the log of the mean distance to its 3
    nearest other points (isotropic), float64 [P]."""
    from scipy.spatial import cKDTree  # here: the datamanager imports this module when ns-* commands register

    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    if len(points) == 0:
        return np.zeros(0)
    neighbours = min(4, len(points))
    distances, _ = cKDTree(points).query(points, k=neighbours)
    mean = np.asarray(distances, dtype=np.float64).reshape(len(points), -1)[:, 1:].mean(axis=1)
    return np.log(np.maximum(np.nan_to_num(mean, nan=1e-3), 1e-7))


def initial_candidate_sets(
    points: np.ndarray, cameras: Sequence[Camera], margin: float, near_plane: float
) -> list[np.ndarray]:
    """Per camera, the candidate set C(t) on the initial model over SfM ``points`` [P, 3]: sorted row ids (rows of
    ``points``), int64 [M_v]; culled with the runtime's ``margin`` and ``near_plane`` through one block index."""
    means = torch.as_tensor(np.asarray(points, dtype=np.float32).reshape(-1, 3))
    log_scales = torch.as_tensor(initial_log_scales(points), dtype=torch.float32)
    scales = torch.exp(log_scales)[:, None].expand(-1, 3).contiguous()  # isotropic, as the model's rows start
    spheres = BoundingSpheres.of(means, scales)  # its block index is built by the first cull, then shared
    return [spheres.rows_in(CullRegion.candidates(camera, margin, near_plane)).numpy() for camera in cameras]
