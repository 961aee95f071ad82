"""A batch's structural changes fall after the views a one-view run's do (``ViewCountedStrategy``), the rules inside
gsplat's edit included: its pruning of large rows starts after ``reset_every`` views, not steps."""

from __future__ import annotations

import math

import torch

from odin_nerfstudio.adapter.gsplat import ViewCountedStrategy, edit_rows, refine_due, reset_due
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.scenes.toy import LRS, make_params

RULES = {"refine_start_iter": 0, "refine_every": 8, "reset_every": 40, "pause_refine_after_reset": 0}
"""A refinement every 8 views and an opacity reset every 40: gsplat prunes large rows once past the first reset."""


def rows_after_refining(strategy: ViewCountedStrategy, step: int) -> int:
    """How many of 30 rows (the first 10 three times too large, the others a third of it, every opacity well above
    the pruning threshold, no gradient to grow by) an edit after ``step`` keeps."""
    params = make_params(30)
    with torch.no_grad():
        params["scales"].fill_(math.log(strategy.prune_scale3d / 3))
        params["scales"][:10] = math.log(3 * strategy.prune_scale3d)
        params["opacities"].fill_(2.0)
    state = strategy.initialize_state(scene_scale=1.0)
    state["grad2d"], state["count"] = torch.zeros(30), torch.zeros(30)
    edit_rows(strategy, params, selective_adams(params, LRS), state, step, seed=0, ids=torch.arange(30))
    return params["means"].shape[0]


def test_four_views_a_step_refine_reset_and_prune_at_the_one_view_runs_views() -> None:
    one, four = ViewCountedStrategy(**RULES), ViewCountedStrategy(**RULES, views_per_step=4)
    assert [s for s in range(30) if refine_due(four, s)] == list(range(2, 30, 2)), "after views 8, 16, ..., 112"
    assert [s for s in range(30) if reset_due(four, s)] == [0, 10, 20], "after views 0, 40 and 80"
    assert rows_after_refining(one, 32) == rows_after_refining(four, 8) == 30, "before view 40: none pruned"
    assert rows_after_refining(one, 48) == rows_after_refining(four, 12) == 20, "after view 40: the large ones"
