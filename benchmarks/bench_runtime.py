"""Runtime benchmark: Odin's bookkeeping share of step time and its peak shadow memory, on a sparse street.

Why: the runtime must cost little beside the renderer. Targets: bookkeeping (before_read + after_backward +
publish, and progress(); the render and backward of re-runs excluded; the in-process exchange's merge included,
though the runtime files it under communication) <= 3% of step time, and peak Shadow Graph
memory (gathered leaves, their gradients, staged updates, declared candidate sets) <= 10% of the model's
parameter bytes.

Scene. ``synth.street_world``: a long straight street (two 4 m facades 8 m apart and the road) of flat Gaussians,
gsplat's layout with SH degree 3 (``features_dc`` [N, 3], ``features_rest`` [N, 15, 3], as splatfacto). The
cameras are a street-scan rig: a left and a right camera every ``--spacing`` m at 1.6 m, looking at the facades
(yaw 90 deg, turned 20 deg forward or backward at alternate positions, 8 deg down). ``synth.street_cameras``
pans down the street instead, and a view along a street without a far plane reads everything ahead of it (its
candidate sets hold 27% of the model on average, 98% at most, on the 300 m street), which a city-scale trainer
never faces; a side camera sees a few metres of street, about 1% of a 300 m street, the regime Odin is built
for. Targets are rendered from the true world; the model starts from it perturbed (means, log-scales, quats,
logit opacities, colours), so every task has gradients. The schedule is Odin's: an RLG over the views (its "SfM
points" are every 16th Gaussian inside each view's frustum) and the first epoch of ``Schedule``.

Run. W = 4 virtual workers, B = 1, K = 4 ring slots, L1 loss through ``odin_nerfstudio.rendering.rasterize.rasterization``
(pure torch on CPU, gsplat on CUDA) with a background drawn from the task's generator, selective Adam. Quality-
first and the barrier reference run the same schedule from the same start, one after the other in the same
process, and must end bit-identical; a third run repeats quality-first with the escape check (the rows of each
task's drawable region outside C(t) projected, what ``OdinSplatModel`` validates with by default). The last
worker takes ``--ahead`` turns first (a fast worker), then the workers take turns round-robin; one torch thread
unless ``--threads`` says otherwise. Virtual workers share one device and one replica, so steps/s counts all W
workers' work (it shows the runtime's overhead and re-runs, not Odin's overlap gain) and the shadow peak holds
all W workers' in-flight gathers. A sweep repeats both modes with one thing changed: a shorter street with the
same Gaussians (each view reads a larger share of the model) and larger images (a costlier render per task).

Backends. Every headline mode runs once per bookkeeping backend (``--backends``): ``compiled``, the C++ ops of
``cuda/csrc`` (``odin_nerfstudio.kernels.ops``, the runtime's default when built) and ``reference``, their pure-torch
reference (``ops.use_reference()``), on the same scene in the same process; the sweep runs the first backend
only. Both must end bit-identical. A second table reads bookkeeping per task per backend side by side, on the
street and on fern (``--fern``: the shared COLMAP scene trained by odin-splat with its defaults, ``--fern-steps``
schedule steps of its W virtual workers, escape checks and densification as configured; 0 skips it), each figure
the median of ``--backend-rounds`` rounds of every (backend, mode) run, odd rounds in the reverse order (a single
run of a few seconds per backend moved the street's ratio by 10 points from one run to the next). Targets:
the compiled backend's bookkeeping at most half the reference's on the street, and at most 3% of render +
backward on fern.

Usage: ``python benchmarks/bench_runtime.py [--device cuda] [--quick]``; ``--quick`` runs a small scene for a
few steps (seconds; for tests and GPU checks) and never writes BENCHMARKS.md. Otherwise the figures replace the
section between ``<!-- bench_runtime:start -->`` and ``<!-- bench_runtime:end -->``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _report import BENCHMARKS, identical, machine, model_state, publish
from torch import Tensor

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion, candidate_set
from odin_nerfstudio.rendering.rasterize import drawn_rows, rasterization
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.core.row_order import spatial_order
from odin_nerfstudio.runtime.config import Topology
from odin_nerfstudio.runtime.runtime import EscapeCheck, OdinRuntime, OdinRuntimeConfig
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.runtime.shadow import MEMORY_KINDS
from odin_nerfstudio.core.sparse import tensor_bytes
from odin_nerfstudio.scenes.synth import GaussianWorld, intrinsics, street_rig_cameras, street_world
from odin_nerfstudio.scenes.toy import splat
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.drivers.virtual import VirtualRunReport, run_virtual
from odin_nerfstudio.kernels import ops

NAME = "bench_runtime"
TARGET_BOOKKEEPING, TARGET_MEMORY = 0.03, 0.10
TARGET_COMPILED_OVER_REFERENCE = 0.5
"""The compiled backend's bookkeeping per task over the reference's, on the street (at most)."""
BACKENDS = ("compiled", "reference")
SHARED_DATA = Path(os.environ.get("ODIN_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
SH_C0 = 0.28209479177387814
SH_DEGREE = 3
POINT_STRIDE = 16
FOV_DEG = 70.0
MODES = ("quality", "barrier")
LRS = {
    "means": 1e-3,
    "scales": 5e-3,
    "quats": 1e-3,
    "opacities": 5e-2,
    "features_dc": 2.5e-3,
    "features_rest": 2.5e-3 / 20,
}
"""splatfacto's learning rates; the means' rate is in metres (splatfacto's 1.6e-4 times a ~6 m scene scale)."""


@dataclass(frozen=True)
class Variant:
    """What changes between the headline run and the sweep: street length (m), image size (px), steps, and whether
    the runtime keeps the rows in Z-order (``OdinRuntimeConfig.spatial_order``, its default)."""

    length: float
    width: int
    height: int
    steps: int
    spatial_order: bool = True

    @property
    def label(self) -> str:
        """``300 m, 128x96`` (``, rows as generated`` without the spatial order)."""
        return f"{self.length:.0f} m, {self.width}x{self.height}" + (
            "" if self.spatial_order else ", rows as generated"
        )


@dataclass(frozen=True)
class Scene:
    """What both modes train on: the model's starting parameters, the cameras, their targets and the schedule.

    Attributes:
        variant: the street length, image size and steps.
        start: per name, the starting parameter [N, ...] (gsplat's layout).
        cameras: per view, its camera.
        targets: per view, the image rendered from the true world, [H, W, 3] (None for views never trained).
        schedule: step -> worker -> the worker's tasks of the step.
    """

    variant: Variant
    start: dict[str, Tensor]
    cameras: list[Camera]
    targets: list[Tensor | None]
    schedule: list[list[list[Task]]]

    @property
    def num_gaussians(self) -> int:
        """N."""
        return self.start["means"].shape[0]

    @property
    def num_views(self) -> int:
        """Views trained per mode (every task of the schedule once)."""
        return sum(len(tasks) for step in self.schedule for tasks in step)


@dataclass
class TaskSizes:
    """Per render (re-runs included): |C(t)| (the gathered rows) and |A(t)| (rows with radii > 0)."""

    candidate: list[int] = field(default_factory=list)
    active: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ModeResult:
    """One mode's run: its wall time, the runtime (counters, memory, final state) and the driver's report."""

    mode: str
    escapes: bool
    wall_s: float
    runtime: OdinRuntime
    report: VirtualRunReport
    sizes: TaskSizes
    backend: str = "compiled"

    @property
    def label(self) -> str:
        """The mode, whether tasks were validated for escapes, and the bookkeeping backend."""
        return (f"{self.mode} + escape check" if self.escapes else self.mode) + f" ({self.backend})"

    @property
    def steps(self) -> int:
        """Steps published."""
        return self.runtime.counters.publications

    @property
    def bookkeeping_ns(self) -> int:
        """The runtime's hooks with the in-process exchange: the runtime counts the transport's time (here the merge
        of the W workers' updates, no waiting) as communication, but in one process it is bookkeeping too."""
        counters = self.runtime.counters
        return counters.bookkeeping_ns + counters.comm_ns

    def share(self, what: str) -> float:
        """A headline ratio: "bookkeeping" or "render" (render + backward) of the wall time, "memory" (peak
        shadow bytes over parameter bytes) or "memory_adam" (over parameters + Adam's two moments)."""
        counters, memory = self.runtime.counters, self.runtime.memory_report()
        wall_ns = self.wall_s * 1e9
        return {
            "bookkeeping": self.bookkeeping_ns / wall_ns,
            "render": (counters.render_ns + counters.backward_ns) / wall_ns,
            "memory": memory["peak_extra_bytes"] / memory["model_bytes"],
            "memory_adam": memory["peak_extra_bytes"] / (3 * memory["model_bytes"]),
        }[what]


@dataclass(frozen=True)
class StreetRun:
    """One variant trained in every mode: its scene, the per-mode results (quality, barrier, then any
    extra), and the runtime's candidate culling timed apart (ms per task)."""

    scene: Scene
    results: list[ModeResult]
    culling_ms: float

    @property
    def quality(self) -> ModeResult:
        """The quality-first run without escape checks."""
        return self.results[0]

    @property
    def barrier(self) -> ModeResult:
        """The barrier reference."""
        return self.results[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick`` shrinks the scene and the steps, drops the sweep, and never writes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (pure-torch rasterizer) or cuda (gsplat)")
    parser.add_argument("--quick", action="store_true", help="small scene, a few steps, print only")
    parser.add_argument("--gaussians", type=int, default=200_000, help="N, Gaussians in the world")
    parser.add_argument("--length", type=float, default=300.0, help="street length of the headline run (m)")
    parser.add_argument("--size", default="128x96", help="image WxH of the headline run (px)")
    parser.add_argument("--steps", type=int, default=30, help="schedule steps per mode, headline run")
    parser.add_argument("--sweep-lengths", type=float, nargs="*", default=[100.0], help="other street lengths (m)")
    parser.add_argument("--sweep-sizes", nargs="*", default=["256x192"], help="other image sizes WxH (px)")
    parser.add_argument(
        "--sweep-unordered",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the headline street with the rows left in generation order (no spatial order)",
    )
    parser.add_argument("--sweep-steps", type=int, default=12, help="schedule steps per mode, sweep runs")
    parser.add_argument("--spacing", type=float, default=2.5, help="metres between rig positions")
    parser.add_argument("--workers", type=int, default=4, help="W, virtual workers")
    parser.add_argument("--views-per-worker", type=int, default=1, help="B, views per worker per step")
    parser.add_argument("--ahead", type=int, default=4, help="turns the last worker takes first (runs ahead)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=None,
        choices=BACKENDS,
        help="bookkeeping backends of the headline run (default: both, or the reference where the ops are not built)",
    )
    parser.add_argument(
        "--backend-rounds",
        type=int,
        default=3,
        help="rounds of every (backend, mode) run the backend table takes medians over, odd rounds in reverse order",
    )
    parser.add_argument("--fern", type=Path, default=SHARED_DATA / "fern", help="the fern COLMAP scene")
    parser.add_argument("--fern-steps", type=int, default=20, help="odin-splat schedule steps on fern (0: skip)")
    parser.add_argument("--seed", type=int, default=0, help="world, perturbation and schedule seed")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    if args.quick:
        args.gaussians, args.length, args.steps, args.no_write = 20_000, 60.0, 3, True
        args.sweep_lengths, args.sweep_sizes, args.sweep_unordered, args.fern_steps = [], [], False, 0
        args.backend_rounds = 2
    if args.backends is None:
        args.backends = list(BACKENDS) if ops.compiled(args.device) else ["reference"]
    if "compiled" in args.backends and not ops.compiled(args.device):
        parser.error(f"--backends compiled: the compiled odin ops for {args.device} are not built (see the warnings)")
    if args.fern_steps and not (args.fern / "sparse" / "0").is_dir():
        parser.error(f"--fern {args.fern}: no COLMAP model at sparse/0 (set ODIN_SHARED_DATA, or --fern-steps 0)")
    return args


def image_size(text: str) -> tuple[int, int]:
    """``"128x96"`` -> (128, 96)."""
    width, height = text.lower().split("x")
    return int(width), int(height)


def variants(args: argparse.Namespace) -> list[Variant]:
    """The headline run first, then the sweep: each sweep run changes the length or the image size only."""
    width, height = image_size(args.size)
    headline = Variant(args.length, width, height, args.steps)
    lengths = [Variant(length, width, height, args.sweep_steps) for length in args.sweep_lengths]
    sizes = [Variant(args.length, *image_size(size), args.sweep_steps) for size in args.sweep_sizes]
    unordered = [Variant(args.length, width, height, args.sweep_steps, spatial_order=False)] * args.sweep_unordered
    return [headline, *lengths, *sizes, *unordered]


def rig_cameras(variant: Variant, spacing: float, device: torch.device) -> list[Camera]:
    """``synth.street_rig_cameras`` along the variant's street at its image size (70 deg FOV), as runtime cameras."""
    viewmats = torch.tensor(street_rig_cameras(variant.length, spacing))
    K = torch.tensor(intrinsics(variant.width, variant.height, FOV_DEG), dtype=torch.float32, device=device)
    return [Camera(v.to(device=device, dtype=torch.float32), K, variant.width, variant.height) for v in viewmats]


def render_target(world: GaussianWorld, camera: Camera) -> Tensor:
    """The true world's image of ``camera``, [H, W, 3] (black background; the facades and road fill the frame).

    ``world`` lies on the camera's device. Only the rows inside the culling frustum are rasterized: the others
    have radii 0, so the image is the same.
    """
    rows = candidate_set(world.means, world.scales, camera, margin=0.1)
    image, _, _ = rasterization(
        world.means[rows],
        world.quats[rows],
        world.scales[rows],
        world.opacities[rows],
        world.colors[rows],
        camera.viewmat[None],
        camera.K[None],
        camera.width,
        camera.height,
        packed=False,
    )
    return image[0]


def perturbed_params(world: GaussianWorld, generator: torch.Generator, device: torch.device) -> dict[str, Tensor]:
    """The world in gsplat's parameter layout, perturbed so that training has something to fix.

    Means move by 0.3 disc radii, log-scales by 0.2, quats by 0.1, opacity logits drop by 1 (+- 0.3), colours
    move by 0.1 and the higher SH bands start at zero.
    """

    def noise(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator)

    n = world.means.shape[0]
    opacity = world.opacities.clamp(1e-4, 1 - 1e-4)
    params = {
        "means": world.means + 0.3 * world.scales[:, :1] * noise(n, 3),
        "scales": torch.log(world.scales) + 0.2 * noise(n, 3),
        "quats": world.quats + 0.1 * noise(n, 4),
        "opacities": torch.log(opacity / (1 - opacity)) - 1.0 + 0.3 * noise(n),
        "features_dc": (world.colors + 0.1 * noise(n, 3) - 0.5) / SH_C0,
        "features_rest": torch.zeros(n, (SH_DEGREE + 1) ** 2 - 1, 3),
    }
    return {name: value.to(device) for name, value in params.items()}


def odin_schedule(world: GaussianWorld, cameras: list[Camera], args: argparse.Namespace, steps: int) -> list:
    """The first ``steps`` steps of Odin's schedule: RLG over the views, "SfM points" every 16th Gaussian."""
    device = cameras[0].K.device
    points = world.means[::POINT_STRIDE].to(device)
    scales = world.scales[::POINT_STRIDE].to(device)
    point_sets = [candidate_set(points, scales, camera, margin=0.0).cpu().numpy() for camera in cameras]
    config = ScheduleConfig(num_workers=args.workers, views_per_worker=args.views_per_worker, seed=args.seed)
    schedule = Schedule(RelativeLocalityGraph.from_point_sets(point_sets), config)
    return [
        [
            [Task(s, w, b, view, cameras[view]) for b, view in enumerate(schedule.at(s).tasks[w])]
            for w in range(args.workers)
        ]
        for s in range(min(steps, schedule.steps_per_epoch))
    ]


def make_scene(args: argparse.Namespace, variant: Variant) -> Scene:
    """World, rig, schedule, targets of the views it trains, and the perturbed start of one variant."""
    device = torch.device(args.device)
    world = street_world(args.gaussians, np.random.default_rng(args.seed), variant.length)
    cameras = rig_cameras(variant, args.spacing, device)
    schedule = odin_schedule(world, cameras, args, variant.steps)
    trained = {task.view for step in schedule for tasks in step for task in tasks}
    on_device = GaussianWorld(*(getattr(world, f.name).to(device) for f in fields(GaussianWorld)))
    targets = [render_target(on_device, cam) if view in trained else None for view, cam in enumerate(cameras)]
    start = perturbed_params(world, torch.Generator().manual_seed(args.seed + 1), device)
    return Scene(variant, start, cameras, targets, schedule)


RenderFn = Callable[[Task, dict[str, Tensor], torch.Generator], tuple[Tensor, dict[str, Any]]]


def make_render_fn(scene: Scene, sizes: TaskSizes) -> RenderFn:
    """The task renderer: ``toy.splat`` (SH degree 3, a background from the task's generator), L1 to the view's target.

    Records |C(t)| and |A(t)| of every render in ``sizes``.
    """

    def render_fn(task: Task, leaves: dict[str, Tensor], generator: torch.Generator) -> tuple[Tensor, dict[str, Any]]:
        image, info = splat(task, leaves, generator)
        rows = leaves["means"].shape[0]
        sizes.candidate.append(rows)
        sizes.active.append(int((info["radii"] > 0).reshape(-1, rows).any(dim=0).sum()))
        return (image - scene.targets[task.view]).abs().mean(), info

    return render_fn


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA kernels (no-op on CPU), so that wall times include them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def visible(task: Task, rows: dict[str, Tensor]) -> Tensor:
    """Which parameter rows ([M, ...] per name) the rasterizer would draw for ``task``, bool [M] (escape check).

    What ``OdinSplatModel`` validates every task with by default: gsplat's projection (pure torch on CPU), no
    compositing.
    """
    return drawn_rows(task.camera, rows)


def drawable(task: Task) -> CullRegion:
    """Where :func:`visible` can find a row for ``task`` (the runtime projects only its rows outside C(t))."""
    return CullRegion.drawable(task.camera)


def run_mode(
    scene: Scene, mode: str, args: argparse.Namespace, escapes: bool = False, backend: str = "compiled"
) -> ModeResult:
    """Train a fresh copy of the start on W virtual workers in ``mode`` with the bookkeeping ``backend``; time the
    whole run.

    With ``escapes``, validation also projects the rows of the task's drawable region outside C(t) to check
    that no active row escaped C(t), as ``OdinSplatModel`` does by default.
    """
    with ops.use_reference(backend == "reference"):
        return _run_mode(scene, mode, args, escapes, backend)


def _run_mode(scene: Scene, mode: str, args: argparse.Namespace, escapes: bool, backend: str) -> ModeResult:
    """:func:`run_mode` with the backend chosen."""
    params = {name: torch.nn.Parameter(value.clone()) for name, value in scene.start.items()}
    config = OdinRuntimeConfig(mode=mode, spatial_order=scene.variant.spatial_order)
    transport = VirtualTransport(args.workers, params, ops.scatter_in_order)
    sizes = TaskSizes()
    runtime = OdinRuntime(
        config,
        params,
        selective_adams(params, LRS),
        [transport.endpoint(w) for w in range(args.workers)],
        make_render_fn(scene, sizes),
        visibility_fn=EscapeCheck(visible, drawable) if escapes else None,
        topology=Topology(args.workers, args.views_per_worker),
    )
    device = params["means"].device
    synchronize(device)
    start = time.perf_counter()
    report = run_virtual(runtime, scene.schedule, [args.workers - 1] * args.ahead)
    synchronize(device)
    return ModeResult(mode, escapes, time.perf_counter() - start, runtime, report, sizes, backend)


@dataclass(frozen=True)
class FernResult:
    """One odin-splat run on fern: its mode, backend, wall time and runtime (counters, timeline, final state)."""

    mode: str
    backend: str
    wall_s: float
    runtime: OdinRuntime


def run_fern(args: argparse.Namespace, mode: str, backend: str) -> FernResult:
    """Train odin-splat (its defaults: W, B, resolution schedule, escape checks, densification) on ``args.fern``
    for ``args.fern_steps`` schedule steps on virtual workers in ``mode`` with the bookkeeping ``backend``."""
    import copy
    import dataclasses

    from odin_nerfstudio.method_configs.odin_splat import odin_splat
    from odin_nerfstudio.ns.splat_runtime import splat_learning_rates, train_virtual

    config = copy.deepcopy(odin_splat.config)
    config.pipeline.datamanager.data = args.fern
    runtime_config = dataclasses.replace(config.runtime, mode=mode)
    lrs = splat_learning_rates(config.optimizers)
    with ops.use_reference(backend == "reference"):
        start = time.perf_counter()
        _, runtime = train_virtual(config.pipeline, runtime_config, args.fern_steps, lrs, device=args.device)
        synchronize(torch.device(args.device))
    return FernResult(mode, backend, time.perf_counter() - start, runtime)


def culling_ms(scene: Scene, repeats: int = 8) -> float:
    """Mean milliseconds of one candidate-set culling as the runtime does it (block index, built beforehand, rows
    in the runtime's order), timed apart."""
    means, log_scales = scene.start["means"], scene.start["scales"]
    if scene.variant.spatial_order:
        order = spatial_order(means)
        means, log_scales = means[order], log_scales[order]
    bounds = BoundingSpheres.of(means, torch.exp(log_scales))
    bounds.index()
    cameras = scene.cameras[:: max(1, len(scene.cameras) // repeats)][:repeats]
    synchronize(means.device)
    start = time.perf_counter()
    for camera in cameras:
        bounds.rows_in(CullRegion.candidates(camera, 0.1))
    synchronize(means.device)
    return (time.perf_counter() - start) * 1e3 / len(cameras)


def verdict(value: float, target: float) -> str:
    """``met`` or ``NOT met`` for a value that must stay at or below ``target``."""
    return "met" if value <= target else "NOT met"


def mib(nbytes: float) -> str:
    """Bytes as MiB, two decimals."""
    return f"{nbytes / 2**20:.2f} MiB"


def counts(mapping: dict[str, int]) -> str:
    """A counter dict as ``key n, key n`` (``0`` when empty)."""
    return ", ".join(f"{key} {value}" for key, value in sorted(mapping.items())) or "0"


def per_task_ms(result: ModeResult, nanoseconds: float) -> str:
    """Milliseconds per rendered task (re-runs included)."""
    return f"{nanoseconds / 1e6 / max(result.runtime.counters.tasks, 1):.1f} ms"


def time_rows(scene: Scene, result: ModeResult) -> list[tuple[str, str]]:
    """Throughput and the time shares of one mode."""
    counters = result.runtime.counters
    publish_ns = result.runtime.timeline.total_ns("publish")
    bookkeeping = result.share("bookkeeping")
    return [
        (
            "steps, views trained, tasks rendered (re-runs included)",
            f"{result.steps}, {scene.num_views}, {counters.tasks}",
        ),
        ("wall time of the run", f"{result.wall_s:.2f} s"),
        ("steps/s, views/s", f"{result.steps / result.wall_s:.2f}, {scene.num_views / result.wall_s:.2f}"),
        (
            "**bookkeeping share of step time** (target <= 3%)",
            f"**{bookkeeping:.2%}** ({verdict(bookkeeping, TARGET_BOOKKEEPING)})",
        ),
        ("bookkeeping per task", per_task_ms(result, result.bookkeeping_ns)),
        ("of which publish (selective Adam, tables), per task", per_task_ms(result, publish_ns)),
        (
            "render + backward share; per task",
            f"{result.share('render'):.2%}; {per_task_ms(result, counters.render_ns + counters.backward_ns)}",
        ),
        ("rest (driver, loss)", f"{1 - bookkeeping - result.share('render'):.2%}"),
    ]


def memory_rows(scene: Scene, result: ModeResult) -> list[tuple[str, str]]:
    """Peak shadow memory, its make-up and the task sizes behind it, of one mode."""
    memory = result.runtime.memory_report()
    n = scene.num_gaussians
    row_bytes = memory["model_bytes"] / n
    in_flight = memory["peak_leaves_bytes"] / (row_bytes * np.mean(result.sizes.candidate))
    parts = " + ".join(mib(memory[f"peak_{kind}_bytes"]) for kind in MEMORY_KINDS)
    return [
        (
            "**peak shadow memory / parameters** (headline, target <= 10%)",
            f"**{result.share('memory'):.2%}** ({verdict(result.share('memory'), TARGET_MEMORY)})",
        ),
        ("peak shadow memory / (parameters + Adam moments)", f"{result.share('memory_adam'):.2%}"),
        ("peak = leaves + grads + staged + candidate sets", f"{parts} = {mib(memory['peak_extra_bytes'])}"),
        ("gathered candidate sets alive at the peak", f"{in_flight:.1f}"),
        (
            "mean (max) candidate set C(t) / N",
            f"{np.mean(result.sizes.candidate) / n:.2%} ({max(result.sizes.candidate) / n:.2%})",
        ),
        (
            "mean (max) active set A(t) / N",
            f"{np.mean(result.sizes.active) / n:.2%} ({max(result.sizes.active) / n:.2%})",
        ),
    ]


def sync_rows(result: ModeResult) -> list[tuple[str, str]]:
    """What the synchronization did in one mode."""
    counters = result.runtime.counters
    return [
        ("waits (Wait answers, by reason)", counts(counters.waits)),
        ("validation failures", counts(counters.validation_failures)),
        ("re-runs, reordered reads", f"{counters.reruns}, {counters.reordered}"),
        ("driver turns (blocked)", f"{result.report.turns} ({result.report.blocked_turns})"),
    ]


def mode_table(scene: Scene, results: list[ModeResult]) -> str:
    """The markdown table of the headline run, one column per mode."""
    columns = [time_rows(scene, r) + memory_rows(scene, r) + sync_rows(r) for r in results]
    lines = [f"| figure | {' | '.join(r.label for r in results)} |", f"|---|{'---|' * len(results)}"]
    for index, (name, _) in enumerate(columns[0]):
        lines.append(f"| {name} | {' | '.join(column[index][1] for column in columns)} |")
    return "\n".join(lines)


def sweep_table(runs: list[StreetRun]) -> str:
    """One row per variant: its sparsity and render cost, then the two shares in each mode."""
    lines = [
        (
            "| street, image | steps | mean C(t) / N | render + backward per task "
            "| culling per task (timed apart) | bookkeeping per task, quality "
            "| bookkeeping share, quality / barrier | memory / params, quality / barrier |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        scene, quality, barrier = run.scene, run.quality, run.barrier
        counters = quality.runtime.counters
        cells = [
            scene.variant.label,
            str(quality.steps),
            f"{np.mean(quality.sizes.candidate) / scene.num_gaussians:.2%}",
            per_task_ms(quality, counters.render_ns + counters.backward_ns),
            f"{run.culling_ms:.1f} ms",
            per_task_ms(quality, quality.bookkeeping_ns),
            f"{quality.share('bookkeeping'):.2%} / {barrier.share('bookkeeping'):.2%}",
            f"{quality.share('memory'):.2%} / {barrier.share('memory'):.2%}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def findings(run: StreetRun) -> list[str]:
    """Bullets that read the headline tables: what each figure is made of and how it scales."""
    quality = run.quality
    counters, memory = quality.runtime.counters, quality.runtime.memory_report()
    tasks = counters.tasks
    publish_ms = quality.runtime.timeline.total_ns("publish") / 1e6 / tasks
    per_view = np.mean(quality.sizes.candidate) / run.scene.num_gaussians
    lines = [
        (
            f"- Bookkeeping per task (quality) {quality.bookkeeping_ns / 1e6 / tasks:.1f} ms: candidate culling "
            f"about {run.culling_ms:.1f} ms (timed apart, warm caches), publication (selective Adam on the step's "
            f"union, tables) {publish_ms:.1f} ms, the rest gathers, stages, validates and starts the exchange. Every "
            "part is O(|C(t)|) per task or O(|A|) per step (culling tests N / 64 block bounds, then the rows of the "
            "blocks that may meet the frustum), the render O(|C(t)| + pixels): the share falls as the render grows "
            "(larger images). The runtime keeps the rows in Z-order of their centres (`row_order.py`), so a view's "
            "rows are runs of consecutive rows; the sweep's row with the rows as generated (random along the "
            "street) shows what that saves."
        ),
        (
            f"- Peak shadow memory (quality) is {quality.share('memory') / per_view:.1f} x the mean |C(t)| / N of the "
            f"parameters: {memory['peak_leaves_bytes'] / memory['peak_extra_bytes']:.0%} gathered leaves (one "
            "candidate set per virtual worker in flight), then staged active rows of unpublished steps, one task's "
            "gradients and the int64 candidate sets. The W virtual workers share one replica; in a W-GPU run each "
            "GPU holds one gather and its own staged tasks against its own replica."
        ),
    ]
    escapes = [r for r in run.results if r.escapes]
    if escapes:
        extra = (escapes[0].bookkeeping_ns - quality.bookkeeping_ns) / 1e6 / tasks
        lines.append(
            f"- The escape check (OdinSplatModel's default) adds about {extra:.1f} ms per task: it projects the rows "
            "outside C(t) whose bounding sphere meets the task's drawable region (found with the culling index)."
        )
    return lines


def hook_ms(runtime: OdinRuntime) -> dict[str, float]:
    """Milliseconds per rendered task: bookkeeping (hooks + in-process merge), of it publication, and render +
    backward."""
    counters, tasks = runtime.counters, max(runtime.counters.tasks, 1)
    return {
        "bookkeeping": (counters.bookkeeping_ns + counters.comm_ns) / 1e6 / tasks,
        "publish": runtime.timeline.total_ns("publish") / 1e6 / tasks,
        "render": (counters.render_ns + counters.backward_ns) / 1e6 / tasks,
    }


def backend_table(rows: list[tuple[str, str, dict[str, list[OdinRuntime]]]]) -> str:
    """Bookkeeping per task, reference and compiled side by side, per (scene, mode): each figure the median over
    the backend's rounds, the ratio of those medians and the compiled backend's bookkeeping over render + backward."""
    lines = [
        (
            "| scene | mode | tasks | render + backward per task | bookkeeping per task, reference / compiled "
            "| of it publication, reference / compiled | compiled / reference (street: target <= 50%) "
            "| compiled bookkeeping / (render + backward) (fern: target <= 3%) |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for scene, mode, runtimes in rows:
        figures = {backend: median_ms([hook_ms(r) for r in rounds]) for backend, rounds in runtimes.items()}
        reference, compiled = figures.get("reference"), figures.get("compiled")
        main = compiled or reference
        ratio = f"{compiled['bookkeeping'] / reference['bookkeeping']:.0%}" if compiled and reference else "-"
        share = f"{compiled['bookkeeping'] / compiled['render']:.2%}" if compiled else "-"
        pairs = [
            " / ".join(f"{figures[b][key]:.2f} ms" if b in figures else "-" for b in BACKENDS[::-1])
            for key in ("bookkeeping", "publish")
        ]
        tasks = next(iter(runtimes.values()))[0].counters.tasks
        cells = [scene, mode, str(tasks), f"{main['render']:.1f} ms", *pairs, ratio, share]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def median_ms(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Per figure of :func:`hook_ms`, its median over rounds of one (scene, mode, backend)."""
    return {key: float(np.median([figures[key] for figures in rounds])) for key in rounds[0]}


def report(
    args: argparse.Namespace,
    command: str,
    runs: list[StreetRun],
    fern: list[FernResult] | None = None,
    rounds: Sequence[tuple[list[ModeResult], list[FernResult]]] = (),
) -> str:
    """The markdown section (without markers): the headline run per mode, its reading, then the sweep."""
    scene, results = runs[0].scene, runs[0].results
    model = results[0].runtime.memory_report()["model_bytes"]
    tables = 3 * tensor_bytes(results[0].runtime.tables.seq)
    headline = [r for r in results if not r.escapes]
    fern = fern or []
    pairs = [(run.quality, run.barrier) for run in runs[1:]] + list(zip(headline[::2], headline[1::2]))
    pairs += list(zip(fern[::2], fern[1::2]))

    def alike(a: OdinRuntime, b: OdinRuntime) -> bool:
        return identical(model_state(a.params, a.optimizers), model_state(b.params, b.optimizers))

    same = all(alike(quality.runtime, barrier.runtime) for quality, barrier in pairs)
    backends_same = all(alike(headline[0].runtime, r.runtime) for r in headline[2::2])
    backends_same = backends_same and all(alike(fern[0].runtime, r.runtime) for r in fern[2::2])
    lines = [
        "## bench_runtime: bookkeeping share and Shadow Graph memory on a sparse street",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine(torch, device=torch.device(args.device))}  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        (
            f"Scene: street_world {scene.variant.length:.0f} m, N = {scene.num_gaussians:,} Gaussians (SH degree 3: "
            f"{mib(model)} of parameters, {mib(3 * model)} with Adam's moments), {len(scene.cameras)} side-looking "
            f"rig views at {scene.variant.width}x{scene.variant.height}, Odin's schedule (RLG); W = {args.workers}, "
            f"B = {args.views_per_worker}, K = 4 virtual workers on {args.device}, the last one {args.ahead} turns "
            f"ahead, then round-robin. Quality-first ended bit-identical to barrier in every run: "
            f"{'yes' if same else 'NO'}; every backend ({', '.join(args.backends)}) ended bit-identical to the "
            f"first: {'yes' if backends_same else 'NO'}. Not in the shadow peak: the runtime's per-primitive tables (3 x int64 [N], "
            f"{mib(tables)} = {tables / model:.1%} of the parameters, fixed) and the transport's copies of a step's "
            "update."
        ),
        "",
        mode_table(scene, results),
        "",
        *findings(runs[0]),
        "",
        "Bookkeeping per backend (same scene, same process; ms per rendered task, re-runs included"
        + (
            f"; each figure the median of {1 + len(rounds)} rounds of every (backend, mode) run, odd rounds in the "
            "reverse order, so that a drift of the machine's speed favours no backend"
            if rounds
            else ""
        )
        + "):",
        "",
        backend_table(backend_rows(scene, headline, fern, rounds)),
        "",
        *backend_findings(headline),
    ]
    if fern:
        model = fern[0].runtime
        lines += [
            "",
            (
                f"Fern: odin-splat's defaults (W = {model.topology.num_workers}, B = "
                f"{model.topology.views_per_worker}, K = {model.config.ring_slots}, resolution schedule, escape "
                f"checks), {len(fern) // 2 if len(fern) > 1 else 1} x {args.fern_steps} schedule steps from "
                f"{fern[0].runtime.num_primitives:,} Gaussians at the end; wall per run "
                + ", ".join(f"{r.mode} ({r.backend}) {r.wall_s:.0f} s" for r in fern)
                + "."
            ),
        ]
    if len(runs) > 1:
        lines += ["", "Sweep (both modes per row; one thing changed from the headline run, same N):", ""]
        lines.append(sweep_table(runs))
    return "\n".join(lines)


def backend_findings(headline: list[ModeResult]) -> list[str]:
    """What the backends share: the bookkeeping outside the ops, read from the compiled quality run."""
    compiled = [r for r in headline if r.backend == "compiled" and r.mode == "quality"]
    if not compiled:
        return []
    counters = compiled[0].runtime.counters
    tasks = max(counters.tasks, 1)
    return [
        (
            "- The backends differ only in the ops (`kernels/ops.py`): the four kernels' five (cull + RAW check, "
            "gather, the staging scatter: a task's A(t) and gradient rows out of its leaves, and the staged sums, a "
            "worker's and, handed to the transport, the in-process merge of the W workers' parts, "
            f"{counters.comm_ns / 1e6 / tasks:.1f} ms per task in the compiled quality run; selective Adam with the "
            "version bump) and five CPU-only ones (the culling index's refresh after a publication, validation's "
            "stale and candidate checks, the union of a step's pending writes, the pending-write marks); the rest of "
            "the bookkeeping is the same code: freeing a task's leaves, the escape check, the metering and the "
            "runtime's own loop. That shared part bounds how far the compiled backend's ratio can fall. Both keep "
            "freed memory in the heap "
            "(`OdinRuntimeConfig.keep_freed_memory`, the default: before it, freeing a task's leaves alone took "
            "about 1.5 ms per task here)."
        )
    ]


def backend_rows(
    scene: Scene,
    headline: list[ModeResult],
    fern: list[FernResult],
    rounds: Sequence[tuple[list[ModeResult], list[FernResult]]] = (),
) -> list[tuple[str, str, dict[str, list[OdinRuntime]]]]:
    """(scene, mode, backend -> its runtimes, one per round) for the backend table: the street's headline modes,
    then fern's; the headline run is the first round."""
    street_runs = [headline, *(street for street, _ in rounds)]
    fern_runs = [fern, *(ferns for _, ferns in rounds)]

    def by_backend(results: list[list[ModeResult | FernResult]], mode: str) -> dict[str, list[OdinRuntime]]:
        table: dict[str, list[OdinRuntime]] = {}
        for round_ in results:
            for r in round_:
                if r.mode == mode:
                    table.setdefault(r.backend, []).append(r.runtime)
        return table

    street = f"street {scene.variant.label}"
    rows = [(street, mode, by_backend(street_runs, mode)) for mode in MODES]
    rows += [("fern", mode, by_backend(fern_runs, mode)) for mode in MODES]
    return [row for row in rows if row[2]]


def backend_rounds(
    args: argparse.Namespace, scene: Scene
) -> list[tuple[list[ModeResult], list[FernResult]]]:
    """The backend table's rounds after the headline one: every (backend, mode) run again on the street and on
    fern, odd rounds (the headline's is round 0) in the reverse order."""
    plan = [(backend, mode) for backend in args.backends for mode in MODES]
    rounds = []
    for index in range(1, args.backend_rounds):
        order = plan[::-1] if index % 2 else plan
        street = [run_mode(scene, mode, args, backend=backend) for backend, mode in order]
        ferns = [run_fern(args, mode, backend) for backend, mode in order] if args.fern_steps else []
        rounds.append((street, ferns))
    return rounds


def main(argv: list[str] | None = None) -> None:
    """Run the headline street in both modes and quality with escape checks, then the sweep; print, record."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    command = "python " + shlex.join(["benchmarks/bench_runtime.py", *(sys.argv[1:] if argv is None else argv)])
    runs = []
    for index, variant in enumerate(variants(args)):
        scene = make_scene(args, variant)
        backends = args.backends if index == 0 else args.backends[:1]
        results = [run_mode(scene, mode, args, backend=backend) for backend in backends for mode in MODES]
        if index == 0:
            results.append(run_mode(scene, "quality", args, escapes=True, backend=args.backends[0]))
        runs.append(StreetRun(scene, results, culling_ms(scene)))
    fern = [run_fern(args, mode, backend) for backend in args.backends for mode in MODES] if args.fern_steps else []
    rounds = backend_rounds(args, runs[0].scene) if len(args.backends) > 1 else []
    text = report(args, command, runs, fern, rounds)
    publish(NAME, text, None if args.no_write else args.output)


if __name__ == "__main__":
    main()
