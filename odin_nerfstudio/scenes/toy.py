"""A small differentiable Gaussian scene: a ring of Gaussians seen by outward-looking views.

Why: the runtime's equivalence and property tests run hundreds of tasks; a splat renderer of a few lines (isotropic
screen-space Gaussians, normalized blending, 8 x 8 pixels) keeps them fast while reading exactly the rows of the
gathered parameters, with gsplat's parameter layout (log-scales, logit opacities) and a ``radii`` meta whose
positive entries are the rows it sees. Neighbouring views overlap, so tasks conflict on shared Gaussians.

The same ring, its cameras and schedule, and :func:`splat` (a task's gathered rows through the project's
rasterizer, gsplat's call) serve the tests, ``scripts/gpu_check.py`` (larger images, on CUDA) and the benchmarks
(``splat`` with SH bands, on a street).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from odin_nerfstudio.core.batch_gain import AdaptiveGain
from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.rendering.rasterize import rasterization
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology
from odin_nerfstudio.runtime.runtime import OdinRuntime
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.comm.inprocess import VirtualTransport

IMAGE = 8
NEAR = 0.01
LRS = {"means": 0.05, "scales": 0.02, "quats": 0.01, "opacities": 0.05, "features_dc": 0.05}


def make_params(
    num_gaussians: int = 120,
    seed: int = 0,
    height: float = 0.6,
    scales: tuple[float, float] = (0.05, 0.1),
    device: torch.device | str = "cpu",
) -> dict[str, torch.nn.Parameter]:
    """Gaussians on a ring of radius 3 around the origin, gsplat's layout: means [N, 3], log-scales [N, 3], ...

    ``height``: the ring's height (m); ``scales``: each axis' scale drawn from ``scales[0] + scales[1] x U(0, 1)``.
    """
    generator = torch.Generator().manual_seed(seed)
    angle = torch.rand(num_gaussians, generator=generator) * 2 * math.pi
    radius = 3.0 + 0.3 * torch.randn(num_gaussians, generator=generator)
    y = height * (torch.rand(num_gaussians, generator=generator) - 0.5)
    means = torch.stack([radius * torch.sin(angle), y, radius * torch.cos(angle)], dim=-1)
    smallest, spread = scales
    values = {
        "means": means,
        "scales": torch.log(smallest + spread * torch.rand(num_gaussians, 3, generator=generator)),
        "quats": torch.randn(num_gaussians, 4, generator=generator),
        "opacities": torch.randn(num_gaussians, generator=generator),
        "features_dc": torch.rand(num_gaussians, 3, generator=generator),
    }
    return {name: torch.nn.Parameter(value.to(device)) for name, value in values.items()}


def camera(view: int, num_views: int, size: int = IMAGE, focal_scale: float = 0.75) -> Camera:
    """View ``view`` of ``num_views`` at the origin, looking outward at yaw 2 pi view / num_views.

    ``focal_scale`` is the focal length in image widths: 0.75 gives overlapping views (a dense scene), 2 narrow
    ones that share few Gaussians (a sparse scene).
    """
    yaw = 2 * math.pi * view / num_views
    forward = torch.tensor([math.sin(yaw), 0.0, math.cos(yaw)])
    down = torch.tensor([0.0, 1.0, 0.0])
    right = torch.linalg.cross(down, forward)
    viewmat = torch.eye(4)
    viewmat[:3, :3] = torch.stack([right, down, forward])
    focal = focal_scale * size
    K = torch.tensor([[focal, 0.0, size / 2], [0.0, focal, size / 2], [0.0, 0.0, 1.0]])
    return Camera(viewmat=viewmat, K=K, width=size, height=size)


def target(view: int) -> Tensor:
    """The ground-truth image of a view, [H, W, 3]."""
    return torch.rand(IMAGE, IMAGE, 3, generator=torch.Generator().manual_seed(1000 + view))


def _project(rows: dict[str, Tensor], cam: Camera) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Screen position [M, 2], screen sigma [M], depth [M] and visibility bool [M] of parameter rows."""
    points = rows["means"] @ cam.viewmat[:3, :3].T + cam.viewmat[:3, 3]
    depth = points[:, 2]
    safe_depth = torch.where(depth > NEAR, depth, torch.ones_like(depth))
    focal = cam.K[0, 0]
    xy = focal * points[:, :2] / safe_depth[:, None] + cam.K[:2, 2]
    sigma = focal * torch.exp(rows["scales"]).max(dim=-1).values / safe_depth
    reach = 3.0 * sigma
    visible = (depth > NEAR) & (xy[:, 0] + reach > 0) & (xy[:, 0] - reach < cam.width)
    visible &= (xy[:, 1] + reach > 0) & (xy[:, 1] - reach < cam.height)
    return xy, sigma, depth, visible


def visibility(task: Task, rows: dict[str, Tensor]) -> Tensor:
    """The rows the toy renderer sees for ``task``, bool [M]."""
    return _project(rows, task.camera)[3]


