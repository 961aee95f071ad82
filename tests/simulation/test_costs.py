"""The cost model's fit on a synthetic timeline whose formula is known."""

from __future__ import annotations

from pathlib import Path

import pytest

from odin_nerfstudio.simulation.costs import CostModel, LinearFit, recorded_sizes
from tests.simulation.runs import PUBLISH_S, TASK_S, write_run


def test_fit_recovers_the_task_and_publication_formulas(tmp_path: Path) -> None:
    costs = CostModel.fit([write_run(tmp_path / "run")])
    assert costs.task.samples == 60
    assert costs.task.intercept == pytest.approx(TASK_S[0], rel=1e-3)
    assert costs.task.coefficients == pytest.approx(TASK_S[1:], rel=1e-3)
    assert costs.task.r2 == pytest.approx(1.0, abs=1e-6)
    assert costs.publish.intercept == pytest.approx(PUBLISH_S[0], rel=1e-3)
    assert costs.publish.coefficients[0] == pytest.approx(PUBLISH_S[1], rel=1e-3)
    assert costs.bookkeeping_s == pytest.approx(0.001, rel=1e-3)  # the counters' 1 ms per task beyond publishing
    assert costs.task_s(1000, 12288) == pytest.approx(TASK_S[0] + TASK_S[1] * 1000 + TASK_S[2] * 12288 + 0.001)


def test_a_feature_that_does_not_vary_goes_into_the_intercept() -> None:
    fit = LinearFit.of([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]], [3.0, 5.0, 7.0])
    assert fit.coefficients == pytest.approx((2.0, 0.0))
    assert fit.intercept == pytest.approx(1.0)
    assert fit.r2 == pytest.approx(1.0)


def test_a_run_without_task_sizes_is_refused_by_name(tmp_path: Path) -> None:
    run = write_run(tmp_path / "old")
    for trace in run.glob("odin_timeline_rank*.json"):
        trace.write_text(trace.read_text().replace('"candidates"', '"other"'))
    with pytest.raises(ValueError, match="candidates"):
        CostModel.fit([run])


def test_recorded_sizes_average_each_view(tmp_path: Path) -> None:
    sizes = recorded_sizes([write_run(tmp_path / "run")])
    assert sorted(sizes) == list(range(7))
    assert all(50 <= size < 2000 for size in sizes.values())
