"""Replica checks for data-parallel runs: every rank's copy of the model must stay bit-identical.

Odin publishes the same sparse updates in the same order on every rank, so the replicas never differ; a bug, a
non-deterministic kernel or a rank that skipped a publication would break that silently. A checksum every N steps
(docs/architecture.md) catches it early and names the rank and the parameter. The checksum is cheap:
per parameter, a float64 sum of its values and of its values weighted by their position (a moved row changes the
second), all-gathered as one small tensor.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor

from odin_nerfstudio.comm.distributed import DistributedTransport, require_no_exchange_in_flight


def replica_checksum(params: dict[str, Tensor]) -> Tensor:
    """Per parameter (in name order), its row count, value sum and position-weighted sum, float64 [3 x names]."""
    sums = []
    for name in sorted(params):
        values = params[name].detach().reshape(-1).double()
        weights = torch.arange(1, values.numel() + 1, dtype=torch.float64, device=values.device) / max(
            values.numel(), 1
        )
        sums += [torch.tensor(float(params[name].shape[0]), dtype=torch.float64, device=values.device)]
        sums += [values.sum(), (values * weights).sum()]
    return torch.stack(sums) if sums else torch.zeros(0, dtype=torch.float64)


def check_replicas(
    params: dict[str, Tensor],
    step: int,
    group: dist.ProcessGroup | None = None,
    transports: Iterable[DistributedTransport] = (),
) -> None:
    """Compare this rank's checksum with every rank's (a collective: every rank calls it at the same step), once
    no exchange of ``transports`` (the caller's) is in flight.

    Raises:
        RuntimeError: naming the step, the ranks that differ from rank 0 and their parameters; or an exchange is
            still in flight (settle first: the progress thread owns the collectives until then).
    """
    require_no_exchange_in_flight(f"the replica check of step {step}", transports)
    mine = replica_checksum(params)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    names = sorted(params)
    differing = {
        rank: sorted({names[i // 3] for i in torch.nonzero(theirs != every[0]).flatten().tolist()})
        for rank, theirs in enumerate(every)
        if not torch.equal(theirs, every[0])
    }
    if differing:
        raise RuntimeError(
            f"replicas diverged by step {step}: ranks differ from rank 0 in {differing}; the run is not data parallel "
            "any more (a non-deterministic kernel or a missed publication); resume from the last checkpoint"
        )
