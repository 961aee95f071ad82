"""Shard bytes benchmark: bytes per rank per step of the sharded (mixed-parallel) mode, with Odin's placement
(Z-order shards cut by load, each step's workers on the ranks owning most of their rows), against the same protocol
with rows spread over the ranks at random (a Grendel-style placement: Grendel re-distributes Gaussians without
regard to where the views look) and against the replicated mode's gradient exchange, for W = 2..8.

Why: Gaian (arXiv 2512.20017) reports up to 91% less communication than earlier systems by placing and scheduling
with the data-access information its API exposes; Odin's RLG, schedule and owner-side culling hold the same
information ahead of time. What travels per step in the sharded mode (``runtime/sharding.py``): a fetch (each rank's
tasks' candidate rows C(t), once per rank: ids, task masks, versions, values), a return (the gradient rows of their
active rows A(t): ids, gradients) and the tasks' densification statistics (an entry per task and drawn row: task,
row, grad2d, radii), each piece that goes to another rank crossing the link. The model here counts them from the
candidate and active sets; a short real run counts the tensors it passes to the exchange and must equal it.

Scenes: bench_exchange's (``street``: bench_runtime's street with side-looking rig views; ``object``: odin-synth's
object, every view sees about half the model), their perturbed world as the model in Z-order, the first ``--steps``
steps of Odin's schedule (RLG, B = 1) for each W. C(t): the runtime's culling (``CullingIndex.candidates``, default
margin and near plane); A(t): the rows the rasterizer draws (``drawn_rows``). Placements: ``odin`` (cut by load over
every view's candidate set, ``runtime/ownership.py``, and each step's workers placed, ``runtime/placement.py``),
``zorder`` (the same cut, worker w on rank w), ``random`` (rows dealt to ranks by a seeded permutation, worker w on
rank w), ``by readers`` (each row on the worker whose tasks read it most, equal shards: ``reader_owners``, what a
placement knowing every read could give; not the runtime's). Replicated: the bytes the gradient exchange sends per
rank (``ExchangeShape.predict``, the transport's own model, of each rank's union of A(t) and its statistics; the
cheapest of sparse / union / dense by bytes).

Check (``--check-steps``): the sharded barrier itself, W threads of one process over ``VirtualRowExchange`` with the
learning rate at 0 (rows stay where the model has them), on the street at W = 2 and 4 with the ``odin`` placement;
every exchange's pieces for other ranks are counted (``comm/row_link.sent_bytes``) and compared with the model.

Usage: ``python benchmarks/bench_shard_bytes.py [--steps 16] [--workers 2 4 8] [--quick] [--no-write]``; ``--quick``
runs small scenes and never writes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from _report import BENCHMARKS, machine, publish
from bench_exchange import object_scene, street_scene
from bench_runtime import POINT_STRIDE, perturbed_params

from odin_nerfstudio.adapter.gsplat import STATS_SCHEMA, GsplatAdapter
from odin_nerfstudio.comm.exchange_choice import ExchangeShape
from odin_nerfstudio.comm.inprocess import VirtualRowExchange
from odin_nerfstudio.comm.row_link import sent_bytes
from odin_nerfstudio.comm.wire import Sizes, StatsLayout
from odin_nerfstudio.core.row_order import restore_spatial_order
from odin_nerfstudio.core.selective_adam import selective_adams
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.drivers.sharded_loop import ShardedLoop
from odin_nerfstudio.culling.candidates import candidate_set
from odin_nerfstudio.rendering.rasterize import drawn_rows
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.ownership import ShardCuts, cut_by_load, row_load, views_seeing
from odin_nerfstudio.runtime.placement import Placement, by_rank
from odin_nerfstudio.runtime.shard_reader import Reader
from odin_nerfstudio.runtime.sharding import Owner
from odin_nerfstudio.scheduling.regions import view_keys
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.scenes.synth import SynthConfig, intrinsics, preset_for
from odin_nerfstudio.scenes.toy import splat

NAME = "bench_shard_bytes"
TARGET = 0.90
"""Odin's placement must send at least 90% fewer bytes than the Grendel-style placement (Gaian's figure)."""
SPENT_BYTES = 8
"""A rank's measured time on each of its returns where placed (one int64: ``drivers/placed_steps.SPENT``)."""
INDEX, FLOAT = 8, 4
"""Bytes of an int64 index and of a float32 value."""


