"""OdinSplatModel's training tasks on Odin's runtime: task cameras, the task renderer, the runtime over the model.

The runtime (core, no nerfstudio) sees a task only through a render function of gathered leaves; this module
supplies it from the model: splatfacto's image (render + random background + clamp) and loss (L1 and SSIM
against the view's cached image), with the background drawn from the task's own generator, so any worker, any
order and any re-run draw the same colour. Densification follows gsplat's DefaultStrategy with the statistics
the runtime accumulates per task and the edits applied behind its drain barrier (`adapter/gsplat.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig
from torch import Tensor

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.culling.candidates import CullRegion
from odin_nerfstudio.ns.model import OdinSplatModel, get_viewmat
from odin_nerfstudio.adapter.gsplat import GsplatAdapter, apply_structural_change, structural_change_due
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.runtime.runtime import EscapeCheck, OdinRuntime
from odin_nerfstudio.core.selective_adam import SelectiveAdam, selective_adams
from odin_nerfstudio.core.tasks import Task, TaskKey, step_tasks
from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.comm.protocol import Transport
from odin_nerfstudio.drivers.virtual import run_virtual
from odin_nerfstudio.kernels import ops

GAUSSIAN_PARAMS = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


def odin_camera(cameras: Cameras, index: int, device: torch.device | str = "cpu") -> Camera:
    """View `index` of nerfstudio cameras as the runtime's pinhole camera (OpenCV world-to-camera [4, 4])."""
    camera = cameras[index : index + 1]
    return Camera(
        viewmat=get_viewmat(camera.camera_to_worlds)[0].to(device),
        K=camera.get_intrinsics_matrices()[0].to(device),
        width=int(camera.width.item()),
        height=int(camera.height.item()),
    )


def downscaled(camera: Camera, factor: int) -> Camera:
    """The camera at 1/factor resolution, rounded down as nerfstudio's `rescale_output_resolution` does."""
    if factor == 1:
        return camera
    K = camera.K.clone()
    K[:2] /= factor
    return Camera(camera.viewmat, K, int(camera.width / factor), int(camera.height / factor))


