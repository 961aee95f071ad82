"""`OdinPipeline`: nerfstudio's VanillaPipeline without DistributedDataParallel.

Odin keeps the replicas identical itself (sparse updates published in step order), so the model is never wrapped in
DDP: DDP would all-reduce dense gradients the runtime never produces, and on CPU (gloo) it refuses a device id. The
datamanager still learns the world size, from torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Type

from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig
from torch.cuda.amp.grad_scaler import GradScaler


@dataclass
class OdinPipelineConfig(VanillaPipelineConfig):
    """VanillaPipeline's settings; the model is never wrapped in DDP."""

    _target: Type = field(default_factory=lambda: OdinPipeline)


class OdinPipeline(VanillaPipeline):
    """VanillaPipeline whose model stays unwrapped in a distributed run."""

    def __init__(
        self,
        config: OdinPipelineConfig,
        device: str,
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        grad_scaler: Optional[GradScaler] = None,
    ) -> None:
        super().__init__(
            config, device, test_mode=test_mode, world_size=1, local_rank=local_rank, grad_scaler=grad_scaler
        )
        self.world_size = world_size
