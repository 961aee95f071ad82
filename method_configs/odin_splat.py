"""`odin-splat`: the method specification ns-train discovers.

This module is loaded by every ns-* command through nerfstudio's entry points, so it imports only what the
specifications need; heavy or optional libraries (pycolmap, scipy, matplotlib) load lazily where used. Being the
plugin's first code in such a command, it runs ``prepare_command`` (``odin_nerfstudio/ns/startup.py``) for the
commands that run odin-splat: the CUDA check before nerfstudio prints anything, the CPU threads, quieter output;
and, in every process that builds nerfstudio's method catalogue (which loads the plugins first), it builds the
catalogue's installable external methods without a stack walk each (``skip_catalogue_stack_walk``).
"""

from __future__ import annotations

from nerfstudio.configs.base_config import ViewerConfig
from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig
from nerfstudio.plugins.types import MethodSpecification

from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints
from odin_nerfstudio.ns.datamanager import OdinDatamanagerConfig
from odin_nerfstudio.ns.dataparser import OdinColmapDataParserConfig
from odin_nerfstudio.ns.model import OdinSplatModelConfig
from odin_nerfstudio.ns.pipeline import OdinPipelineConfig
from odin_nerfstudio.ns.startup import prepare_command, skip_catalogue_stack_walk
from odin_nerfstudio.ns.trainer import OdinTrainerConfig, SelectiveAdamOptimizerConfig

allow_nerfstudio_checkpoints()
skip_catalogue_stack_walk()  # nerfstudio builds its catalogue right after loading its plugins


def _adam(lr: float) -> SelectiveAdamOptimizerConfig:
    """Selective Adam (the runtime's optimizer) with splatfacto's epsilon."""
    return SelectiveAdamOptimizerConfig(lr=lr, eps=1e-15)


def odin_splat_optimizers(max_steps: int = 30000) -> dict:
    """Splatfacto's per-group learning rates and schedules for the Gaussian parameters (the runtime trains only
    those: splatfacto's camera optimizer and bilateral grid stay off)."""
    return {
        "means": {
            "optimizer": _adam(1.6e-4),
            "scheduler": ExponentialDecaySchedulerConfig(lr_final=1.6e-6, max_steps=max_steps),
        },
        "features_dc": {"optimizer": _adam(0.0025), "scheduler": None},
        "features_rest": {"optimizer": _adam(0.0025 / 20), "scheduler": None},
        "opacities": {"optimizer": _adam(0.05), "scheduler": None},
        "scales": {"optimizer": _adam(0.005), "scheduler": None},
        "quats": {"optimizer": _adam(0.001), "scheduler": None},
    }


odin_splat = MethodSpecification(
    config=OdinTrainerConfig(
        method_name="odin-splat",
        steps_per_eval_image=100,
        steps_per_eval_batch=0,
        steps_per_save=2000,
        steps_per_eval_all_images=1000,
        max_num_iterations=30000,
        mixed_precision=False,
        pipeline=OdinPipelineConfig(
            datamanager=OdinDatamanagerConfig(
                dataparser=OdinColmapDataParserConfig(load_3D_points=True),
                cache_images_type="uint8",
            ),
            model=OdinSplatModelConfig(),
        ),
        optimizers=odin_splat_optimizers(),
        viewer=ViewerConfig(num_rays_per_chunk=1 << 15),
        vis="viewer",
    ),
    description=(
        "Odin: 3D Gaussian Splatting with primitive-level synchronization across workers (CPU or CUDA); "
        "options --runtime.*, --pipeline.datamanager.num-workers, --pipeline.datamanager.views-per-step."
    ),
)

prepare_command()
