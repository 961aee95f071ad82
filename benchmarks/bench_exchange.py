"""Exchange benchmark: bytes per rank per step of the sparse all-gather, union-then-reduce, dense all_reduce and the
exchange ``DistributedTransport`` chooses ("auto"), for W = 2, 4, 8 on a sparse street and a dense object.

Why: the sparse all-gather receives O(W |A|) per rank, union-then-reduce O(|U|), the dense all_reduce O(N)
whatever W; which is cheapest depends on W and on how much the ranks' active sets overlap. The transport picks per
step from what every rank knows; this shows that pick is within 10% of the cheapest fixed exchange on real active
sets (target), and how far each fixed one is from it.

Active sets. The scene's model (its world perturbed as in bench_runtime: means, scales, quats, opacities) and the
first ``--steps`` steps of Odin's schedule (RLG, B = 1): A(t) of a task is the rows the rasterizer draws for its view
(``drawn_rows``, gsplat's projection: radii > 0), a rank's rows the union over its tasks, its statistics one entry
per drawn row (``STATS_SCHEMA``: rows, grad2d, radii), its gradients random (the bytes do not depend on values),
D = 59 floats per row (gsplat's layout at SH degree 3). Scenes: ``street`` is bench_runtime's street (side-looking
rig views, each sees a few metres of a long street), ``object`` is odin-synth's object preset (a torus and ball seen
from a ring of views: every view sees about half the model).

Exchange. W gloo processes (torch.multiprocessing on this CPU; they share its cores: bytes and choices are the
figures, not speed). Every step goes through four transports one after the other (auto, then each forced choice);
the bytes are those each rank counted from the tensors it passed to the collectives (ring model: an all_gather of
b bytes per rank sends and receives (W - 1) b, an all_reduce of b bytes 2 (W - 1) / W b), which equal the
transport's formula (tests/comm/test_exchange_choice.py); every rank counts the same.

Usage: ``python benchmarks/bench_exchange.py [--quick] [--no-write]``; ``--quick`` runs small scenes, W = 2 and 4,
and never writes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor
from _report import BENCHMARKS, machine, publish
from bench_runtime import SH_DEGREE, Variant, odin_schedule, perturbed_params, rig_cameras

from odin_nerfstudio.adapter.gsplat import STATS_SCHEMA
from odin_nerfstudio.comm.distributed import DistributedTransport
from odin_nerfstudio.comm.exchange_choice import CHOICES
from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.rendering.rasterize import drawn_rows
from odin_nerfstudio.scenes.synth import PRESETS, intrinsics, street_world

NAME = "bench_exchange"
TARGET = 1.10
"""The chosen exchange's bytes must be within 10% of the cheapest fixed exchange's."""
RUNS = ("auto", *CHOICES)


@dataclass(frozen=True)
class SceneSets:
    """A scene's per-step active sets for one W: ``rows[step][rank]`` (sorted int64), and N."""

    name: str
    num_gaussians: int
    world_size: int
    rows: list[list[Tensor]]



def template(num_gaussians: int) -> dict[str, Tensor]:
    """gsplat's parameter layout at SH degree 3: D = 3 + 3 + 4 + 1 + 3 + 45 = 59 floats per row."""
    n = num_gaussians
    rest = (SH_DEGREE + 1) ** 2 - 1
    return {
        "means": torch.zeros(n, 3),
        "scales": torch.zeros(n, 3),
        "quats": torch.zeros(n, 4),
        "opacities": torch.zeros(n),
        "features_dc": torch.zeros(n, 3),
        "features_rest": torch.zeros(n, rest, 3),
    }


def street_scene(args: argparse.Namespace) -> tuple[dict[str, Tensor], list[Camera], object]:
    """bench_runtime's street: the perturbed model, the rig cameras and the world (for the schedule)."""
    world = street_world(args.street_gaussians, np.random.default_rng(args.seed), args.street_length)
    cameras = rig_cameras(Variant(args.street_length, 128, 96, args.steps), 2.5, torch.device("cpu"))
    return perturbed_params(world, torch.Generator().manual_seed(args.seed + 1), torch.device("cpu")), cameras, world


