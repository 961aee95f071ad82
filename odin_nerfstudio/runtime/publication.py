"""Publication: the only writer of the global state, one step at a time and in step order.

A step's merged update (every worker's gradients summed in worker order, then task order) is applied with
selective Adam to the union of its active rows, fused with the advance of their sequence words (the kernel op
``publish_adam``: compiled when built, else the pure-torch reference; bit-identical); the rows outside it do not
change. Bias correction counts global
steps: an empty union still advances the step count. The tasks' statistics are accumulated into the strategy
state task by task, in worker order then task order, so every replica's statistics are the same bit for bit.

WAW and WAR hold by construction, so they are not checked here: publications run in step order (``publish``
refuses any other), which is what WAW asks, and every task of the publishing step is staged before its worker's
part is exchanged; a running task of a later step read copies (the Shadow Graph's gather), never the global
rows, so a publication cannot overwrite what it read (WAR). ``core/conflicts.py`` keeps the checks for a future
concurrent publication. See ``docs/architecture.md``.

Priority publication (the design's "rows a waiting reader needs go first"): where the exchange delivers a first
part (the rows the workers' next tasks asked for, ``comm/protocol.py``'s :class:`FirstPart`), those rows are
published as soon as it arrives (:meth:`Publisher.apply_first`), and the rest with the statistics once the whole
update has (:meth:`Publisher.apply`). Adam is row-wise and both calls run at the same global step (the first
advances it, the second runs the step's hooks), so every row gets the bits a whole publication gives it.

The adaptive batch rule (``core/batch_gain.py``), where given: once a step is wholly published, its r (the merged
gradient's squared norms over the sum of its tasks' ``sq_norms``) sets the learning-rate gain of the steps after
it, so both parts of a step publish at one gain, the same on every rank and in every mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from odin_nerfstudio.comm.protocol import FirstPart
from odin_nerfstudio.core.batch_gain import AdaptiveGain, merged_squared_norms, row_squared_norms
from odin_nerfstudio.core.conflicts import isin_sorted
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.sparse import SparseUpdate, restricted
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.runtime.adapter import RenderAdapter


@dataclass(frozen=True)
class EarlyRows:
    """A step whose first part is published ahead of the rest.

    Attributes:
        published: P, the rows already published, sorted int64 [P].
        pending: U minus P, the step's writes still to come, sorted int64 [R].
    """

    published: Tensor
    pending: Tensor


class Publisher:
    """Applies merged updates to the model and its strategy state, and keeps the publication mark.

    Args:
        params: per name, the model's parameter [N, ...] (shared with the runtime).
        optimizers: per name, its :class:`SelectiveAdam`.
        adapter: accumulates the tasks' statistics into ``strategy_state``.
        strategy_state: the strategy's state, or None (statistics are then not accumulated).
        published_through: the last step already published (start step - 1).
        record_rows: keep each step's published rows in :attr:`published_rows`.
        gain: the adaptive batch rule that sets the optimizers' learning-rate gains from each published step, or
            None (the rates as the optimizers hold them).
    """

    def __init__(
        self,
        params: dict[str, Tensor],
        optimizers: dict[str, SelectiveAdam],
        adapter: RenderAdapter,
        strategy_state: dict[str, Any] | None,
        published_through: int,
        record_rows: bool,
        gain: AdaptiveGain | None = None,
    ) -> None:
        self.params = params
        self.optimizers = optimizers
        self.adapter = adapter
        self.strategy_state = strategy_state
        self.published_through = published_through
        self.record_rows = record_rows
        self.gain = gain
        self.published_rows: dict[int, Tensor] = {}
        self.early: dict[int, EarlyRows] = {}
        """The next step, once its first part is published (until the rest is)."""

    def check_order(self, step: int) -> None:
        """Raise unless ``step`` is the next step to publish."""
        if step != self.published_through + 1:
            raise RuntimeError(f"publish({step}) out of order: last published step is {self.published_through}")

    def apply_first(self, step: int, first: FirstPart, seq: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Publish the first part of ``step`` (the next step): selective Adam on its rows, which advances the
        global step; returns the rows, their new means [P, 3] and scales [P, 3]."""
        self.check_order(step)
        rows = first.update.rows
        ops.publish_adam(self.optimizers, rows, first.update.grads, seq, part="first")
        self.early[step] = EarlyRows(rows, first.rows[~isin_sorted(first.rows, rows)])
        means, scales = (self.params[name].detach().index_select(0, rows) for name in ("means", "scales"))
        return rows, means, scales

    def apply(self, step: int, merged: SparseUpdate, seq: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Selective Adam on ``merged.rows`` (less those its first part published) with their sequence words
        ``seq`` (int64 [N], the tables') advanced by one version, then its tasks' statistics and, with a gain, the
        step's r for the steps after it; returns the rows written, their new means [R, 3] and scales [R, 3] (for
        the culling index)."""
        measured = self._measured(merged) if self.gain is not None else None
        stats, early, part = merged.stats, self.early.pop(step, None), "whole"
        if early is not None:
            merged, part = restricted(merged, ~isin_sorted(merged.rows, early.published)), "rest"
        rows = merged.rows
        ops.publish_adam(self.optimizers, rows, merged.grads, seq, part=part)
        means, scales = (self.params[name].detach().index_select(0, rows) for name in ("means", "scales"))
        if self.strategy_state is not None:
            num_primitives = self.params["means"].shape[0]
            for task_stats in stats:
                self.adapter.accumulate(self.strategy_state, task_stats, num_primitives)
        if measured is not None:
            self.gain.observe(self.optimizers, measured)
        return rows, means, scales

    @staticmethod
    def _measured(merged: SparseUpdate) -> dict[str, tuple[float, float]] | None:
        """Per parameter, (||merged gradient||^2, sum of its tasks' squared norms) of a whole step; None when its
        tasks measured none."""
        if merged.sq_norms is None:
            return None
        summed = merged_squared_norms(row_squared_norms(merged.grads)).tolist()
        return dict(zip(merged.grads, zip(summed, merged.sq_norms.tolist(), strict=True), strict=True))

    def rest_movement(self) -> tuple[float, float]:
        """The most the publication of the rest of an early step moves an element of ``means`` and of ``scales``
        (Adam's bound at the step count the first part advanced to, :meth:`SelectiveAdam.movement_bound`)."""
        return self.optimizers["means"].movement_bound(), self.optimizers["scales"].movement_bound()

    def done(self, step: int, rows: Tensor) -> None:
        """Step ``step`` is published (it wrote ``rows``, sorted int64 [R])."""
        if self.record_rows:
            self.published_rows[step] = rows
        self.published_through = step
