"""`odin-schedule`: compile a scene's Relative Locality Graph and schedule ahead of training, print and draw them.

Odin (arXiv 2607.19893) predicts conflicts between training views from their SfM tracks and orders the views so
that consecutive steps share few primitives. This command shows what that buys on a scene before any training:
the RLG's size and weights, the predicted conflict mass between consecutive steps against a random order of the
same views, and the balance of predicted work across workers; with ``--checkpoint`` (a trained run) also that
conflict ratio under the rows the run's model draws in each view, beside the one under the RLG's own weights
(``drawn_conflicts.py``; the nerfstudio layer reads the run, ``ns/schedule_command.py``); with ``--output`` it draws the RLG (views at their
camera centres projected onto the centres' two principal axes, edges shaded by weight) beside the conflict
profile of epoch 0 (conflict mass of each step with its predecessor) for the schedule and the random order.

Views: by default the training split, the views `ns-train odin-splat` schedules: the names in
``<scene>/train_list.txt`` when the scene has one, else every image of the COLMAP model at ``<scene>/sparse/0``
but every 8th in COLMAP image-id order, which nerfstudio holds out for evaluation (``--eval-interval``, as
odin-colmap's). ``--split all`` schedules every image of the model. A view's predicted cost counts its points and
its image's pixels (``balance.predicted_view_cost``); a run with ``--pipeline.datamanager.camera-res-scale-factor``
scales the pixels all alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import tyro

from odin_nerfstudio.scheduling.drawn_conflicts import drawn_ratio_line
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.report import describe
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.scheduling.tracks import RlgPoints, load_reconstruction, read_colmap_tracks


@dataclass
class ScheduleCliConfig:
    """Compile the RLG and schedule of a COLMAP scene; print statistics and optionally draw them."""

    data: Path
    """Scene folder holding sparse/0/ (a COLMAP model, binary or text)."""
    split: Literal["train", "all"] = "train"
    """Views to schedule: 'train', those ns-train schedules (train_list.txt, else all but every --eval-interval-th
    image in COLMAP id order), or 'all' images of the model."""
    eval_interval: int = 8
    """With --split train and no train_list.txt: every eval-interval-th image is held out (odin-colmap's default)."""
    workers: int = 1
    """W, workers training concurrently."""
    views_per_step: int = 1
    """B, views each worker renders per step."""
    seed: int = 0
    """Seed of the schedule's per-epoch shuffle (and of the random order it is compared with)."""
    ring_size: int = 4
    """K, the farthest back (in steps) a step's overlap window reaches."""
    overlap_threshold: float = 0.1
    """Largest conflict mass per view of a step with an earlier step for the two to overlap."""
    rlg_points: RlgPoints = "in-view"
    """Points that stand for a view in the RLG: in-view (observed plus every point in its field of view, the
    default of ns-train's --pipeline.datamanager.rlg-points) or observed (its SfM track observations alone)."""
    output: Optional[Path] = None
    """PNG to draw the RLG and the conflict profile into; nothing is drawn when omitted."""
    checkpoint: Optional[Path] = None
    """A trained odin-splat run's config.yml (outputs/<scene>/<method>/<run>/config.yml): also print the schedule's
    conflict ratio to random order under the rows its newest checkpoint draws in each training view (radii > 0)."""


DrawnRows = Callable[[Path], Mapping[str, np.ndarray]]
"""A run's config.yml -> per training view (image name), the rows its model draws, int [n]."""


def main(argv: Optional[Sequence[str]] = None, drawn_rows: Optional[DrawnRows] = None) -> None:
    """Console entry point `odin-schedule`: parse the options, print the statistics, write the PNG if asked;
    ``drawn_rows`` reads ``--checkpoint`` (the nerfstudio layer's, given by its entry point)."""
    from odin_nerfstudio.core.help_text import reflow_help_texts

    reflow_help_texts()  # --help: each option's text as one paragraph, not cut where the source wraps
    config = tyro.cli(ScheduleCliConfig, args=argv, prog="odin-schedule")
    try:
        lines = run(config, drawn_rows)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"odin-schedule: error: {error}") from None
    print("\n".join(lines))