def object_scene(args: argparse.Namespace) -> tuple[dict[str, Tensor], list[Camera], object]:
    """odin-synth's object preset: the perturbed model, a ring of views and the world."""
    preset = PRESETS["object"]
    world = preset.world(args.object_gaussians, np.random.default_rng(args.seed))
    K = torch.tensor(intrinsics(128, 96, preset.horizontal_fov_deg), dtype=torch.float32)
    viewmats = torch.tensor(preset.cameras(args.object_views), dtype=torch.float32)
    cameras = [Camera(viewmat, K, 128, 96) for viewmat in viewmats]
    return perturbed_params(world, torch.Generator().manual_seed(args.seed + 1), torch.device("cpu")), cameras, world


def active_sets(name: str, args: argparse.Namespace, world_size: int) -> SceneSets:
    """Per step and rank, the rows its scheduled views draw on the scene's model."""
    params, cameras, world = (street_scene if name == "street" else object_scene)(args)
    config = SimpleNamespace(workers=world_size, views_per_worker=1, seed=args.seed)
    schedule = odin_schedule(world, cameras, config, args.steps)
    drawn: dict[int, Tensor] = {}
    rows = []
    for step in schedule:
        per_rank = []
        for tasks in step:
            for task in tasks:
                if task.view not in drawn:
                    drawn[task.view] = torch.nonzero(drawn_rows(task.camera, params)).flatten()
            sets = [drawn[task.view] for task in tasks]
            per_rank.append(torch.unique(torch.cat(sets)) if sets else torch.empty(0, dtype=torch.int64))
        rows.append(per_rank)
    return SceneSets(name, params["means"].shape[0], world_size, rows)


def update_of(rows: Tensor, template_: dict[str, Tensor], seed: int) -> SparseUpdate:
    """Random gradients on ``rows`` and one task's statistics, one entry per row."""
    generator = torch.Generator().manual_seed(seed)
    grads = {name: torch.randn(rows.numel(), *ref.shape[1:], generator=generator) for name, ref in template_.items()}
    stats = {"rows": rows, "grad2d": torch.rand(rows.numel()), "radii": torch.rand(rows.numel())}
    return SparseUpdate(rows, grads, (stats,) if rows.numel() else ())


def _rank_main(rank: int, init_file: str, sets_file: str, out_file: str) -> None:
    """One gloo rank: every step through the four transports; rank 0 saves each run's bytes and choice per step."""
    torch.set_num_threads(1)
    try:
        sets: SceneSets = torch.load(sets_file, weights_only=False)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=sets.world_size)
        params = template(sets.num_gaussians)
        transports = {run: DistributedTransport(params, 300.0, stats_schema=STATS_SCHEMA, choice=run) for run in RUNS}
        out: dict[str, list] = {run: [] for run in RUNS}
        for step, per_rank in enumerate(sets.rows):
            update = update_of(per_rank[rank], params, 1000 * step + rank)
            for run, transport in transports.items():
                handle = transport.start_exchange(step, update)
                handle.wait(timeout=300.0)
                out[run].append((handle.bytes.sent, handle.bytes.choice))
        for transport in transports.values():
            transport.close()
        if rank == 0:
            torch.save(out, out_file)
        dist.barrier()  # no rank leaves while a peer may still read its last collective's bytes
    except BaseException:
        Path(out_file + f".error{rank}").write_text(traceback.format_exc())
    os._exit(0)


@dataclass(frozen=True)
class Row:
    """One (scene, W): per run its bytes per rank per step, and the mean step's figures."""

    sets: SceneSets
    bytes: dict[str, list[int]]
    choices: list[str]

    def mean(self, run: str) -> float:
        return float(np.mean(self.bytes[run]))

    def cheapest(self) -> str:
        return min(CHOICES, key=self.mean)

    def ratio(self) -> float:
        """The chosen exchange's mean bytes over the cheapest fixed exchange's."""
        return self.mean("auto") / self.mean(self.cheapest())

    def oracle_ratio(self) -> float:
        """Over the cheapest exchange of every step."""
        oracle = [min(self.bytes[c][s] for c in CHOICES) for s in range(len(self.choices))]
        return self.mean("auto") / float(np.mean(oracle))