def row_widths(params: dict[str, Tensor]) -> tuple[int, int, int]:
    """Bytes a fetched row (ids, masks, versions, values), a returned gradient row (ids, gradients) and a statistics
    entry (task, row, grad2d, radii) take."""
    values = sum(p[0].numel() * p.element_size() for p in params.values())
    return 3 * INDEX + values, INDEX + values, 2 * INDEX + 2 * FLOAT


@dataclass
class Sets:
    """A scene in Z-order: its model, one task per view, and per view C(t) and A(t) (sorted int64 rows)."""

    name: str
    params: dict[str, Tensor]
    views: list[Task]
    candidates: list[Tensor]
    active: list[Tensor]
    world: object
    cameras: list


def city_scene(args: argparse.Namespace) -> tuple[dict[str, Tensor], list[Camera], object]:
    """odin-synth's city preset (a grid of streets, each view seeing its own street): the perturbed model, its views
    and the world."""
    config = SynthConfig(preset="city", num_views=args.city_views, num_gaussians=args.city_gaussians)
    preset = preset_for(config)
    world = preset.world(config.num_gaussians, np.random.default_rng(args.seed))
    K = torch.tensor(intrinsics(128, 96, preset.horizontal_fov_deg), dtype=torch.float32)
    cameras = [Camera(v, K, 128, 96) for v in torch.tensor(preset.cameras(config.num_views), dtype=torch.float32)]
    return perturbed_params(world, torch.Generator().manual_seed(args.seed + 1), torch.device("cpu")), cameras, world


SCENES = {"street": street_scene, "city": city_scene, "object": object_scene}


def scene_sets(name: str, args: argparse.Namespace) -> Sets:
    """The scene's model in Z-order with every view's candidate and drawn rows."""
    params, cameras, world = SCENES[name](args)
    restore_spatial_order(params, {}, None)
    config = OdinRuntimeConfig()
    index = CullingIndex(params, GsplatAdapter(), config.candidate_margin, config.near_plane)
    views = [Task(0, 0, 0, view, camera) for view, camera in enumerate(cameras)]
    candidates = [index.candidates(view) for view in views]
    drawn = [drawn_rows(view.camera, params) for view in views]
    active = [rows[mask[rows]] for rows, mask in zip(candidates, drawn, strict=True)]  # A(t) within C(t)
    return Sets(name, params, views, candidates, active, world, cameras)


def schedule_for(sets: Sets, workers: int, steps: int, order: str, seed: int) -> list:
    """The first ``steps`` steps of the schedule in ``order`` (B = 1), the RLG over "SfM points" every 16th Gaussian
    of the world (as bench_runtime's)."""
    points = sets.world.means[::POINT_STRIDE]
    scales = sets.world.scales[::POINT_STRIDE]
    point_sets = [candidate_set(points, scales, camera, margin=0.0).numpy() for camera in sets.cameras]
    config = ScheduleConfig(num_workers=workers, views_per_worker=1, seed=seed, order=order)
    keys = view_keys(point_sets, np.arange(points.shape[0]), points.numpy()) if order == "regions" else None
    schedule = Schedule(RelativeLocalityGraph.from_point_sets(point_sets), config, view_keys=keys)
    return [
        [[Task(s, w, b, view, sets.cameras[view]) for b, view in enumerate(schedule.at(s).tasks[w])] for w in range(workers)]
        for s in range(min(steps, schedule.steps_per_epoch))
    ]


