"""`odin-splat-quick`: odin-splat with splatfacto's refinement schedule compressed to a CPU-sized run.

splatfacto's schedule is made for 30,000 iterations on a GPU: it trains at 1/4 then 1/2 resolution for the first
6,000, densifies from step 500 every 100 steps until 15,000, resets opacities every 3,000 and adds an SH degree
every 1,000. A CPU run of a thousand iterations would train at 1/4 resolution throughout and densify only in its
second half. This variant keeps every model, loss and optimizer setting of odin-splat and moves only the schedule:
full resolution from the start, densification from step 100 every 50 steps until step 700, no opacity reset, an SH
degree every 100 steps, and a higher densification threshold (0.002 against 0.0008: at 0.0008 the Gaussians of a
64x48 synthetic street doubled at every refinement, to 84,000 by step 550). It is what `scripts/quickstart.sh` trains.
"""

from __future__ import annotations

import copy

from nerfstudio.plugins.types import MethodSpecification

from odin_nerfstudio.method_configs.odin_splat import odin_splat

QUICK_ITERATIONS = 1000


def odin_splat_quick_config():
    """odin-splat's trainer config with the compressed schedule described in the module docstring."""
    config = copy.deepcopy(odin_splat.config)
    config.method_name = "odin-splat-quick"
    config.max_num_iterations = QUICK_ITERATIONS
    config.steps_per_save = QUICK_ITERATIONS
    config.steps_per_eval_image = 100
    config.steps_per_eval_all_images = QUICK_ITERATIONS
    model = config.pipeline.model
    model.num_downscales = 0
    model.warmup_length = 100
    model.refine_every = 50
    model.stop_split_at = 700
    model.reset_alpha_every = QUICK_ITERATIONS  # x refine_every: beyond the run, so no opacity reset
    model.densify_grad_thresh = 0.002
    model.sh_degree_interval = 100
    return config


odin_splat_quick = MethodSpecification(
    config=odin_splat_quick_config(),
    description="odin-splat with splatfacto's schedule compressed to 1,000 iterations: a CPU run that densifies.",
)