def exchange(sets: SceneSets) -> Row:
    """Run ``sets`` through W gloo processes."""
    with tempfile.TemporaryDirectory() as tmp:
        sets_file, out_file = f"{tmp}/sets.pt", f"{tmp}/out.pt"
        torch.save(sets, sets_file)
        mp.spawn(_rank_main, args=(f"{tmp}/init", sets_file, out_file), nprocs=sets.world_size, join=True)
        errors = [p.read_text() for p in Path(tmp).glob("out.pt.error*")]
        if errors:
            raise RuntimeError(f"{sets.name}, W = {sets.world_size}: ranks failed:\n" + "\n".join(errors))
        out = torch.load(out_file, weights_only=False)
    return Row(sets, {run: [b for b, _ in out[run]] for run in RUNS}, [c for _, c in out["auto"]])


def kib(nbytes: float) -> str:
    return f"{nbytes / 1024:,.0f}"


def table(rows: list[Row]) -> str:
    lines = [
        "| scene | N | W | mean \\|A\\| per rank | mean \\|U\\| | sparse KiB | union KiB | dense KiB | chosen KiB "
        "(sparse/union/dense steps) | chosen / cheapest fixed | chosen / cheapest per step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        sets = row.sets
        active = np.mean([r.numel() for step in sets.rows for r in step])
        union = np.mean([torch.unique(torch.cat(step)).numel() for step in sets.rows])
        counts = "/".join(str(row.choices.count(c)) for c in CHOICES)
        cells = [
            sets.name,
            f"{sets.num_gaussians:,}",
            str(sets.world_size),
            f"{active:,.0f}",
            f"{union:,.0f}",
            *(kib(row.mean(c)) for c in CHOICES),
            f"{kib(row.mean('auto'))} ({counts})",
            f"{row.ratio():.3f}",
            f"{row.oracle_ratio():.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(args: argparse.Namespace, command: str, rows: list[Row]) -> str:
    worst = max(row.ratio() for row in rows)
    return "\n".join(
        [
            "## bench_exchange: bytes per rank per step, sparse all-gather / union-then-reduce / dense all_reduce",
            "",
            f"Command: `{command}`  ",
            f"Machine: {machine(torch)}; W gloo processes on these cores  ",
            f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
            "",
            (
                f"Active sets: the first {args.steps} steps of Odin's schedule (B = 1) rendered on each scene's "
                "perturbed model (the rows its rasterizer draws), D = 59 floats per row, statistics one entry per "
                f"drawn row. street: bench_runtime's {args.street_length:.0f} m street, side-looking rig views; "
                f"object: odin-synth's object preset, {args.object_views} ring views. Bytes: what each rank sends "
                "per step (and as many received), counted from the tensors passed to the collectives (ring model), "
                "header and statistics included; KiB = 1024 bytes."
            ),
            "",
            table(rows),
            "",
            (
                f"- Target: the chosen exchange within 10% of the cheapest fixed one in every row: worst "
                f"{worst:.3f} ({'met' if worst <= TARGET else 'NOT met'})."
            ),
            (
                "- Reading: the sparse all-gather grows with W (every rank receives W - 1 padded messages), the "
                "dense all_reduce does not (2 (W - 1) / W of [N, D + 1]), union-then-reduce pays the row indices' "
                "all-gather and then 2 (W - 1) / W of [|U|, D]. The dense exchange covers rows [0, the largest row "
                "touched + 1), not always all N."
            ),
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small scenes, W = 2 and 4, print only")
    parser.add_argument("--scenes", nargs="*", default=["street", "object"], help="street and/or object")
    parser.add_argument("--workers", type=int, nargs="*", default=[2, 4, 8], help="W values")
    parser.add_argument("--steps", type=int, default=8, help="schedule steps per (scene, W)")
    parser.add_argument("--street-gaussians", type=int, default=50_000, help="N of the street")
    parser.add_argument("--street-length", type=float, default=100.0, help="street length (m)")
    parser.add_argument("--object-gaussians", type=int, default=20_000, help="N of the object")
    parser.add_argument("--object-views", type=int, default=48, help="ring views of the object")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.steps, args.street_gaussians, args.object_gaussians = [2, 4], 3, 5_000, 3_000
        args.no_write = True
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    command = "python " + shlex.join(["benchmarks/bench_exchange.py", *(sys.argv[1:] if argv is None else argv)])
    rows = []
    for name in args.scenes:
        for world_size in args.workers:
            row = exchange(active_sets(name, args, world_size))
            print(f"{name} W={world_size}: " + ", ".join(f"{c} {kib(row.mean(c))} KiB" for c in RUNS), flush=True)
            rows.append(row)
    publish(NAME, report(args, command, rows), None if args.no_write else args.output)


if __name__ == "__main__":
    main()