def owners(sets: Sets, placement: str, workers: int, seed: int) -> Tensor:
    """Each row's owner under ``placement``: cut by load in Z-order (odin, zorder) or dealt at random (random)."""
    n = sets.params["means"].shape[0]
    if placement == "random":  # else "zorder"
        dealt = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        owner = torch.empty(n, dtype=torch.int64)
        owner[dealt] = torch.arange(n) % workers
        return owner
    config = OdinRuntimeConfig()
    index = CullingIndex(sets.params, GsplatAdapter(), config.candidate_margin, config.near_plane)
    cuts = cut_by_load(row_load(views_seeing(index, sets.views)), workers)
    return cuts.owner_of(torch.arange(n))


def reader_owners(sets: Sets, schedule: list, workers: int) -> Tensor:
    """Each row's owner when rows go where they are read instead of in Z-order ranges: to the worker whose tasks in
    ``schedule`` hold it in their C(t) most often, in shards of at most ceil(N / W) rows (the rows read most
    one-sidedly placed first, those no task reads last). What knowing every row's readers in the very steps judged
    would give a placement, for comparison only: the runtime's shards are contiguous id ranges
    (``runtime/ownership.py``)."""
    n = sets.params["means"].shape[0]
    reads = torch.zeros(workers, n, dtype=torch.int64)
    for step in schedule:
        for worker, tasks in enumerate(step):
            for task in tasks:
                reads[worker, sets.candidates[task.view]] += 1
    ranked = torch.sort(reads, dim=0, descending=True, stable=True)
    margin = ranked.values[0] - ranked.values[1] if workers > 1 else ranked.values[0]
    preference = ranked.indices.T.tolist()  # per row, the workers from the one reading it most
    capacity = [-(-n // workers)] * workers
    owner = torch.empty(n, dtype=torch.int64)
    for row in torch.argsort(margin, descending=True, stable=True).tolist():
        worker = next(w for w in preference[row] if capacity[w])
        owner[row], capacity[worker] = worker, capacity[worker] - 1
    return owner


def rank_rows(sets: Sets, tasks: list[Task]) -> tuple[Tensor, Tensor]:
    """What one rank's tasks of a step read and write: the union of their C(t) and of their A(t) (sorted int64)."""
    read = torch.unique(torch.cat([sets.candidates[t.view] for t in tasks]))
    return read, torch.unique(torch.cat([sets.active[t.view] for t in tasks]))


def step_bytes(sets: Sets, schedule: list, owner: Tensor, placed: bool, workers: int) -> list[list[int]]:
    """Per step and rank, the bytes it sends to other ranks: its shard's rows fetched by others, its tasks'
    gradient rows and statistics entries returned to other owners, and its measured time on every return (one
    int64, ``drivers/placed_steps.py``). Placed by candidate rows, as a run places its first K steps (the later ones
    count the ranks' measured times, which no model knows: the check runs K steps)."""
    fetch_row, return_row, entry = row_widths(sets.params)
    table = torch.stack([torch.bincount(owner[c], minlength=workers) for c in sets.candidates])
    placement = Placement(table) if placed else None
    out = []
    for step in schedule:
        tasks = by_rank(step, placement.ranks_of(step)) if placement is not None else step
        sent = torch.full((workers,), SPENT_BYTES * (workers - 1) if placed else 0, dtype=torch.int64)
        for rank, rank_tasks in enumerate(tasks):
            if not rank_tasks:
                continue
            read, drawn = rank_rows(sets, rank_tasks)
            sources = owner[read][owner[read] != rank]  # fetched from other ranks: each owner sends its rows
            sent += fetch_row * torch.bincount(sources, minlength=workers)
            sent[rank] += return_row * int((owner[drawn] != rank).sum())
            sent[rank] += entry * sum(int((owner[sets.active[t.view]] != rank).sum()) for t in rank_tasks)
        out.append(sent.tolist())
    return out


def floor_bytes(sets: Sets, schedule: list, workers: int) -> list[int]:
    """Per step, the fewest bytes per rank that any placement of the rows in W shards of N / W rows can send, with
    each worker on any rank: a rank's step reads its tasks' C(t) union U, of which at most N / W rows can be its
    own, so at least |U| - N / W come from other ranks (the same for the gradient rows of A(t) and each task's
    statistics entries). Bytes sent and received have the same sum over the ranks, so the mean is a floor on both."""
    fetch_row, return_row, entry = row_widths(sets.params)
    shard = sets.params["means"].shape[0] / workers
    out = []
    for step in schedule:
        total = 0.0
        for tasks in step:
            if not tasks:
                continue
            read, drawn = (rows.numel() for rows in rank_rows(sets, tasks))
            total += fetch_row * max(0.0, read - shard) + return_row * max(0.0, drawn - shard)
            total += entry * sum(max(0.0, sets.active[t.view].numel() - shard) for t in tasks)
        out.append(round(total / workers))
    return out


def replicated_bytes(sets: Sets, schedule: list, workers: int) -> list[int]:
    """Per step, the bytes a rank sends in the replicated gradient exchange (the transport's model, by bytes)."""
    params = sets.params
    width = sum(p[0].numel() for p in params.values())
    shape = ExchangeShape(workers, width, FLOAT, StatsLayout.of(STATS_SCHEMA), len(params))
    out = []
    for step in schedule:
        sizes, rows = [], []
        for tasks in step:
            drawn = torch.unique(torch.cat([sets.active[t.view] for t in tasks])) if tasks else torch.zeros(0, dtype=torch.int64)
            entries = sum(sets.active[t.view].numel() for t in tasks)
            span = int(drawn.max()) + 1 if drawn.numel() else 0
            sizes.append(Sizes(drawn.numel(), entries, len(tasks), span))
            rows.append(drawn)
        union = torch.unique(torch.cat(rows)).numel()
        out.append(min(shape.predict(sizes, union).values()))
    return out


class CountingExchange:
    """A rank's row exchange that counts the bytes of the pieces it sends to other ranks, per exchange name."""

    def __init__(self, inner, rank: int) -> None:
        self.inner, self.rank = inner, rank
        self.sent: dict[str, int] = {}

    def start(self, pieces, what: str):
        self.sent[what] = self.sent.get(what, 0) + sent_bytes(pieces, self.rank)
        return self.inner.start(pieces, what)


def counted_bytes(sets: Sets, schedule: list, owner: Tensor, workers: int) -> list[list[int]]:
    """The sharded barrier (``odin`` placement, learning rate 0) on W threads: per step and rank, the bytes of the
    fetch, return and statistics pieces it sent to other ranks."""
    cuts = ShardCuts(torch.tensor([0, *torch.bincount(owner, minlength=workers).cumsum(0).tolist()]))
    config = OdinRuntimeConfig(mode="barrier")
    exchange = VirtualRowExchange(workers)
    loops, counters = [], []
    for rank in range(workers):
        lo, hi = cuts.range(rank)
        shard = {name: torch.nn.Parameter(p[lo:hi].clone()) for name, p in sets.params.items()}
        optimizers = selective_adams(shard, {name: 0.0 for name in shard})
        adapter = GsplatAdapter()
        owner_ = Owner(shard, optimizers, cuts, rank, adapter, config.candidate_margin, config.near_plane)
        reader = Reader(cuts, shard, render_black, adapter, Meter(torch.device("cpu")), 0, config.ring_slots, True)
        counting = CountingExchange(exchange.endpoint(rank), rank)
        loops.append(ShardedLoop(owner_, reader, counting, rank, lambda s: schedule[s], "barrier", len(schedule) - 1, 300.0))
        counters.append(counting)
    per_step: list[list[int]] = []
    errors: list[BaseException] = []
    lock = threading.Barrier(workers)

    def run(rank: int) -> None:
        try:
            loops[rank].place(sets.views)
            for step in range(len(schedule)):
                before = sum(counters[rank].sent.values())
                loops[rank].iteration(step)
                lock.wait()
                if rank == 0:
                    per_step.append([0] * workers)
                lock.wait()
                per_step[step][rank] = sum(counters[rank].sent.values()) - before
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            lock.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return per_step


def render_black(task: Task, leaves: dict[str, Tensor], generator: torch.Generator):
    """The task's image (the project's CPU rasterizer) against black: the bytes do not depend on the loss."""
    image, info = splat(task, leaves, generator)
    return image.abs().mean(), info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick`` shrinks everything and never writes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="*", default=[2, 4, 8], help="W values")
    parser.add_argument("--steps", type=int, default=16, help="schedule steps per (scene, W)")
    parser.add_argument("--check-steps", type=int, default=4, help="steps of the real sharded run that checks the model")
    parser.add_argument("--street-gaussians", type=int, default=50_000)
    parser.add_argument("--street-length", type=float, default=100.0)
    parser.add_argument("--object-gaussians", type=int, default=20_000)
    parser.add_argument("--city-views", type=int, default=160)
    parser.add_argument("--city-gaussians", type=int, default=100_000)
    parser.add_argument("--object-views", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small scenes, W = 2 and 4, print only")
    parser.add_argument("--output", default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.check_steps > OdinRuntimeConfig().ring_slots:
        parser.error(f"--check-steps {args.check_steps}: at most K = {OdinRuntimeConfig().ring_slots}, the steps a run "
                     "places by candidate rows alone (the model's placement)")
    if args.quick:
        args.workers, args.steps, args.check_steps, args.no_write = [2, 4], 4, 2, True
        args.street_gaussians, args.object_gaussians, args.street_length, args.object_views = 6000, 3000, 40.0, 16
        args.city_views, args.city_gaussians = 24, 6000
    return args


def mean_per_rank(per_step: list[list[int]]) -> float:
    """Mean bytes per rank per step."""
    return sum(sum(step) for step in per_step) / max(sum(len(step) for step in per_step), 1)


def main(argv: list[str] | None = None) -> None:
    """Model every (scene, W, placement), check the model against a real run, print and record the table."""
    args = parse_args(argv)
    command = "python " + shlex.join(["benchmarks/bench_shard_bytes.py", *(sys.argv[1:] if argv is None else argv)])
    torch.set_num_threads(1)
    lines = [
        "| scene | W | odin KiB | locality schedule KiB | random (Grendel-style) KiB | replicated exchange KiB "
        "| by readers KiB | floor KiB | odin / random | by readers / random | floor / random | odin / replicated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts, checks = [], []
    for name in SCENES:
        sets = scene_sets(name, args)
        for workers in args.workers:
            regional = schedule_for(sets, workers, args.steps, "regions", args.seed)
            schedule = schedule_for(sets, workers, args.steps, "rlg", args.seed)
            zorder, dealt = owners(sets, "zorder", workers, args.seed), owners(sets, "random", workers, args.seed)
            readers = reader_owners(sets, regional, workers)
            figures = {
                "odin": mean_per_rank(step_bytes(sets, regional, zorder, True, workers)),
                "readers": mean_per_rank(step_bytes(sets, regional, readers, True, workers)),
                "rlg": mean_per_rank(step_bytes(sets, schedule, zorder, True, workers)),
                "random": mean_per_rank(step_bytes(sets, schedule, dealt, False, workers)),
            }
            replicated = sum(replicated_bytes(sets, schedule, workers)) / len(schedule)
            floor = sum(floor_bytes(sets, regional, workers)) / len(regional)
            saved = 1.0 - figures["odin"] / figures["random"]
            by_readers = 1.0 - figures["readers"] / figures["random"]
            verdicts.append((name, workers, saved, 1.0 - floor / figures["random"], by_readers))
            lines.append(
                f"| {name} | {workers} | {figures['odin'] / 1024:,.0f} | {figures['rlg'] / 1024:,.0f} "
                f"| {figures['random'] / 1024:,.0f} | {replicated / 1024:,.0f} | {figures['readers'] / 1024:,.0f} "
                f"| {floor / 1024:,.0f} | {figures['odin'] / figures['random']:.3f} "
                f"| {figures['readers'] / figures['random']:.3f} | {floor / figures['random']:.3f} "
                f"| {figures['odin'] / replicated:.3f} |"
            )
            print(lines[-1], flush=True)
            if name == "street" and workers in (2, 4):
                short = regional[: args.check_steps]
                model = step_bytes(sets, short, zorder, True, workers)
                counted = counted_bytes(sets, short, zorder, workers)
                checks.append((workers, model, counted))
    text = report(args, command, lines, verdicts, checks)
    print(text)
    publish(NAME, text, None if args.no_write else args.output)


def report(args, command: str, lines: list[str], verdicts: list, checks: list) -> str:
    """The markdown section (without markers)."""
    met = [
        f"{name} W={w}: {saved:.1%} fewer ({'met' if saved >= TARGET else 'not met'})"
        for name, w, saved, *_ in verdicts
    ]
    beyond = [f"{name} W={w} (at most {best:.1%} fewer)" for name, w, _, best, _ in verdicts if best < TARGET]
    by_readers = [
        f"{name} W={w}: {read:.1%} (odin {saved:.1%})" for name, w, saved, _, read in verdicts if saved < TARGET
    ]
    out = [
        "## bench_shard_bytes: bytes per rank per step, sharded with Odin's placement against a Grendel-style one",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        f"Scenes: street ({args.street_gaussians:,} Gaussians along {args.street_length:.0f} m, side-looking rig), object "
        f"({args.object_gaussians:,} Gaussians, {args.object_views} ring views), city (odin-synth's city preset: "
        f"{args.city_views} views along a grid of streets, {args.city_gaussians:,} Gaussians); the first {args.steps} "
        "steps of each order's schedule, at most an epoch (every view once) (B = 1) per W. Bytes each rank sends to other ranks per step (fetch, return, statistics; the replicated "
        "column: the gradient exchange), KiB = 1024 bytes. `odin`: the regional order (`--pipeline.datamanager."
        "schedule-order regions`, each worker its own region's views), the Z-order model cut by load, each step's "
        "workers placed on the ranks owning most of their rows; `locality schedule`: the same shards and placement "
        "under the default locality order (a step's views strongly connected); `random`: the locality order with "
        "rows dealt to ranks at random, as Grendel re-distributes them; `replicated`: the replicated mode's gradient "
        "exchange under the locality order; `by readers`: the regional order with each row owned by the worker whose "
        "tasks read it most (`reader_owners`: shards of equal size, not Z-order ranges); `floor`: the fewest bytes "
        "any placement of the rows in W shards of N / W "
        "rows can send under the regional order's steps (a rank's step reads the union U of its tasks' C(t), of which "
        "at most N / W rows are its own: at least |U| - N / W come from other ranks; the same for A(t) and the "
        "statistics).",
        "",
        *lines,
        "",
        f"- Target: at least {TARGET:.0%} fewer bytes than the Grendel-style placement: " + "; ".join(met) + ".",
        "- Out of reach of any placement of equal shards (the floor itself saves less than the target: a view sees "
        "more rows than one shard holds): " + ("; ".join(beyond) if beyond else "none") + ".",
        "- Where the target is not met, what rows placed by their readers save (`by readers` against `random`): "
        + ("; ".join(by_readers) if by_readers else "none") + ".",
    ]
    for workers, model, counted in checks:
        equal = model == counted
        out.append(
            f"- Check, street W = {workers}, {len(model)} steps of the real sharded barrier: counted from the pieces "
            f"passed to the exchange {'equal to' if equal else 'NOT equal to'} the model per rank and step "
            f"(model {mean_per_rank(model) / 1024:,.1f} KiB, counted {mean_per_rank(counted) / 1024:,.1f} KiB per rank per step)."
        )
    return "\n".join(out)


if __name__ == "__main__":
    main()