class SplatTaskRenderer:
    """Renders a task from gathered Gaussians with OdinSplatModel and returns splatfacto's loss and the meta.

    Args:
        model: the model; its `gauss_params` are the runtime's parameters, its config sets SH degree,
            background, rasterize mode, SSIM weight and resolution schedule.
        images: per training view, its image [H, W, 3] (uint8 or float in [0, 1]).
    """

    def __init__(self, model: OdinSplatModel, images: Sequence[Tensor]) -> None:
        config = model.config
        unsupported = {
            "use_scale_regularization": config.use_scale_regularization,
            "use_bilateral_grid": config.use_bilateral_grid,
            "camera_optimizer.mode != 'off'": config.camera_optimizer.mode != "off",
        }
        enabled = [name for name, on in unsupported.items() if on]
        if enabled:
            raise ValueError(f"The Odin runtime does not support {', '.join(enabled)} yet; disable it.")
        self.model = model
        self.images = images
        self.losses: dict[TaskKey, Tensor] = {}

    def background(self, generator: torch.Generator) -> Tensor:
        """The task's background colour [3]: random from its generator, or the configured colour."""
        if self.model.config.background_color == "random":
            return torch.rand(3, generator=generator, device=generator.device).to(self.model.device)
        return self.model._get_background_color()

    def __call__(self, task: Task, leaves: dict[str, Tensor], generator: torch.Generator) -> tuple[Tensor, dict]:
        """Loss of `task` rendered from `leaves` ([M, ...] per name), and the rasterizer's meta."""
        model = self.model
        camera = self.render_camera(task)
        render, alpha, info = model.render_gaussians(
            leaves, camera.viewmat[None], camera.K[None], camera.width, camera.height, step=task.step
        )
        background = self.background(generator)
        rgb = torch.clamp(render[0, ..., :3] + (1 - alpha[0]) * background, 0.0, 1.0)
        gt = model.composite_with_background(model.get_gt_img(self.images[task.view], task.step), background)
        l1 = torch.abs(gt - rgb).mean()
        ssim = model.ssim(gt.permute(2, 0, 1)[None], rgb.permute(2, 0, 1)[None])
        loss = (1 - model.config.ssim_lambda) * l1 + model.config.ssim_lambda * (1 - ssim)
        self.losses[task.key] = loss.detach()
        return loss, info

    def pop_losses(self, step: int) -> list[Tensor]:
        """The losses of ``step``'s tasks rendered here (a re-run's replaces its first render), in task order; those
        of earlier steps (late re-runs, after their step was logged) are dropped, so the dict stays bounded."""
        held = list(self.losses)  # one copy: a lane may add a later step's loss meanwhile
        losses = [self.losses.pop(key) for key in sorted(key for key in held if key[0] == step)]
        for key in [key for key in held if key[0] < step]:
            del self.losses[key]
        return losses

    def render_camera(self, task: Task) -> Camera:
        """The camera `task` renders with: its camera at the downscale of the resolution schedule at its step
        (not at the model's step: validation runs after later tasks have rendered, and lanes render tasks of
        several steps side by side)."""
        return downscaled(task.camera, self.model._get_downscale_factor(task.step))

    def drawable(self, task: Task) -> CullRegion:
        """Where `visible` can find a row for `task`: the drawable region of the camera it projects with, with
        `drawn_rows`' default blur and near plane. Outside it every Gaussian has radius 0 (proof in
        `CullRegion.drawable`), so the runtime's escape check asks `visible` only about the rows inside it and
        outside C(t)."""
        return CullRegion.drawable(self.render_camera(task))

    @torch.no_grad()
    def visible(self, task: Task, rows: dict[str, Tensor]) -> Tensor:
        """Which of the given parameter rows ([M, ...] per name) the rasterizer would draw for `task`, bool [M].

        Each row is decided on its own (a projection, no compositing), so it may be asked about any subset. The
        rasterizer is imported here, as the model imports it when it renders: a plugin whose optional import fails
        must not break every ns-* command at registration (``tests/ns/test_training.py``).
        """
        from odin_nerfstudio.rendering.rasterize import drawn_rows

        return drawn_rows(self.render_camera(task), rows)

    @property
    def visible_reads(self) -> tuple[str, ...]:
        """The parameters :meth:`visible` reads (a Gaussian's geometry): the runtime gathers only these for it."""
        from odin_nerfstudio.rendering.rasterize import DRAWN_ROWS_READS

        return DRAWN_ROWS_READS


def splat_learning_rates(optimizers: dict[str, Any]) -> dict[str, float]:
    """The learning rate of each Gaussian parameter group in a nerfstudio `optimizers` config."""
    return {name: optimizers[name]["optimizer"].lr for name in GAUSSIAN_PARAMS}


def build_runtime(
    model: OdinSplatModel,
    images: Sequence[Tensor],
    config: OdinRuntimeConfig,
    optimizers: dict[str, SelectiveAdam],
    transports: Sequence[Transport] | None = None,
    check_escapes: bool = True,
    start_step: int = 0,
    topology: Topology | None = None,
    seed: int = 0,
    renderer: SplatTaskRenderer | None = None,
) -> OdinRuntime:
    """An Odin runtime that trains `model.gauss_params` in place with `optimizers` (one selective Adam per
    Gaussian parameter) and the model's strategy; its statistics start from zero.

    Without `transports`, the W workers of `topology` (default: one) share one in-process (virtual) transport; every
    random draw of a task derives from `seed`. With `check_escapes`, every task is validated against the rows the
    rasterizer would draw outside its candidate set (a projection of the rows of its drawable region outside C(t), see
    `SplatTaskRenderer.drawable`); an escape is counted and, in the barrier and quality-first, re-run (throughput-first
    counts it only). `start_step` > 0 resumes after a checkpoint of step `start_step` - 1 (see `OdinRuntime`). The
    model's batch rule (`model.batch`, set by `scale_to_batch`) gives the runtime its adaptive gain, if any. `renderer`:
    the task renderer over `model` and `images` (default: a new one; a trainer keeps its own to read the tasks' losses).
    """
    params = model.gauss_params
    topology = topology if topology is not None else Topology()
    if transports is None:
        virtual = VirtualTransport(topology.num_workers, params, ops.scatter_in_order)
        transports = [virtual.endpoint(w) for w in range(topology.num_workers)]
    missing = [name for name in GAUSSIAN_PARAMS if not isinstance(optimizers.get(name), SelectiveAdam)]
    if missing:
        raise ValueError(f"the runtime needs a SelectiveAdam for each Gaussian parameter; missing for {missing}")
    model.strategy_state = model.strategy.initialize_state(scene_scale=1.0)
    renderer = renderer if renderer is not None else SplatTaskRenderer(model, images)
    escapes = EscapeCheck(renderer.visible, renderer.drawable, renderer.visible_reads) if check_escapes else None
    return OdinRuntime(
        config,
        params,
        {name: optimizers[name] for name in GAUSSIAN_PARAMS},
        transports,
        renderer,
        visibility_fn=escapes,
        strategy_state=model.strategy_state,
        start_step=start_step,
        adapter=GsplatAdapter(packed=False, absgrad=model.strategy.absgrad),
        topology=topology,
        seed=seed,
        batch_gain=model.batch.gain(),
    )


