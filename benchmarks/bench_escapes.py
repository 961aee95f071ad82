"""Escape benchmark: how often A(t) escapes C(t) on real captures and with cameras inside the content, before and
after C(t) was culled against the drawable region of the camera a task renders with.

Why: every escape is a whole render and backward thrown away. Targets: escape re-runs <= 1% of tasks on every real
scene at every resolution run and on the cameras-inside scenes, with |C(t)| at most 10% larger than before.

Real scenes. odin-splat with its defaults (W, B, the resolution schedule's first downscale, escape checks,
densification) trained by ``train_virtual`` (virtual workers, one process) in the barrier mode for ``--steps``
schedule steps per scene and resolution (``camera_res_scale_factor``), once with C(t) culled as before the fix
(the task camera's frustum widened by 0.1 of the image plus 2 px, spheres x 1.1: re-created here for the
comparison) and once as now, side by side in one process from the same seed. Per run: the share of tasks re-run
by kind (a re-run with several failure kinds counts under each), mean |C(t)| / |A(t)| (A(t): the rows a render
drew, radii > 0; C(t) from the render spans), and bookkeeping per task (the hooks' wall time, noisy on a shared
machine).

Synthetic scenes. ``scenes.close_cameras.inside_shell``: 8 cameras on a ring inside a shell of Gaussians, portrait
and landscape, rendered at 1/1 and 1/4 of the task camera (the resolution schedule): per task, whether A(t)
(the projection's drawn rows) escapes C(t) before and after, and |C(t)| after / before.

Usage: ``python benchmarks/bench_escapes.py [--steps 6] [--scenes kermit_320 fern ...] [--scales 0.125 ...]``;
``--quick`` runs kermit_320 at 1/8 for 2 steps and the synthetic scenes, and never writes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from _report import BENCHMARKS, machine, publish
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.rendering.rasterize import drawn_rows
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.scenes.close_cameras import inside_shell

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ODIN_SHARED_DATA", ROOT.parent / "shared" / "data"))
SCENES = {"kermit_320": ROOT / "tests" / "data" / "kermit_320", **{n: SHARED_DATA / n for n in ("fern", "fountain_p11", "kermit")}}
KINDS = ("escape", "stale", "candidate")


def before_fix(camera: Camera, margin: float, near_plane: float) -> CullRegion:
    """C(t)'s region before the fix: the task camera's frustum widened by ``margin`` of the image plus 2 px,
    spheres x (1 + margin)."""
    pad_x, pad_y = margin * camera.width + 2.0, margin * camera.height + 2.0
    return CullRegion.sphere(camera, pad_x, pad_y, 1.0 + margin, near_plane)


@contextmanager
def culled(how: str) -> Iterator[None]:
    """Cull C(t) as before the fix (``before``) or as now (``after``) inside the block."""
    if how == "after":
        yield
        return
    region = CullingIndex.region
    CullingIndex.region = lambda self, task: before_fix(task.camera, self.margin, self.near_plane)  # type: ignore
    try:
        yield
    finally:
        CullingIndex.region = region  # type: ignore


@contextmanager
def counting_active(sizes: list[int]) -> Iterator[None]:
    """Record |A(t)| (radii > 0) of every render of the task renderer inside the block."""
    from odin_nerfstudio.ns.splat_runtime import SplatTaskRenderer

    call = SplatTaskRenderer.__call__

    def counted(self, task, leaves, generator):  # type: ignore[no-untyped-def]
        loss, info = call(self, task, leaves, generator)
        sizes.append(int((info["radii"] > 0).sum()))
        return loss, info

    SplatTaskRenderer.__call__ = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        SplatTaskRenderer.__call__ = call  # type: ignore[method-assign]


def run_real(scene: Path, scale: float, steps: int, how: str) -> dict[str, float]:
    """One barrier run of odin-splat on ``scene`` at ``scale``: re-run shares by kind, |C| / |A|, bookkeeping."""
    from odin_nerfstudio.method_configs.odin_splat import odin_splat
    from odin_nerfstudio.ns.splat_runtime import splat_learning_rates, train_virtual

    config = copy.deepcopy(odin_splat.config)
    config.pipeline.datamanager.data = scene
    config.pipeline.datamanager.camera_res_scale_factor = scale
    runtime_config = dataclasses.replace(config.runtime, mode="barrier")
    active: list[int] = []
    with culled(how), counting_active(active):
        _, runtime = train_virtual(config.pipeline, runtime_config, steps, splat_learning_rates(config.optimizers))
    counters = runtime.meter.counters
    renders = [e for e in runtime.meter.timeline.events if e.name == "render"]
    candidates = [e.args["candidates"] for e in renders]
    first_tasks = counters.tasks - counters.reruns
    return {
        "tasks": first_tasks,
        **{kind: counters.validation_failures.get(kind, 0) / first_tasks for kind in KINDS},
        "c_over_a": sum(c / max(a, 1) for c, a in zip(candidates, active)) / len(active),
        "candidates": sum(candidates) / len(candidates),
        "bookkeeping_ms": counters.bookkeeping_ns / 1e6 / counters.tasks,
    }


def run_synthetic(size: tuple[int, int], factor: int) -> dict[str, float]:
    """Per task of an ``inside_shell`` scene rendered at 1 / ``factor``: escapes before and after, |C| ratio."""
    cameras, rows = inside_shell(20000, 8, *size)
    bounds = BoundingSpheres.of(rows["means"], torch.exp(rows["scales"]))
    escaped = {"before": 0, "after": 0}
    sizes = {"before": 0, "after": 0}
    active = 0
    for camera in cameras:
        K = camera.K.clone()
        K[:2] /= factor
        render = Camera(camera.viewmat, K, camera.width // factor, camera.height // factor)
        drawn = drawn_rows(render, rows)
        active += int(drawn.sum())
        for how, region in (("before", before_fix(camera, 0.1, 0.01)), ("after", CullRegion.candidates(render, 0.1))):
            inside = bounds.meets(region)
            escaped[how] += int(bool((drawn & ~inside).any()))
            sizes[how] += int(inside.sum())
    return {
        "tasks": len(cameras),
        "escape_before": escaped["before"] / len(cameras),
        "escape_after": escaped["after"] / len(cameras),
        "c_over_a": sizes["after"] / active,
        "c_ratio": sizes["after"] / sizes["before"],
    }


def pct(value: float) -> str:
    return f"{100.0 * value:.1f}%"


def report(command: str, real: list[tuple[str, float, dict, dict, float]], synthetic: list[tuple[str, dict]]) -> str:
    """The section: the real scenes' table (before | after), the synthetic table, targets beside the figures."""
    lines = [
        "## Escapes: A(t) outside C(t) (bench_escapes)",
        "",
        f"Command: `{command}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
        f"Machine: {machine(torch)}; shared with other jobs, so bookkeeping per task is noisy.",
        "",
        "Real scenes, odin-splat defaults in the barrier mode (its first resolution-schedule downscale), `before` = C(t)"
        " culled as before the fix (task camera's frustum + 0.1 of the image + 2 px, spheres x 1.1), `after` = the"
        " drawable region of the render camera (each row's own radius factor, sqrt(1 + ax^2 + ay^2) of its clamped"
        " slopes) + 0.1 of the image, its near plane moved by 1.1 x the radius. Re-run shares are of first tries"
        " (target: escape <= 1%; |C| after / before <= 1.10).",
        "",
        "| scene | scale | tasks | escape before | escape after | stale before / after | candidate before / after"
        " | mean C/A before / after | C after / before | bookkeeping ms/task before / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, scale, before, after, wall in real:
        lines.append(
            f"| {name} | 1/{round(1 / scale)} | {after['tasks']} | {pct(before['escape'])} | {pct(after['escape'])} "
            f"| {pct(before['stale'])} / {pct(after['stale'])} | {pct(before['candidate'])} / {pct(after['candidate'])} "
            f"| {before['c_over_a']:.2f} / {after['c_over_a']:.2f} | {after['candidates'] / before['candidates']:.3f} "
            f"| {before['bookkeeping_ms']:.1f} / {after['bookkeeping_ms']:.1f} |"
        )
    lines += [
        "",
        "Synthetic cameras inside the content (`scenes.close_cameras.inside_shell`, 20,000 Gaussians, 8 cameras, fov 60"
        " deg): share of tasks whose drawn rows escape C(t), on the static state.",
        "",
        "| scene | tasks | escape before | escape after | mean C/A after | C after / before |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in synthetic:
        lines.append(
            f"| {name} | {row['tasks']} | {pct(row['escape_before'])} | {pct(row['escape_after'])} "
            f"| {row['c_over_a']:.2f} | {row['c_ratio']:.3f} |"
        )
    short = []
    for name, scale, before, after, _ in real:
        ratio = after["candidates"] / before["candidates"]
        if after["escape"] > 0.01 or ratio > 1.10:
            short.append(f"{name} 1/{round(1 / scale)} (escape {pct(after['escape'])}, C ratio {ratio:.3f})")
    for name, row in synthetic:
        if row["escape_after"] > 0.01 or row["c_ratio"] > 1.10:
            short.append(f"{name} (escape {pct(row['escape_after'])}, C ratio {row['c_ratio']:.3f})")
    lines += ["", f"Rows above a target (escape > 1% or C after / before > 1.10): {'; '.join(short) or 'none'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="schedule steps per real scene and resolution")
    parser.add_argument("--scenes", nargs="+", default=list(SCENES), choices=list(SCENES))
    parser.add_argument("--scales", nargs="+", type=float, default=[0.125, 0.25])
    parser.add_argument("--quick", action="store_true", help="kermit_320 at 1/8, 2 steps; never writes")
    args = parser.parse_args(argv)
    if args.quick:
        args.scenes, args.scales, args.steps = ["kermit_320"], [0.125], 2
    torch.set_num_threads(1)
    real = []
    for name in args.scenes:
        if not (SCENES[name] / "sparse" / "0").is_dir():
            print(f"skipping {name}: no COLMAP model at {SCENES[name]}/sparse/0 (set ODIN_SHARED_DATA)")
            continue
        for scale in args.scales:
            start = time.perf_counter()
            before = run_real(SCENES[name], scale, args.steps, "before")
            after = run_real(SCENES[name], scale, args.steps, "after")
            real.append((name, scale, before, after, time.perf_counter() - start))
            print(name, scale, before, after, flush=True)
    synthetic = [
        (f"inside_shell {w}x{h} at 1/{f}", run_synthetic((w, h), f)) for w, h in ((540, 960), (80, 60)) for f in (1, 4)
    ]
    command = "python benchmarks/bench_escapes.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    publish("bench_escapes", report(command.strip(), real, synthetic), None if args.quick else BENCHMARKS)


if __name__ == "__main__":
    main()
