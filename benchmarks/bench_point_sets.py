"""RLG point sets benchmark: which point sets ("in-view", "observed", "candidates") predict what views really draw.

Why: the RLG stands for what two views both draw, and a schedule is only as good as that prediction. Target: the
schedule beats random order on drawn-row conflict mass on every real scene at W = 2 and W = 4.

Per real scene (kermit_320 shipped; fern, fountain_p11 and kermit from the shared data at ``--scale``):
odin-splat-quick trained for ``--iterations`` iterations on one virtual worker (``train_virtual``, the same model
a checkpoint of that run holds), then every training view's drawn rows (radii > 0, at its full training
resolution, ``ns/drawn_views.py``). For each point-set choice: the Spearman rank correlation between its RLG's
edge weights and the drawn-row Jaccard over every view pair, and at W = 2 and 4 (B = 1) the conflict mass between
consecutive steps under the drawn-row weights of its schedule against the schedule's random order, summed over
``--epochs`` epochs (``scheduling/drawn_conflicts.py``; the ratio is scheduled / random, lower is better).

Usage: ``python benchmarks/bench_point_sets.py [--iterations 300] [--scale 0.25]``; ``--quick`` trains kermit_320
for 20 iterations and never writes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _report import BENCHMARKS, machine, publish
from odin_nerfstudio.scheduling.drawn_conflicts import conflict_masses, drawn_row_graph, rank_correlation
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ODIN_SHARED_DATA", ROOT.parent / "shared" / "data"))
SCENES = {"kermit_320": ROOT / "tests" / "data" / "kermit_320", **{n: SHARED_DATA / n for n in ("fern", "fountain_p11", "kermit")}}
CHOICES = {"in-view": "sfm_in_view", "observed": "sfm_tracks", "candidates": None}
"""Each ``--pipeline.datamanager.rlg-points`` choice and the train split's metadata holding its sets (candidates:
culled by the datamanager from the seed points)."""
WORKERS = (2, 4)


def train(scene: Path, scale: float, iterations: int):
    """odin-splat-quick trained on ``scene`` at ``scale`` for ``iterations`` iterations; its pipeline."""
    from odin_nerfstudio.method_configs.odin_splat_quick import odin_splat_quick_config
    from odin_nerfstudio.ns.splat_runtime import splat_learning_rates, train_virtual

    config = odin_splat_quick_config()
    config.pipeline.datamanager.data = scene
    config.pipeline.datamanager.camera_res_scale_factor = scale
    runtime = dataclasses.replace(config.runtime, mode="barrier")
    pipeline, _ = train_virtual(copy.deepcopy(config.pipeline), runtime, iterations, splat_learning_rates(config.optimizers))
    return pipeline


def measure(pipeline, epochs: int) -> dict[str, dict]:
    """Per point-set choice: Spearman correlation and, per W, (scheduled, random) drawn-row conflict mass."""
    from odin_nerfstudio.ns.drawn_views import drawn_rows_by_name

    drawn_by_name = drawn_rows_by_name(pipeline)
    outputs = pipeline.datamanager.train_dataparser_outputs
    images_dir = Path(pipeline.datamanager.dataparser.config.data) / pipeline.datamanager.dataparser.config.images_path
    names = [Path(f).relative_to(images_dir).as_posix() for f in outputs.image_filenames]
    drawn = drawn_row_graph([drawn_by_name[name] for name in names])
    results = {"drawn_mean_weight": drawn.summary()["mean_weight"], "views": len(names)}
    for choice, key in CHOICES.items():
        sets = pipeline.datamanager.candidate_sets() if key is None else outputs.metadata[key]
        rlg = RelativeLocalityGraph.from_point_sets(sets)
        row = {"spearman": rank_correlation(rlg, drawn), "mean_weight": rlg.summary()["mean_weight"]}
        for workers in WORKERS:
            schedule = Schedule(rlg, ScheduleConfig(num_workers=workers, views_per_worker=1, seed=0))
            row[workers] = conflict_masses(schedule, drawn, epochs)
            row[f"own{workers}"] = schedule.summary(epochs)["ratio"]
        results[choice] = row
    return results


def report(command: str, rows: list[tuple[str, float, int, dict]], epochs: int) -> str:
    """The section: per scene and choice, the correlation and the drawn-row conflict ratios, targets beside."""
    lines = [
        "## RLG point sets judged by drawn rows (bench_point_sets)",
        "",
        f"Command: `{command}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
        f"Machine: {machine(torch)}",
        "",
        "odin-splat-quick trained on one virtual worker, then every training view rendered (drawn rows: radii > 0)."
        " Spearman: rank correlation of the RLG's edge weights with the drawn-row Jaccard over every view pair."
        f" Ratio at W: drawn-row conflict mass between consecutive steps of the choice's schedule / its random order"
        f" (B = 1, {epochs} epochs; target < 1 on every real scene), the ratio under the RLG's own weights in"
        " brackets.",
        "",
        "| scene | scale | iterations | views | Gaussians | drawn mean weight | point sets | RLG mean weight | Spearman "
        "| ratio W=2 | ratio W=4 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, scale, gaussians, result in rows:
        for choice in CHOICES:
            row = result[choice]
            cells = []
            for workers in WORKERS:
                scheduled, random = row[workers]
                ratio = scheduled / random if random > 0 else float("nan")
                verdict = "" if ratio < 1 else " **(not < 1)**"
                cells.append(f"{ratio:.3f} ({row[f'own{workers}']:.3f}){verdict}")
            lines.append(
                f"| {name} | {scale:g} | {result['iterations']} | {result['views']} | {gaussians:,} "
                f"| {result['drawn_mean_weight']:.3f} | {choice} | {row['mean_weight']:.3f} | {row['spearman']:.3f} "
                f"| {cells[0]} | {cells[1]} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=300, help="odin-splat-quick iterations per scene")
    parser.add_argument("--scale", type=float, default=0.25, help="camera-res-scale-factor of the shared scenes")
    parser.add_argument("--epochs", type=int, default=8, help="schedule epochs the conflict mass is summed over")
    parser.add_argument("--scenes", nargs="+", default=list(SCENES), choices=list(SCENES))
    parser.add_argument("--quick", action="store_true", help="kermit_320, 20 iterations; never writes")
    args = parser.parse_args(argv)
    if args.quick:
        args.scenes, args.iterations = ["kermit_320"], 20
    torch.set_num_threads(1)
    rows = []
    for name in args.scenes:
        if not (SCENES[name] / "sparse" / "0").is_dir():
            print(f"skipping {name}: no COLMAP model at {SCENES[name]}/sparse/0 (set ODIN_SHARED_DATA)")
            continue
        scale = 1.0 if name == "kermit_320" else args.scale
        pipeline = train(SCENES[name], scale, args.iterations)
        result = measure(pipeline, args.epochs)
        result["iterations"] = args.iterations
        rows.append((name, scale, pipeline.model.num_points, result))
        print(name, result, flush=True)
    command = "python benchmarks/bench_point_sets.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    publish("bench_point_sets", report(command.strip(), rows, args.epochs), None if args.quick else BENCHMARKS)


if __name__ == "__main__":
    main()
