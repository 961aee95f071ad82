"""The RLG judged by drawn rows: the drawn-row graph, the rank correlation of two graphs' weights, a schedule's
conflict mass under other weights, and odin-schedule's --checkpoint line (rows supplied without nerfstudio)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from odin_nerfstudio.scheduling.cli import ScheduleCliConfig, run, training_views
from odin_nerfstudio.scheduling.drawn_conflicts import conflict_masses, drawn_row_graph, rank_correlation
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.scheduling.tracks import read_colmap_tracks

KERMIT_320 = Path(__file__).resolve().parents[1] / "data" / "kermit_320"


def ring_sets(num_views: int, width: int, seed: int = 0) -> list[np.ndarray]:
    """Views on a ring, each holding the ``width`` points after its position (neighbours share most points)."""
    rng = np.random.default_rng(seed)
    start = np.sort(rng.permutation(num_views * 3)[:num_views])
    return [np.arange(s, s + width) % (num_views * 3) for s in start]


def test_a_schedule_judged_by_its_own_weights_gives_its_own_conflict_masses() -> None:
    sets = ring_sets(24, 8)
    rlg = RelativeLocalityGraph.from_point_sets(sets)
    schedule = Schedule(rlg, ScheduleConfig(num_workers=2, seed=1))
    stats = schedule.summary(epochs=3)
    scheduled, random = conflict_masses(schedule, drawn_row_graph(sets), epochs=3)
    assert scheduled == pytest.approx(stats["conflict_mass"]) and random == pytest.approx(stats["random_conflict_mass"])
    assert 0 <= scheduled < random
    assert rank_correlation(rlg, drawn_row_graph(sets)) == pytest.approx(1.0)


def test_unrelated_drawn_rows_are_told_apart_from_a_prediction() -> None:
    """Drawn rows that reverse the ring's neighbourhoods correlate negatively with the RLG's weights, and views that
    draw disjoint rows conflict nowhere."""
    sets = ring_sets(16, 6)
    rlg = RelativeLocalityGraph.from_point_sets(sets)
    far = [sets[(i + 8) % 16] for i in range(16)]
    mixed = [np.concatenate([far[i], sets[i][:1]]) for i in range(16)]
    assert rank_correlation(rlg, drawn_row_graph(mixed)) < 0.5
    schedule = Schedule(rlg, ScheduleConfig(num_workers=2))
    assert conflict_masses(schedule, drawn_row_graph([np.array([i]) for i in range(16)])) == (0.0, 0.0)
    with pytest.raises(ValueError, match="views"):
        conflict_masses(schedule, drawn_row_graph(sets[:8]))


def test_odin_schedule_prints_the_ratio_under_the_drawn_rows_of_a_checkpoint(tmp_path: Path) -> None:
    names = training_views(KERMIT_320, KERMIT_320 / "sparse" / "0", 8)
    drawn = {name: np.arange(i, i + 50) for i, name in enumerate(names)}
    asked = []

    def drawn_rows(path: Path) -> dict[str, np.ndarray]:
        asked.append(path)
        return drawn

    config = ScheduleCliConfig(data=KERMIT_320, workers=2, checkpoint=tmp_path / "config.yml")
    line = run(config, drawn_rows)[-1]
    assert asked == [tmp_path / "config.yml"]
    found = re.search(r"drawn rows: .* ([\d.]+) scheduled vs ([\d.]+) random order, ratio ([\d.]+) \(under", line)
    assert found, line
    scheduled, random, _ = map(float, found.groups())
    sets = read_colmap_tracks(KERMIT_320 / "sparse" / "0").for_names(names, "in-view")
    schedule = Schedule(RelativeLocalityGraph.from_point_sets(sets), ScheduleConfig(num_workers=2))
    expected = conflict_masses(schedule, drawn_row_graph([drawn[n] for n in names]))
    assert (scheduled, random) == pytest.approx(expected, abs=5e-5)
    with pytest.raises(ValueError, match="trained without the views"):
        run(config, lambda path: {names[0]: drawn[names[0]]})
    with pytest.raises(ValueError, match="--checkpoint needs nerfstudio"):
        run(config)
