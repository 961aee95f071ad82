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
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.runtime.adapter import RenderAdapter


class Publisher:
    """Applies merged updates to the model and its strategy state, and keeps the publication mark.

    Args:
        params: per name, the model's parameter [N, ...] (shared with the runtime).
        optimizers: per name, its :class:`SelectiveAdam`.
        adapter: accumulates the tasks' statistics into ``strategy_state``.
        strategy_state: the strategy's state, or None (statistics are then not accumulated).
        published_through: the last step already published (start step - 1).
        record_rows: keep each step's published rows in :attr:`published_rows`.
    """

    def __init__(
        self,
        params: dict[str, Tensor],
        optimizers: dict[str, SelectiveAdam],
        adapter: RenderAdapter,
        strategy_state: dict[str, Any] | None,
        published_through: int,
        record_rows: bool,
    ) -> None:
        self.params = params
        self.optimizers = optimizers
        self.adapter = adapter
        self.strategy_state = strategy_state
        self.published_through = published_through
        self.record_rows = record_rows
        self.published_rows: dict[int, Tensor] = {}

    def check_order(self, step: int) -> None:
        """Raise unless ``step`` is the next step to publish."""
        if step != self.published_through + 1:
            raise RuntimeError(f"publish({step}) out of order: last published step is {self.published_through}")

    def apply(self, merged: SparseUpdate, seq: Tensor) -> tuple[Tensor, Tensor]:
        """Selective Adam on ``merged.rows`` with their sequence words ``seq`` (int64 [N], the tables') advanced by
        one version, then its tasks' statistics; returns the rows' new means [R, 3] and scales [R, 3] (for the
        culling index)."""
        rows = merged.rows
        ops.publish_adam(self.optimizers, rows, merged.grads, seq)
        means, scales = (self.params[name].detach().index_select(0, rows) for name in ("means", "scales"))
        if self.strategy_state is not None:
            num_primitives = self.params["means"].shape[0]
            for stats in merged.stats:
                self.adapter.accumulate(self.strategy_state, stats, num_primitives)
        return means, scales

    def done(self, step: int, rows: Tensor) -> None:
        """Step ``step`` is published (it wrote ``rows``, sorted int64 [R])."""
        if self.record_rows:
            self.published_rows[step] = rows
        self.published_through = step
