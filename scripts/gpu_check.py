"""A short bare-gsplat training loop through the Odin runtime in barrier, quality and throughput modes, and the
kernels' share of a step: the GPU check of issue 10 (``--cpu`` runs the same flow on CPU as a dry run).

Why one small file: the runtime's API is being refactored; everything that touches it is in :func:`train` (a
runtime over the params with selective Adams, one virtual transport, ``run_virtual`` over a schedule), so the loop
is easy to adapt. The model renders with ``odin_nerfstudio.rendering.rasterize.rasterization`` (gsplat's CUDA
rasterizer on CUDA, the project's CPU rasterizer on CPU). Two virtual workers with one task each per step, driven
by the trainer's step loop with two lanes (``tasks_in_flight=2``: two threads, each with its CUDA stream, gather,
render and back-propagate a step's two tasks at once), and the barrier with one lane as the reference. Prints per
run the step time and the runtime's bookkeeping share, then the five
compiled ops' time on this model against the reference (the kernels' share of a step once the runtime calls
them), and whether quality (two lanes) equals barrier (one) bit for bit (on CUDA also barrier against itself:
gsplat's backward sums with float atomics, so quality may differ from barrier by no more than barrier differs from
itself).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from odin_nerfstudio.comm.inprocess import VirtualTransport  # noqa: E402
from odin_nerfstudio.core.conflicts import StepRows  # noqa: E402
from odin_nerfstudio.core.selective_adam import selective_adams  # noqa: E402
from odin_nerfstudio.core.sparse import SparseUpdate  # noqa: E402
from odin_nerfstudio.core.tasks import Task  # noqa: E402
from odin_nerfstudio.culling.candidates import CullRegion  # noqa: E402
from odin_nerfstudio.drivers.step_loop import run_step, settle  # noqa: E402
from odin_nerfstudio.kernels import ops  # noqa: E402
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology  # noqa: E402
from odin_nerfstudio.runtime.runtime import OdinRuntime  # noqa: E402
from odin_nerfstudio.scenes import toy  # noqa: E402

LRS = {"means": 1.6e-4, "scales": 5e-3, "quats": 1e-3, "opacities": 5e-2, "features_dc": 2.5e-3}
WORKERS, PER_WORKER = 2, 1
RUNS = (("barrier", 1), ("barrier", 2), ("quality", 2), ("throughput", 2))
"""(mode, tasks in flight) of each run; quality with two lanes is compared with the barrier with one."""


def make_params(num_gaussians: int, device: str) -> dict[str, torch.nn.Parameter]:
    """The toy ring (``odin_nerfstudio.scenes.toy``) taller and of finer Gaussians, on ``device``."""
    return toy.make_params(num_gaussians, height=1.5, scales=(0.01, 0.03), device=device)


def make_schedule(steps: int, num_views: int, size: int) -> list:
    """step -> worker -> tasks: W x B distinct views per step from seeded shuffles, ``size`` x ``size`` cameras."""
    return toy.make_schedule(steps, WORKERS, PER_WORKER, num_views, size=size)


def make_render(size: int, device: str):
    """The task's render: the gathered rows rasterized (``toy.splat``), L1 against a fixed random target per view."""

    def render(task: Task, leaves: dict[str, torch.Tensor], generator: torch.Generator):
        image, info = toy.splat(task, leaves, generator)
        target = torch.rand(size, size, 3, generator=torch.Generator().manual_seed(task.view)).to(device)
        return (image - target).abs().mean(), info

    return render


def train(mode: str, lanes: int, args: argparse.Namespace) -> tuple[OdinRuntime, float]:
    """A fresh model trained ``args.steps`` steps in ``mode`` with ``lanes`` tasks in flight; returns the runtime and
    the seconds per step."""
    params = make_params(args.gaussians, args.device)
    config = OdinRuntimeConfig(mode=mode, tasks_in_flight=lanes)
    transport = VirtualTransport(WORKERS, params, ops.scatter_in_order)
    runtime = OdinRuntime(
        config,
        params,
        selective_adams(params, LRS),
        [transport.endpoint(w) for w in range(WORKERS)],
        make_render(args.size, args.device),
        topology=Topology(num_workers=WORKERS, views_per_worker=PER_WORKER),
        seed=0,
    )
    schedule = make_schedule(args.steps, args.views, args.size)
    synchronize(args.device)
    start = time.perf_counter()
    for step, tasks in enumerate(schedule):
        run_step(runtime, step, tasks)
    settle(runtime)
    synchronize(args.device)
    return runtime, (time.perf_counter() - start) / args.steps


