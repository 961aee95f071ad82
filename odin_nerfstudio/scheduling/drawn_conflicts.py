"""How well an RLG predicts what views really draw: its schedule and its weights judged by drawn rows.

The RLG predicts conflicts from SfM point sets (observed tracks, or every point in view); what conflicts in
training is the Gaussians two views both draw (radii > 0), which a trained model tells. Given each view's drawn
rows, the drawn-row graph is the RLG of those row sets (Jaccard of the views' drawn rows), and a schedule is
judged by the conflict mass between its consecutive steps under the drawn-row weights, against the same views
in the schedule's seeded random order. ``odin-schedule --checkpoint`` and ``benchmarks/bench_point_sets.py``
report these figures (README, BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from odin_nerfstudio.scheduling.ordering import conflict_by_lag, group_of_views
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule


def drawn_row_graph(drawn: Sequence[np.ndarray]) -> RelativeLocalityGraph:
    """The Jaccard graph of the views' drawn rows (per view, the row ids it draws, int [n_i])."""
    return RelativeLocalityGraph.from_point_sets([np.asarray(rows, dtype=np.int64) for rows in drawn])


def rank_correlation(predicted: RelativeLocalityGraph, drawn: RelativeLocalityGraph) -> float:
    """Spearman's rank correlation between two graphs' weights over every view pair i < j (pairs without an edge
    weigh 0); NaN when either is constant. Dense in the pairs: O(V^2) memory, meant for scenes of thousands of
    views at most."""
    if predicted.num_views != drawn.num_views:
        raise ValueError(f"the graphs have {predicted.num_views} and {drawn.num_views} views")
    upper = np.triu_indices(predicted.num_views, k=1)
    a = np.asarray(predicted.weights.todense())[upper]
    b = np.asarray(drawn.weights.todense())[upper]
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    from scipy.stats import spearmanr  # here: scipy.stats costs odin-schedule's start-up a third of a second

    return float(spearmanr(a, b).statistic)


def conflict_masses(schedule: Schedule, graph: RelativeLocalityGraph, epochs: int = 1) -> tuple[float, float]:
    """Conflict mass between consecutive steps under ``graph``'s weights, summed over the first ``epochs``
    epochs: (the schedule's, the seeded random order's it is compared with)."""
    if graph.num_views != schedule.num_views:
        raise ValueError(f"the graph has {graph.num_views} views but the schedule {schedule.num_views}")
    upper = sp.triu(graph.weights, k=1).tocoo()
    edges = (upper.row.astype(np.int64), upper.col.astype(np.int64), upper.data)

    def mass(groups: list[np.ndarray]) -> float:
        return float(conflict_by_lag(edges, group_of_views(groups, graph.num_views), len(groups), 1).sum())

    scheduled = sum(mass(schedule.step_views(epoch)) for epoch in range(epochs))
    random = sum(mass(schedule.random_groups(epoch)) for epoch in range(epochs))
    return scheduled, random


def drawn_ratio_line(schedule: Schedule, drawn: Sequence[np.ndarray]) -> str:
    """One line: the schedule's conflict ratio to random order under the drawn rows, beside the one under its own
    RLG weights, and the rank correlation of the two graphs' weights (``odin-schedule --checkpoint``)."""
    graph = drawn_row_graph(drawn)
    scheduled, random = conflict_masses(schedule, graph)
    own = schedule.summary()["ratio"]
    ratio = scheduled / random if random > 0 else float("nan")
    return (
        f"drawn rows: conflict mass between consecutive steps {scheduled:.4f} scheduled vs {random:.4f} random "
        f"order, ratio {ratio:.3f} (under the RLG's own weights {own:.3f}); Spearman correlation of RLG and "
        f"drawn-row weights over view pairs {rank_correlation(schedule.rlg, graph):.3f}"
    )