def render(task: Task, leaves: dict[str, Tensor], generator: torch.Generator) -> tuple[Tensor, dict[str, Any]]:
    """Toy splatting of the gathered rows into an 8 x 8 image; loss = MSE against the view's target.

    The background colour is drawn from the task's generator, as a random-background trainer would.
    """
    xy, sigma, _, visible = _project(leaves, task.camera)
    pixels = torch.stack(
        torch.meshgrid(torch.arange(IMAGE) + 0.5, torch.arange(IMAGE) + 0.5, indexing="xy"), dim=-1
    ).reshape(-1, 2)
    offset = pixels[:, None, :] - xy[None, :, :]  # [P, M, 2]
    falloff = torch.exp(-0.5 * offset.square().sum(-1) / sigma.square()[None, :])
    weight = torch.sigmoid(leaves["opacities"])[None, :] * falloff * visible[None, :].float()  # [P, M]
    background = torch.rand(3, generator=generator)
    total = weight.sum(dim=1, keepdim=True)
    image = (weight @ leaves["features_dc"] + background) / (1.0 + total)
    loss = (image.reshape(IMAGE, IMAGE, 3) - target(task.view)).square().mean()
    radii = torch.where(visible, torch.ceil(3 * sigma.detach()).clamp(min=1), 0).to(torch.int32)[None]
    return loss, {"radii": radii}


def splat(task: Task, leaves: dict[str, Tensor], generator: torch.Generator) -> tuple[Tensor, dict[str, Any]]:
    """Render a task from its gathered rows through the project's rasterizer (gsplat's call, non-packed): the image
    [H, W, 3] over a background drawn from the task's generator, and the rasterizer's meta.

    ``leaves`` hold gsplat's parameter layout (log-scales, logit opacities) on one device; the task's camera is
    moved there. Colours are ``features_dc`` [M, 3], or with ``features_rest`` [M, K, 3] the SH coefficients of
    degree sqrt(K + 1) - 1.
    """
    device = leaves["means"].device
    background = torch.rand(1, 3, generator=generator).to(device)
    colors, sh_degree = leaves["features_dc"], None
    if "features_rest" in leaves:
        colors = torch.cat([leaves["features_dc"][:, None], leaves["features_rest"]], dim=1)
        sh_degree = math.isqrt(colors.shape[1]) - 1
    cam = task.camera
    image, _, info = rasterization(
        leaves["means"],
        leaves["quats"],
        torch.exp(leaves["scales"]),
        torch.sigmoid(leaves["opacities"]),
        colors,
        cam.viewmat[None].to(device),
        cam.K[None].to(device),
        cam.width,
        cam.height,
        sh_degree=sh_degree,
        packed=False,
        backgrounds=background,
    )
    return image[0], info


def render_gsplat(task: Task, leaves: dict[str, Tensor], generator: torch.Generator) -> tuple[Tensor, dict[str, Any]]:
    """The same task through the project's rasterizer call (:func:`splat`: gsplat on CUDA, the CPU twin on CPU), L1
    against the view's target."""
    image, info = splat(task, leaves, generator)
    return (image - target(task.view)).abs().mean(), info


def make_schedule(
    num_steps: int,
    num_workers: int,
    per_worker: int,
    num_views: int,
    seed: int = 0,
    focal_scale: float = 0.75,
    size: int = IMAGE,
) -> list:
    """step -> worker -> tasks: each step takes W x B views from seeded shuffles (distinct while W x B <= V), seen
    by :func:`camera` at ``size`` x ``size`` pixels."""
    generator = torch.Generator().manual_seed(seed)
    schedule = []
    shuffles = -(-num_workers * per_worker // num_views)
    for step in range(num_steps):
        views = torch.cat([torch.randperm(num_views, generator=generator) for _ in range(shuffles)]).tolist()
        chosen = [[views[w * per_worker + b] for b in range(per_worker)] for w in range(num_workers)]
        schedule.append(
            [
                [
                    Task(step, w, b, view, camera(view, num_views, size, focal_scale))
                    for b, view in enumerate(chosen[w])
                ]
                for w in range(num_workers)
            ]
        )
    return schedule


def make_runtime(
    config: OdinRuntimeConfig,
    params: dict[str, torch.nn.Parameter],
    render_fn=render,
    visibility_fn=None,
    strategy_state: dict | None = None,
    lr_scale: float = 1.0,
    topology: Topology = Topology(),
    batch_gain: AdaptiveGain | None = None,
    clock: Callable[[], int] | None = None,
) -> OdinRuntime:
    """A runtime over ``params`` with selective Adams (LRS x lr_scale) and a virtual transport for its W workers
    (and the adaptive batch rule's gain, if given; ``clock``: its timeline's, default the wall clock)."""
    transport = VirtualTransport(topology.num_workers, params)
    return OdinRuntime(
        config,
        params,
        selective_adams(params, {name: lr * lr_scale for name, lr in LRS.items()}),
        [transport.endpoint(w) for w in range(topology.num_workers)],
        render_fn,
        visibility_fn=visibility_fn,
        strategy_state=strategy_state,
        topology=topology,
        batch_gain=batch_gain,
        clock=clock,
    )


def snapshot(runtime: OdinRuntime) -> dict[str, Tensor]:
    """Every parameter and Adam moment of a runtime's model, cloned, keyed ``name`` / ``name.exp_avg`` / ..."""
    out = {}
    for name, param in runtime.params.items():
        out[name] = param.detach().clone()
        state = runtime.optimizers[name].state[param]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            out[f"{name}.{key}"] = state[key].clone()
    return out


def assert_identical(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    """Bit-identical tensors under the same keys."""
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs (max |diff| {(a[key] - b[key]).abs().max()})"
