"""A short bare-gsplat training loop through the Odin runtime in barrier, quality and throughput modes, and the
kernels' share of a step: the GPU check of issue 10 (``--cpu`` runs the same flow on CPU as a dry run).

Why one small file: it is the script a lent GPU runs as it is, so what touches the runtime's API is in a few functions
(:func:`train`: a runtime over the params with selective Adams, one virtual transport, the trainer's ``run_step`` per
step then ``settle``; ``replicated_reference``, ``sharded_loop`` and ``op_seconds``). The model renders with
``odin_nerfstudio.rendering.rasterize.rasterization`` (gsplat's CUDA rasterizer on CUDA, the project's CPU rasterizer on
CPU). Two virtual workers with one task each per step, driven by the trainer's step loop with two lanes
(``tasks_in_flight=2``: two threads, each with its CUDA stream, gather, render and back-propagate a step's two tasks at
once), and the barrier with one lane as the reference. Prints per run the step time and the runtime's bookkeeping share,
then the five compiled ops' time on this model against the reference (the kernels' share of a step once the runtime
calls them), and whether quality (two lanes) equals barrier (one) bit for bit (on CUDA also barrier against itself:
gsplat's backward sums with float atomics, so quality may differ from barrier by no more than barrier differs from
itself).

``--sharded`` runs the sharded (mixed-parallel) check instead (``--cpu --sharded`` its dry run): W = 2 ranks, each
owning a Z-order shard of the toy ring, run the sharded barrier and sharded quality-first (``drivers/sharded_loop.py``)
for B = 2 views per rank per step, and the model gathered in global-id order is compared with the replicated barrier's
(one ``OdinRuntime``, W virtual workers, the same schedule). Twice: the ranks as threads of this process on one device
(``VirtualRowExchange``), and the ranks as processes over torch.distributed (``RowAllToAll`` / ``TableAllToAll``): gloo
on CPU; NCCL with one GPU per rank on CUDA (a "cpu:gloo,cuda:nccl" group), skipped with a message on fewer than 2 GPUs
(NCCL refuses two ranks on one GPU). 60k Gaussians, 20 steps, 32 x 32 pixels on CUDA (3k, 4 steps, 16 x 16 on CPU: about
12 s). The render is the toy renderer's pure-torch splatting (``toy.render``'s arithmetic at that size, on the device):
no float atomics, so the sharded runs are expected to equal the replicated barrier bit for bit on CUDA as on CPU (each
task renders the same rows in the same order with the same kernels; the sums run in the same order). On CPU any
difference fails the check (the tests prove equality); on CUDA the largest difference is printed and the check fails
above ``SHARDED_TOLERANCE`` (a missed row or a wrong sum moves a value by about a learning rate, far above it), so a
difference from float rounding alone is reported, not failed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from odin_nerfstudio.adapter.gsplat import GsplatAdapter  # noqa: E402
from odin_nerfstudio.comm.all_to_all import RowAllToAll, TableAllToAll  # noqa: E402
from odin_nerfstudio.comm.inprocess import VirtualRowExchange, VirtualTransport  # noqa: E402
from odin_nerfstudio.core.row_order import restore_spatial_order  # noqa: E402
from odin_nerfstudio.core.conflicts import StepRows  # noqa: E402
from odin_nerfstudio.core.selective_adam import selective_adams  # noqa: E402
from odin_nerfstudio.core.sparse import SparseUpdate  # noqa: E402
from odin_nerfstudio.core.tasks import Task  # noqa: E402
from odin_nerfstudio.culling.candidates import CullRegion  # noqa: E402
from odin_nerfstudio.drivers.sharded_loop import ShardedLoop  # noqa: E402
from odin_nerfstudio.drivers.step_loop import run_step, settle  # noqa: E402
from odin_nerfstudio.drivers.virtual import run_virtual  # noqa: E402
from odin_nerfstudio.kernels import ops  # noqa: E402
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology  # noqa: E402
from odin_nerfstudio.runtime.metering import Meter  # noqa: E402
from odin_nerfstudio.runtime.ownership import ShardCuts  # noqa: E402
from odin_nerfstudio.runtime.runtime import OdinRuntime  # noqa: E402
from odin_nerfstudio.runtime.shard_reader import Reader  # noqa: E402
from odin_nerfstudio.runtime.sharding import Owner  # noqa: E402
from odin_nerfstudio.scenes import toy  # noqa: E402

LRS = {"means": 1.6e-4, "scales": 5e-3, "quats": 1e-3, "opacities": 5e-2, "features_dc": 2.5e-3}
WORKERS, PER_WORKER = 2, 1
RUNS = (("barrier", 1), ("barrier", 2), ("quality", 2), ("throughput", 2))
"""(mode, tasks in flight) of each run; quality with two lanes is compared with the barrier with one."""
SHARDED_RANKS, SHARDED_PER_RANK = 2, 2
"""W and B of the sharded check."""
SHARDED_MODES = ("barrier", "quality")
SHARDED_TOLERANCE = 1e-5
"""The most |sharded - replicated| the CUDA check accepts (it prints whether the runs are bit-identical)."""
SHARDED_TIMEOUT_S = 120.0
"""The longest a sharded rank waits for any exchange."""


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
    if device != "cpu":
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


def torch_render(size: int, device: str):
    """The toy renderer's pure-torch splatting (``toy.render``: isotropic screen-space Gaussians, normalized
    blending over a background drawn from the task's generator) at ``size`` x ``size`` pixels on ``device``, MSE
    against a fixed random target per view; ``radii`` marks the rows it sees."""
    pixels = torch.arange(size, device=device, dtype=torch.float32) + 0.5
    pixels = torch.stack(torch.meshgrid(pixels, pixels, indexing="xy"), dim=-1).reshape(-1, 2)

    def render(task: Task, leaves: dict[str, torch.Tensor], generator: torch.Generator):
        cam = task.camera
        points = leaves["means"] @ cam.viewmat[:3, :3].T.to(device) + cam.viewmat[:3, 3].to(device)
        depth = points[:, 2]
        safe_depth = torch.where(depth > toy.NEAR, depth, torch.ones_like(depth))
        focal = float(cam.K[0, 0])
        xy = focal * points[:, :2] / safe_depth[:, None] + cam.K[:2, 2].to(device)
        sigma = focal * torch.exp(leaves["scales"]).max(dim=-1).values / safe_depth
        reach = 3.0 * sigma
        visible = (depth > toy.NEAR) & (xy[:, 0] + reach > 0) & (xy[:, 0] - reach < cam.width)
        visible &= (xy[:, 1] + reach > 0) & (xy[:, 1] - reach < cam.height)
        offset = pixels[:, None, :] - xy[None, :, :]  # [P, M, 2]
        falloff = torch.exp(-0.5 * offset.square().sum(-1) / sigma.square()[None, :])
        weight = torch.sigmoid(leaves["opacities"])[None, :] * falloff * visible[None, :].float()
        background = torch.rand(3, generator=generator).to(device)
        image = (weight @ leaves["features_dc"] + background) / (1.0 + weight.sum(dim=1, keepdim=True))
        target = torch.rand(size, size, 3, generator=torch.Generator().manual_seed(task.view)).to(device)
        loss = (image.reshape(size, size, 3) - target).square().mean()
        radii = torch.where(visible, torch.ceil(reach.detach()).clamp(min=1), 0).to(torch.int32)[None]
        return loss, {"radii": radii}

    return render


def sharded_schedule(args: argparse.Namespace) -> list:
    """step -> rank -> its B tasks: narrow views (focal 2 image widths) from seeded shuffles, so that tasks far from
    the previous step's rows may run ahead in quality-first."""
    return toy.make_schedule(args.steps, SHARDED_RANKS, SHARDED_PER_RANK, args.views, size=args.size, focal_scale=2.0)