def synchronize(device: str) -> None:
    """Wait for the device's queued work (timing only)."""
    if device == "cuda":
        torch.cuda.synchronize()


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest |a - b| over every tensor (0.0: bit-identical up to signed zeros)."""
    return max(float((a[k] - b[k]).abs().max()) if a[k].numel() else 0.0 for k in a)


def op_seconds(runtime: OdinRuntime, args: argparse.Namespace, reference: bool, repeat: int = 5) -> dict[str, float]:
    """Best time of each op on the trained model for a step's work: W x B culls, gathers and stagings, one scatter of
    the W x B updates, one publication of their union (on copies, so the model is untouched)."""
    tasks = [task for per_worker in make_schedule(1, args.views, args.size)[0] for task in per_worker]
    bounds = runtime.index.bounds()
    regions = [CullRegion.candidates(task.camera, runtime.config.candidate_margin) for task in tasks]
    params = {name: p.detach().clone() for name, p in runtime.params.items()}
    seq = torch.zeros(runtime.num_primitives, dtype=torch.int64, device=args.device)
    writes = [StepRows(0, torch.arange(0, runtime.num_primitives, 7, device=args.device))]
    candidates = [ops.cull_conflicts(bounds, region, 1, writes)[0] for region in regions]
    updates = [
        SparseUpdate(c, {n: torch.randn(c.numel(), *p.shape[1:], device=args.device) for n, p in params.items()})
        for c in candidates
    ]
    union = ops.scatter_in_order(updates, params)
    optimizers = selective_adams({n: torch.nn.Parameter(p) for n, p in params.items()}, LRS)
    calls = {
        "cull_conflicts": lambda: [ops.cull_conflicts(bounds, region, 1, writes) for region in regions],
        "gather_rows": lambda: [ops.gather_rows(params, c, seq) for c in candidates],
        "stage_rows": lambda: [ops.stage_rows(u.rows, u.grads) for u in updates],
        "scatter_in_order": lambda: ops.scatter_in_order(updates, params),
        "publish_adam": lambda: ops.publish_adam(optimizers, union.rows, union.grads, seq),
    }
    out = {}
    with ops.use_reference(reference):
        for name, call in calls.items():
            best = math.inf
            for _ in range(repeat):
                synchronize(args.device)
                start = time.perf_counter()
                call()
                synchronize(args.device)
                best = min(best, time.perf_counter() - start)
            out[name] = best
    return out


def main() -> None:
    """Train in the three modes, print the table, exit 1 if quality differs from barrier where it must not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="dry run on CPU with the project's CPU rasterizer")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--gaussians", type=int, default=None)
    args = parser.parse_args()
    args.device = "cpu" if args.cpu else "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device (use --cpu for the dry run)")
    args.steps = args.steps or (4 if args.cpu else 30)
    args.gaussians = args.gaussians or (3_000 if args.cpu else 200_000)
    args.size, args.views = (32, 12) if args.cpu else (256, 24)
    print(f"device {args.device}, compiled ops: {ops.compiled(args.device)}, {args.gaussians} Gaussians, "
          f"{args.steps} steps of {WORKERS} tasks at {args.size}x{args.size}")

    runs = {(mode, lanes): train(mode, lanes, args) for mode, lanes in RUNS}
    print("\n| mode | lanes | step ms | render+backward ms/task | bookkeeping ms/task | bookkeeping share | in flight |")
    print("|---|---|---|---|---|---|---|")
    for (mode, lanes), (runtime, step_s) in runs.items():
        c = runtime.counters
        tasks = max(c.tasks, 1)
        compute = (c.render_ns + c.backward_ns) / tasks / 1e6
        book = c.bookkeeping_ns / tasks / 1e6
        share = book / (book + compute)
        print(f"| {mode} | {lanes} | {step_s * 1e3:.1f} | {compute:.2f} | {book:.2f} | {share:.1%} | {c.most_in_flight} |")

    quality_runtime, step_s = runs[("quality", 2)]
    compiled = op_seconds(quality_runtime, args, reference=False)
    reference = op_seconds(quality_runtime, args, reference=True)
    print("\n| op (one step's calls) | reference ms | compiled ms | compiled share of a quality step |")
    print("|---|---|---|---|")
    for name in compiled:
        print(f"| {name} | {reference[name] * 1e3:.3f} | {compiled[name] * 1e3:.3f} | {compiled[name] / step_s:.2%} |")
    total = sum(compiled.values())
    print(f"| all five | {sum(reference.values()) * 1e3:.3f} | {total * 1e3:.3f} | {total / step_s:.2%} |")

    barrier, quality = toy.snapshot(runs[("barrier", 1)][0]), toy.snapshot(runs[("quality", 2)][0])
    difference = largest_difference(quality, barrier)
    if args.device == "cpu":
        print(f"\nquality equals barrier bit for bit: {difference == 0.0} (largest |diff| {difference:g})")
        sys.exit(0 if difference == 0.0 else 1)
    noise = largest_difference(toy.snapshot(train("barrier", 1, args)[0]), barrier)
    print(f"\nquality vs barrier largest |diff| {difference:g}; barrier vs barrier {noise:g} (gsplat's atomics); "
          f"quality within barrier's own spread: {difference <= noise}")
    sys.exit(0 if difference <= noise else 1)


if __name__ == "__main__":
    main()
