"""The simulator's workload of a COLMAP scene: its RLG from the point sets a run's datamanager would use."""

from __future__ import annotations

from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.simulation.workload import Workload
from tests.conftest import TESTS_DATA


def test_candidate_point_sets_are_the_views_culled_candidate_sets() -> None:
    # `odin-simulate --rlg-points candidates` schedules as `--pipeline.datamanager.rlg-points candidates` trains:
    # from culling/initial.py's sets, which must be the C(v) the runtime's CullingIndex culls for each view
    workload = Workload.from_colmap(TESTS_DATA / "kermit_320", rlg_points="candidates")
    in_view = Workload.from_colmap(TESTS_DATA / "kermit_320")
    expected = RelativeLocalityGraph.from_point_sets([rows.numpy() for rows in workload.candidates]).weights
    assert (workload.rlg.weights != expected).nnz == 0
    assert (in_view.rlg.weights != expected).nnz > 0