def run(config: ScheduleCliConfig, drawn_rows: Optional[DrawnRows] = None) -> list[str]:
    """Compile the schedule of ``config.data``, draw it when ``config.output`` is set, judge it by the rows
    ``config.checkpoint``'s model draws (read by ``drawn_rows``) when set; the lines to print.

    Raises:
        FileNotFoundError: no scene folder or no COLMAP model in it.
        ValueError: invalid options, W x B larger than the number of views, or an output that is not a .png.
    """
    if config.checkpoint is not None and drawn_rows is None:
        raise ValueError("--checkpoint needs nerfstudio to read the run: use the odin-schedule command")
    if config.output is not None and config.output.suffix.lower() != ".png":
        raise ValueError(f"--output must name a .png file, got {config.output}")
    if not config.data.is_dir():
        raise FileNotFoundError(f"scene folder {config.data} does not exist; pass --data <scene> holding sparse/0/")
    sparse_dir = config.data / "sparse" / "0"
    tracks = read_colmap_tracks(sparse_dir)
    if config.split == "all":
        names = tracks.image_names
        header = f"all {len(names)} images of the COLMAP model"
    else:
        names = training_views(config.data, sparse_dir, config.eval_interval)
        header = (
            f"the {len(names)} training views ns-train schedules, of {len(tracks.image_names)} images "
            "(--split all for every image)"
        )
    rlg = RelativeLocalityGraph.from_point_sets(tracks.for_names(names, config.rlg_points))
    schedule = Schedule(rlg, schedule_config(config), tracks.pixels_for_names(names))
    check_step_fits(schedule)
    lines = [f"{config.data}: {header}", *describe(schedule)]
    if config.checkpoint is not None:
        drawn = drawn_rows(config.checkpoint)
        missing = [name for name in names if name not in drawn]
        if missing:
            raise ValueError(
                f"--checkpoint {config.checkpoint} was trained without the views {missing[:3]}...; pass a run "
                f"trained on {config.data} with the same split"
            )
        lines.append(drawn_ratio_line(schedule, [drawn[name] for name in names]))
    if config.output is not None:
        centres = camera_centres(sparse_dir, names)
        draw(schedule, centres, config.output)
        lines.append(f"wrote {config.output}")
    return lines


def training_views(scene: Path, sparse_dir: Path, eval_interval: int) -> list[str]:
    """Names of the images ns-train trains on, split as nerfstudio's COLMAP dataparser splits them, so that the
    schedule printed here is the training run's: the scene's train_list.txt, else every image but every
    ``eval_interval``-th in COLMAP image-id order (held out for evaluation).

    Raises:
        ValueError: eval_interval < 1.
    """
    train_list = scene / "train_list.txt"
    if train_list.exists():
        return [line for line in train_list.read_text().splitlines() if line]
    if eval_interval < 1:
        raise ValueError(f"--eval-interval must be >= 1, got {eval_interval}")
    import pycolmap

    images = pycolmap.Reconstruction(str(sparse_dir)).images
    in_id_order = [images[image_id].name for image_id in sorted(images)]
    return [name for index, name in enumerate(in_id_order) if index % eval_interval]


def schedule_config(config: ScheduleCliConfig) -> ScheduleConfig:
    """The ScheduleConfig of the command-line options; ValueError naming the options when they are invalid."""
    try:
        return ScheduleConfig(
            num_workers=config.workers,
            views_per_worker=config.views_per_step,
            seed=config.seed,
            ring_size=config.ring_size,
            overlap_threshold=config.overlap_threshold,
        )
    except ValueError as error:
        raise ValueError(
            f"invalid schedule options ({error}); --workers, --views-per-step and --ring-size must be >= 1, "
            "--seed and --overlap-threshold >= 0"
        ) from None


def check_step_fits(schedule: Schedule) -> None:
    """ValueError when a step (W x B views) is larger than the scene, explaining what the schedule would do."""
    config, views = schedule.config, schedule.num_views
    if config.step_size <= views:
        return
    busy = min(views, config.num_workers)
    raise ValueError(
        f"--workers x --views-per-step = {config.num_workers} x {config.views_per_worker} = {config.step_size} views "
        f"per step, but the scene has only V = {views} views. The schedule would make every epoch a single short "
        f"step holding all {views} views, at most {-(-views // config.num_workers)} per worker, with "
        f"{config.num_workers - busy} of {config.num_workers} workers idle and no step to order or overlap. "
        f"Choose W x B <= {views}."
    )


