"""The adaptive batch rule across the sharded loop's owners (``core/batch_gain.py``): what each step's gain is made
of, and the exchanges its parts ride on.

A step's r needs the merged gradient's norms, whose rows are spread over the owners, and every rank's tasks'
norms. The tasks' norms ride on the step's return (side table ``views``). Each owner's published rows' norms ride
on the first exchange every rank starts after the publication (side table ``norms``): the next step's fetch, or
its rest or clean part, and only where that step fetches nothing, its return. So the gain of step s is set before
step s's own return arrives wherever step s fetched anything, which lets an owner publish early the rows only its
own rank's tasks write (``Owner.publish_early``). Every owner gathers the rows' norms in rank order (global-id
order) and the tasks' in worker order: the gain the replicated publication sets, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from odin_nerfstudio.comm.all_to_all import side_of, with_side
from odin_nerfstudio.core.batch_gain import AdaptiveGain, merged_squared_norms, row_squared_norms
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.drivers.fetched_ahead import Carrier
from odin_nerfstudio.runtime.sharding import Owner, Rows


@dataclass
class PendingGain:
    """A published step whose batch gain is not set yet (the adaptive rule's inputs but the other owners' rows).

    Attributes:
        step: the step.
        rows: this owner's published rows' squared gradient norms, float64 [R, G] (local row order).
        views: per schedule worker, in worker order, its tasks' squared norms (``norms`` [1, G]; ``any``: measured).
        carrier: the exchange the rows' norms ride on, once one started.
    """

    step: int
    rows: Tensor
    views: list[Rows]
    carrier: Carrier | None = None


class ShardedGain:
    """One owner's side of the adaptive batch rule in the sharded loop.

    Args:
        rule: the adaptive batch rule, or None (no gain: nothing rides, every gain is set).
        owner: this rank's shard, whose optimizers' gains the rule sets.
    """

    def __init__(self, rule: AdaptiveGain | None, owner: Owner) -> None:
        self.rule, self.owner = rule, owner
        self.pending: PendingGain | None = None
        """The published step whose gain is still to be set."""

    @property
    def is_set(self) -> bool:
        """Whether every published step's gain is set (the next publication's learning rates are known)."""
        return self.pending is None

    def riding(self, pieces: Sequence[Rows]) -> tuple[list[Rows], bool]:
        """``pieces`` of an exchange about to start, with the pending step's row norms on them where they have not
        left on an earlier one; and whether they did ride (then :meth:`started` names the exchange)."""
        if self.pending is None or self.pending.carrier is not None:
            return list(pieces), False
        return [with_side(piece, "norms", {"rows": self.pending.rows}) for piece in pieces], True

    def started(self, carrier: Carrier) -> None:
        """The exchange the pending row norms ride on."""
        self.pending.carrier = carrier

    def arrived(self, carrier: Carrier) -> None:
        """``carrier`` is here: where the pending row norms rode on it, set the pending step's gain."""
        if self.pending is not None and self.pending.carrier is carrier:
            self.observe([side_of(part, "norms")["rows"] for part in carrier.parts])

    def task_norms(self, returns: list[Rows], norms: Tensor | None) -> list[Rows]:
        """A step's return pieces with this rank's tasks' squared norms (summed in task order) as side table
        ``views``, to every owner."""
        if self.rule is None:
            return returns
        device = self.owner.params["means"].device
        measured = torch.zeros(1, len(self.owner.params), dtype=torch.float64, device=device)
        views = {
            "norms": measured if norms is None else norms[None],
            "any": torch.tensor([norms is not None], device=device),
        }
        return [with_side(piece, "views", views) for piece in returns]

    def published(self, step: int, merged: SparseUpdate, parts: Sequence[Rows]) -> None:
        """Step ``step`` is published here (``merged``: its update on this shard; ``parts``: the return's pieces in
        worker order, with their tasks' norms): its gain is pending."""
        if self.rule is not None:
            views = [side_of(part, "views") for part in parts]
            self.pending = PendingGain(step, row_squared_norms(merged.grads), views)

    def observe(self, rows: Sequence[Tensor]) -> None:
        """The adaptive batch rule for the pending step, from every owner's row norms (``rows``, in rank order:
        global-id order) and every worker's tasks' norms; clears the pending step."""
        pending, self.pending = self.pending, None
        if not any(bool(view["any"][0]) for view in pending.views):
            return
        summed = merged_squared_norms(torch.cat(list(rows)))
        total = torch.zeros_like(summed)
        for view in pending.views:
            total.add_(view["norms"][0])
        names = list(self.owner.params)
        self.rule.observe(self.owner.optimizers, dict(zip(names, zip(summed.tolist(), total.tolist()))))