def structural_change(model: OdinSplatModel, runtime: OdinRuntime, step: int) -> Tensor:
    """The densify / prune / reset gsplat would make after `step`, applied to the runtime's model (seeded by the
    runtime's seed); returns the index map for `OdinRuntime.remap`."""
    state, seed = runtime.strategy_state, runtime.seed
    return apply_structural_change(model.strategy, runtime.params, runtime.optimizers, state, step, seed)


def structural_changes(model: OdinSplatModel, num_steps: int) -> dict:
    """For the virtual driver: before step s + 1, the `structural_change` after step s, where one is due."""
    return {
        step + 1: functools.partial(structural_change, model, step=step)
        for step in range(num_steps - 1)
        if structural_change_due(model.strategy, step)
    }


def schedule_tasks(
    steps: Sequence[Sequence[Sequence[int]]], cameras: Cameras, first_step: int = 0, device: str = "cpu"
) -> list[list[list[Task]]]:
    """Runtime tasks of consecutive schedule steps: step -> worker -> tasks, from each step's views per worker."""
    views = {view for step in steps for worker in step for view in worker}
    camera_of = {view: odin_camera(cameras, view, device) for view in views}
    return [step_tasks(first_step + s, step, camera_of.__getitem__) for s, step in enumerate(steps)]


def train_virtual(
    pipeline_config: VanillaPipelineConfig,
    runtime_config: OdinRuntimeConfig,
    num_steps: int,
    learning_rates: dict[str, float],
    interleaving: Iterable[int] = (),
    device: str = "cpu",
    seed: int = 0,
) -> tuple[VanillaPipeline, OdinRuntime]:
    """Train an odin-splat pipeline for `num_steps` schedule steps on W virtual workers in one process.

    W and B come from the pipeline's OdinDatamanager schedule; the model is initialised under
    `torch.manual_seed(seed)`, so two calls that differ only in mode or interleaving start from the same Gaussians
    (the ablations and equivalence checks compare them).
    """
    torch.manual_seed(seed)
    pipeline = pipeline_config.setup(device=device, test_mode="val", world_size=1, local_rank=0)
    datamanager, model = pipeline.datamanager, pipeline.model
    model.train()
    images = [datamanager.cached_train[i]["image"] for i in range(len(datamanager.cached_train))]
    optimizers = selective_adams(model.gauss_params, learning_rates)
    topology = Topology.of(datamanager.schedule.config)
    runtime = build_runtime(model, images, runtime_config, optimizers, topology=topology, seed=seed)
    steps = [datamanager.schedule.at(s).tasks for s in range(num_steps)]
    tasks = schedule_tasks(steps, datamanager.train_dataset.cameras, device=str(model.device))
    run_virtual(runtime, tasks, interleaving, structural_changes(model, num_steps))
    return pipeline, runtime