def camera_centres(sparse_dir: Path, names: Sequence[str]) -> np.ndarray:
    """World-space camera centres of the named images of a COLMAP model, [V, 3]; NaN rows for unposed images."""
    by_name = {image.name: image for image in load_reconstruction(sparse_dir).images.values()}
    centres = np.full((len(names), 3), np.nan)
    for row, name in enumerate(names):
        image = by_name[name]
        if image.has_pose:
            centres[row] = image.projection_center()
    return centres


def principal_plane(points: np.ndarray) -> np.ndarray:
    """Points [N, 3] projected onto their two main axes (PCA), [N, 2]; NaN rows land on the centroid."""
    posed = ~np.isnan(points).any(axis=1)
    if not posed.any():
        return np.zeros((len(points), 2))
    centred = np.where(posed[:, None], points - points[posed].mean(axis=0), 0.0)
    _, _, axes = np.linalg.svd(centred[posed], full_matrices=False)
    plane = centred @ axes[:2].T
    return np.pad(plane, ((0, 0), (0, 2 - plane.shape[1])))


def draw(schedule: Schedule, centres: np.ndarray, path: Path) -> None:
    """PNG at ``path``: the RLG on the camera centres' principal plane (left), epoch 0's conflict profile (right)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 5.5), layout="constrained")
    FigureCanvasAgg(figure)
    graph_axes, profile_axes = figure.subplots(1, 2, width_ratios=(1.15, 1))
    draw_graph(graph_axes, schedule, principal_plane(centres))
    draw_profile(profile_axes, schedule)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def draw_graph(axes, schedule: Schedule, xy: np.ndarray) -> None:
    """RLG edges shaded by weight and views coloured by their step in epoch 0, on plane coordinates xy [V, 2]."""
    from matplotlib.collections import LineCollection
    from matplotlib.ticker import MaxNLocator

    upper = schedule.rlg.weights.tocoo()
    keep = upper.row < upper.col
    rows, cols, weights = upper.row[keep], upper.col[keep], upper.data[keep]
    order = np.argsort(weights)
    edges = LineCollection(
        np.stack([xy[rows[order]], xy[cols[order]]], axis=1), array=weights[order], cmap="Greys", linewidths=1.0
    )
    edges.set_clim(0.0, max(float(weights.max(initial=0.0)), 1e-12))
    axes.add_collection(edges)
    step_of = np.empty(schedule.num_views)
    for position, step in enumerate(schedule.epoch(0).steps):
        step_of[list(step.views)] = position
    nodes = axes.scatter(xy[:, 0], xy[:, 1], c=step_of, cmap="viridis", s=28, zorder=3, edgecolors="black")
    axes.figure.colorbar(edges, ax=axes, label="RLG weight (Jaccard of SfM tracks)", shrink=0.8)
    axes.figure.colorbar(nodes, ax=axes, label="step in epoch 0", shrink=0.8, ticks=MaxNLocator(integer=True))
    axes.set_title(f"RLG: {schedule.num_views} views, {schedule.rlg.num_edges} edges")
    axes.set_xlabel("camera centres, principal axis 1")
    axes.set_ylabel("principal axis 2")
    axes.set_aspect("equal", adjustable="datalim")
    axes.autoscale_view()


def draw_profile(axes, schedule: Schedule) -> None:
    """Conflict mass of each step of epoch 0 with its predecessor, for the schedule and the random order."""
    from matplotlib.ticker import MaxNLocator

    plan = schedule.epoch(0)
    steps = np.arange(len(plan.steps))
    scheduled = [step.conflict_mass for step in plan.steps]
    random = schedule.random_conflict_profile(0)
    axes.plot(steps, random, marker="o", color="tab:red", label=f"random order (total {random.sum():.3f})")
    axes.plot(steps, scheduled, marker="o", color="tab:blue", label=f"schedule (total {plan.conflict_mass:.3f})")
    config = schedule.config
    axes.set_title(f"conflict with the previous step, W={config.num_workers}, B={config.views_per_worker}")
    axes.set_xlabel("step in epoch 0")
    axes.set_ylabel("conflict mass (summed RLG weight)")
    axes.set_ylim(bottom=0.0)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.legend()


if __name__ == "__main__":
    main()
