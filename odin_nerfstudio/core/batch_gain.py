"""The adaptive batch gain: a step's learning rates scaled by how alike its S views' gradients are, measured.

A step sums S = W x B views' gradients into one selective-Adam update (``core/sparse.py``). Adam's step on that sum
is as long as ``S`` one-view steps would be only if the learning rate is ``lr x sqrt(S x r)``, with, per parameter
group,

    r = ||sum_i g_i||^2 / sum_i ||g_i||^2        (1 for independent views, S for identical ones)

(``ns/batch_scaling.py`` derives it; Grendel's ``sqrt(S)`` assumes r = 1). As AdaScale SGD (Johnson et al. 2020)
does, r is measured from the step's own per-view gradients and smoothed by moving averages of its numerator and
denominator (a ratio of averages, steadier than an average of ratios from S samples each); AdaScale's gain formula
is SGD's and is not used. The batch's optimizers carry lr x sqrt(S) already; :class:`AdaptiveGain` sets each
one's factor ``sqrt(r)`` on it, the param group's ``lr_gain`` that selective Adam multiplies its lr by
(:func:`scaled_lr`).

Choices, each so that every rank and every mode computes the same bits:

- Numbers: per view, the squared norms of its gradient rows summed in float64 (:func:`squared_norms`), added in
  task order within a worker and in worker order across workers (they travel with the exchange, as
  ``SparseUpdate.sq_norms``); the numerator from the merged gradient every rank publishes, row by row first
  (:func:`merged_squared_norms`), so a sharded run's owners reach the same bits.
- Average: an exponential one whose weight is the group's Adam beta1 (the batch's, beta1 ** S): r is averaged over
  the views Adam's first moment remembers (about 10 at beta1 = 0.9 per view), the gradients the step's direction
  is made of. A step whose views have no gradient in a group (both terms 0) leaves its averages as they are. The
  two averages share their weight and start from 0, so their ratio needs no bias correction.
- Lag: step s uses the averages through step s - 1. Priority publication applies a step's first rows before its
  whole gradient has arrived, so only an earlier, wholly published step can set the lr of every part of step s.
  The first step, with nothing measured, takes gain 1 (Grendel's sqrt(S)).
- Range: the averaged r is clamped to [1, S] (r <= S holds for any S vectors; r < 1, views pulling apart, would
  take shorter steps than independent views, which Grendel's rule already takes).

The state (``gain_averages``, ``lr_gain``) lives in each optimizer's param group: saved and restored with the
optimizer's state dict (a resumed run continues exactly), and kept by gsplat's structural edits, which replace only
the group's ``params``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

GAIN_KEY = "lr_gain"
"""The param-group entry of the factor on ``lr`` (absent: 1)."""
AVERAGES_KEY = "gain_averages"
"""The param-group entry of the moving averages (of ||sum g_i||^2, of sum ||g_i||^2)."""


def scaled_lr(group: dict[str, Any]) -> float:
    """The learning rate a step of ``group`` takes: its ``lr`` times its batch gain (1 unless one is set)."""
    return group["lr"] * group.get(GAIN_KEY, 1.0)


def squared_norms(grads: Mapping[str, Tensor]) -> Tensor:
    """Per parameter, in the mapping's order, the squared L2 norm of its gradient rows in float64, [G]."""
    values = [grad.detach().double().square().sum() for grad in grads.values()]
    return torch.stack(values) if values else torch.zeros(0, dtype=torch.float64)


def row_squared_norms(grads: Mapping[str, Tensor]) -> Tensor:
    """Per gradient row, per parameter in the mapping's order, its squared L2 norm in float64, [R, G]."""
    rows = next(iter(grads.values())).shape[0] if grads else 0
    columns = [grad.detach().double().square().reshape(rows, math.prod(grad.shape[1:])).sum(dim=1)
               for grad in grads.values()]
    return torch.stack(columns, dim=1) if columns else torch.zeros(rows, 0, dtype=torch.float64)


def merged_squared_norms(row_norms: Tensor) -> Tensor:
    """A step's ||merged gradient||^2 per parameter, float64 [G], from its rows' :func:`row_squared_norms` in row
    order: the rows first, then the rows summed, so that a sharded run, whose owners each hold some rows, gets the
    same bits from their rows' norms gathered in global-id order."""
    return row_norms.sum(dim=0)


@dataclass(frozen=True)
class AdaptiveGain:
    """Sets each optimizer's ``lr_gain`` to sqrt(r), r measured on published steps of ``views_per_step`` views."""

    views_per_step: int
    """S = W x B: the views a step sums, the upper bound of r."""

    def __post_init__(self) -> None:
        if self.views_per_step < 2:
            raise ValueError(f"an adaptive gain needs a step of at least 2 views, got {self.views_per_step}")

    @property
    def largest(self) -> float:
        """The largest gain :meth:`observe` sets: sqrt(S)."""
        return math.sqrt(float(self.views_per_step))

    def observe(
        self, optimizers: Mapping[str, torch.optim.Optimizer], measured: Mapping[str, tuple[float, float]]
    ) -> None:
        """Fold a wholly published step into each optimizer's averages and set the gain of the next step.

        Args:
            optimizers: per parameter name, its optimizer (one param group each).
            measured: per parameter name, (||sum of the step's view gradients||^2, sum of their squared norms).
        """
        for name, optimizer in optimizers.items():
            summed, views = measured[name]
            (group,) = optimizer.param_groups
            average_sum, average_views = group.get(AVERAGES_KEY, (0.0, 0.0))
            if views > 0.0:
                weight = group["betas"][0]
                average_sum = weight * average_sum + (1.0 - weight) * summed
                average_views = weight * average_views + (1.0 - weight) * views
            group[AVERAGES_KEY] = (average_sum, average_views)
            ratio = average_sum / average_views if average_views > 0.0 else 1.0
            group[GAIN_KEY] = math.sqrt(min(max(ratio, 1.0), float(self.views_per_step)))
