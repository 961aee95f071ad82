"""The simulator's workload of a COLMAP scene: its RLG from the point sets a run's datamanager would use."""

from __future__ import annotations

from odin_nerfstudio.culling.initial import initial_candidate_sets
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.scheduling.cli import training_views
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.tracks import load_reconstruction, read_colmap_tracks
from odin_nerfstudio.simulation.workload import Workload, colmap_camera
from tests.conftest import TESTS_DATA


def test_candidate_point_sets_are_the_sets_a_training_run_culls() -> None:
    # `odin-simulate --rlg-points candidates` schedules from the C(v) its runtime culls, a training run's datamanager
    # with `--pipeline.datamanager.rlg-points candidates` from culling/initial.py's sets: the two must be the same
    scene, sparse = TESTS_DATA / "kermit_320", TESTS_DATA / "kermit_320" / "sparse" / "0"
    workload = Workload.from_colmap(scene, rlg_points="candidates")
    reconstruction = load_reconstruction(sparse)
    by_name = {image.name: image for image in reconstruction.images.values()}
    cameras = [colmap_camera(reconstruction, by_name[name]) for name in training_views(scene, sparse, 8)]
    config = OdinRuntimeConfig()
    points = read_colmap_tracks(sparse).points_xyz
    culled = initial_candidate_sets(points, cameras, config.candidate_margin, config.near_plane)
    assert (workload.rlg.weights != RelativeLocalityGraph.from_point_sets(culled).weights).nnz == 0
    assert (Workload.from_colmap(scene).rlg.weights != workload.rlg.weights).nnz > 0