def sharded_cuts(args: argparse.Namespace) -> ShardCuts:
    """Uneven shards (a third and two thirds of the rows): a rank reads rows of both."""
    return ShardCuts(torch.tensor([0, args.gaussians // 3, args.gaussians]))


def replicated_reference(args: argparse.Namespace, device: str) -> dict[str, torch.Tensor]:
    """The replicated barrier on W virtual workers (the sharded runs' reference), its model on the CPU."""
    params = make_params(args.gaussians, device)  # the runtime puts the rows in Z-order: the global ids
    transport = VirtualTransport(SHARDED_RANKS, params)
    runtime = OdinRuntime(
        OdinRuntimeConfig(mode="barrier"),
        params,
        selective_adams(params, LRS),
        [transport.endpoint(w) for w in range(SHARDED_RANKS)],
        torch_render(args.size, device),
        topology=Topology(num_workers=SHARDED_RANKS, views_per_worker=SHARDED_PER_RANK),
        seed=0,
    )
    run_virtual(runtime, sharded_schedule(args))
    synchronize(device)
    model = {key: value.cpu() for key, value in toy.snapshot(runtime).items()}
    model["versions"] = runtime.tables.versions.cpu()
    runtime.close()
    return model


def sharded_loop(args: argparse.Namespace, rank: int, mode: str, device: str, exchange) -> ShardedLoop:
    """Rank ``rank``'s shard of the toy ring (its Z-order range, on ``device``) and its loop over ``exchange``."""
    params = make_params(args.gaussians, device)
    restore_spatial_order(params, {}, None)
    cuts = sharded_cuts(args)
    lo, hi = cuts.range(rank)
    shard = {name: torch.nn.Parameter(p.detach()[lo:hi].clone()) for name, p in params.items()}
    optimizers = selective_adams(shard, LRS)
    config, adapter = OdinRuntimeConfig(mode=mode), GsplatAdapter()
    owner = Owner(shard, optimizers, cuts, rank, adapter, config.candidate_margin, config.near_plane)
    render = torch_render(args.size, device)
    reader = Reader(cuts, shard, render, adapter, Meter(torch.device(device)), 0, config.ring_slots)
    schedule = sharded_schedule(args)
    return ShardedLoop(owner, reader, exchange, rank, schedule.__getitem__, mode, len(schedule) - 1, SHARDED_TIMEOUT_S)


def shard_model(loop: ShardedLoop) -> dict[str, torch.Tensor]:
    """A shard's parameters, Adam state and versions on the CPU, keyed as ``toy.snapshot`` (and ``versions``)."""
    owner = loop.owner
    out = {"versions": owner.tables.versions.cpu()}
    for name, param in owner.params.items():
        out[name] = param.detach().cpu()
        state = owner.optimizers[name].state[param]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            out[f"{name}.{key}"] = state[key].detach().cpu().clone()
    return out


def gathered(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The shards' models in global-id order (Adam's step count is every shard's)."""
    return {key: shards[0][key] if key.endswith(".step") else torch.cat([s[key] for s in shards]) for key in shards[0]}


def run_sharded(loop: ShardedLoop, device: str) -> float:
    """Every step on one rank; the seconds it took."""
    synchronize(device)
    start = time.perf_counter()
    for step in range(loop.last_step + 1):
        loop.iteration(step)
    synchronize(device)
    return time.perf_counter() - start


def sharded_threads(args: argparse.Namespace, mode: str) -> dict:
    """The sharded run on W threads of this process on one device (``VirtualRowExchange``)."""
    exchange = VirtualRowExchange(SHARDED_RANKS)
    loops = [sharded_loop(args, r, mode, args.device, exchange.endpoint(r)) for r in range(SHARDED_RANKS)]
    errors, seconds = [], [0.0] * SHARDED_RANKS

    def run(rank: int) -> None:
        try:
            seconds[rank] = run_sharded(loops[rank], args.device)
        except BaseException:  # noqa: BLE001 - reported below
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(r,)) for r in range(SHARDED_RANKS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SHARDED_TIMEOUT_S * 2)
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"sharded {mode} on threads failed:\n" + "\n".join(errors or ["a rank hung"]))
    return {
        "model": gathered([shard_model(loop) for loop in loops]),
        "counters": [vars(loop.counters) for loop in loops],
        "seconds": max(seconds),
    }


def _sharded_rank_main(rank: int, args: argparse.Namespace, init_file: str, out_dir: str) -> None:
    """One process rank: both sharded modes over torch.distributed, each shard's model saved to ``out_dir``.

    The process group is "cpu:gloo,cuda:nccl" on CUDA, so each collective takes the backend of its tensors'
    device: the rows and the loop's side tables (built on the parameters' device) travel over NCCL.
    """
    torch.set_num_threads(1)
    try:
        device = "cpu" if args.device == "cpu" else f"cuda:{rank}"
        if device != "cpu":
            torch.cuda.set_device(rank)
        backend = "gloo" if device == "cpu" else "cpu:gloo,cuda:nccl"
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=SHARDED_RANKS)
        results = {}
        for mode in SHARDED_MODES:
            exchange = TableAllToAll(RowAllToAll(timeout=SHARDED_TIMEOUT_S))
            loop = sharded_loop(args, rank, mode, device, exchange)
            seconds = run_sharded(loop, device)
            exchange.close()
            results[mode] = {"model": shard_model(loop), "counters": vars(loop.counters), "seconds": seconds}
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        (Path(out_dir) / f"error{rank}.txt").write_text(traceback.format_exc())
    os._exit(0)


def sharded_processes(args: argparse.Namespace) -> dict[str, dict] | None:
    """Both sharded modes on W processes (gloo on CPU, NCCL with a GPU per rank); None where CUDA has too few GPUs."""
    if args.device == "cuda" and torch.cuda.device_count() < SHARDED_RANKS:
        return None
    with tempfile.TemporaryDirectory(prefix="odin_gpu_check_") as folder:
        mp.spawn(_sharded_rank_main, args=(args, str(Path(folder) / "init"), folder), nprocs=SHARDED_RANKS)
        errors = [path.read_text() for path in sorted(Path(folder).glob("error*.txt"))]
        if errors:
            raise RuntimeError("sharded ranks failed:\n" + "\n".join(errors))
        ranks = [torch.load(Path(folder) / f"rank{r}.pt") for r in range(SHARDED_RANKS)]
    return {
        mode: {
            "model": gathered([r[mode]["model"] for r in ranks]),
            "counters": [r[mode]["counters"] for r in ranks],
            "seconds": max(r[mode]["seconds"] for r in ranks),
        }
        for mode in SHARDED_MODES
    }


def sharded_check(args: argparse.Namespace) -> int:
    """The sharded check (see the module); prints its table, returns the exit status."""
    cuts = sharded_cuts(args)
    print(f"sharded check: device {args.device}, {args.gaussians} Gaussians cut {cuts.sizes}, {args.steps} steps of "
          f"W = {SHARDED_RANKS} ranks x B = {SHARDED_PER_RANK} views at {args.size}x{args.size} (pure-torch toy "
          f"render)")
    start = time.perf_counter()
    reference = replicated_reference(args, args.device)
    print(f"replicated barrier: {time.perf_counter() - start:.1f} s")
    runs = {("threads", mode): sharded_threads(args, mode) for mode in SHARDED_MODES}
    processes = sharded_processes(args)
    if processes is None:
        print(f"SKIPPED: sharded ranks over NCCL need {SHARDED_RANKS} GPUs (NCCL refuses two ranks on one GPU), this "
              f"machine has {torch.cuda.device_count()}; the threads run covers the owners and readers on CUDA")
    else:
        runs.update({("nccl" if args.device == "cuda" else "gloo", mode): run for mode, run in processes.items()})
    print("\n| ranks as | mode | s | rows fetched / task rows | rows returned | ran ahead | max |diff| vs replicated "
          "barrier | bit-identical |")
    print("|---|---|---|---|---|---|---|---|")
    worst, identical = 0.0, True
    for (kind, mode), run in runs.items():
        model, counters = run["model"], run["counters"]
        if model.keys() != reference.keys() or any(model[k].shape != reference[k].shape for k in model):
            print(f"| {kind} | {mode} | shapes or keys differ from the replicated model |")
            return 1
        difference = largest_difference(model, reference)
        same = all(torch.equal(model[k], reference[k]) for k in model)
        worst, identical = max(worst, difference), identical and same
        fetched = f"{sum(c['rows_fetched'] for c in counters):,} / {sum(c['task_rows'] for c in counters):,}"
        returned = sum(c["rows_returned"] for c in counters)
        ran_ahead = sum(c["ran_ahead"] for c in counters)
        print(f"| {kind} | {mode} | {run['seconds']:.2f} | {fetched} | {returned:,} | {ran_ahead} | {difference:g} "
              f"| {'yes' if same else 'no'} |")
    if args.device == "cpu":
        print(f"\nsharded equals the replicated barrier bit for bit: {identical}")
        return 0 if identical else 1
    print(f"\nsharded vs replicated barrier: largest |diff| {worst:g}, bit-identical: {identical} (expected: yes, "
          f"the render has no atomics); within {SHARDED_TOLERANCE:g}: {worst <= SHARDED_TOLERANCE}")
    return 0 if worst <= SHARDED_TOLERANCE else 1


def main() -> None:
    """Train in the three modes, print the table, exit 1 if quality differs from barrier where it must not (or, with
    ``--sharded``, run the sharded check instead)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="dry run on CPU with the project's CPU rasterizer")
    parser.add_argument("--sharded", action="store_true", help="the sharded (mixed-parallel) check instead")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--gaussians", type=int, default=None)
    args = parser.parse_args()
    args.device = "cpu" if args.cpu else "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device (use --cpu for the dry run)")
    if args.sharded:
        args.steps = args.steps or (4 if args.cpu else 20)
        args.gaussians = args.gaussians or (3_000 if args.cpu else 60_000)
        args.size, args.views = (16, 12) if args.cpu else (32, 24)
        sys.exit(sharded_check(args))
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
