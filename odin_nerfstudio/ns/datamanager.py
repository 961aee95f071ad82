"""`OdinDatamanager`: nerfstudio's full-image datamanager, visiting the train views in the order of Odin's schedule.

Odin (arXiv 2607.19893) trains from a schedule compiled ahead of time from the Relative Locality Graph (RLG) of
the train views' SfM tracks: every view once per epoch, consecutive steps loosely connected, each step's W x B
tasks balanced over the W workers (:mod:`odin_nerfstudio.scheduling.schedule`). This datamanager builds that RLG and
schedule from the per-view point sets the `odin-colmap` dataparser puts in the train split's metadata (`sfm_in_view`
by default, `sfm_tracks` with `--pipeline.datamanager.rlg-points observed`; with `candidates`, each view's candidate
set on the model training starts from, culled from the seed points; view costs from the train cameras' width x
height, after `camera_res_scale_factor`), and serves each rank's tasks in order.

Who reads the schedule. odin-splat's trainer (`OdinTrainer`) runs schedule step i at iteration i on every rank,
all of the step's tasks through Odin's runtime, and reads `schedule`, `workers` and the cached images from here;
a rank without a task in a short step still takes part in that step's exchange. `next_train` below serves a
plain nerfstudio loop (one task per iteration), as a pipeline built on this datamanager without the runtime has.

Which task an iteration gets from `next_train`. Worker w's task sequence is the concatenation, over the schedule's
global steps, of ``step.tasks[w]``; a process of rank r in a world of N processes runs the workers r, r + N, r + 2N,
... of the schedule (W must be a multiple of N; with the default W = N, rank r is worker r) and its sequence
interleaves them step by step, worker by worker. Iteration i gets the i-th task of that sequence: ``next_train(i)``
is a pure function of i (the same step always gives the same camera, so a resumed run, which nerfstudio restarts at
the checkpoint's step + 1, continues exactly), and epochs follow one another seamlessly.

Short last steps and idle workers. When S = W x B does not divide V, an epoch's last step holds V mod S views,
at most ceil((V mod S) / W) per worker, and some workers get fewer tasks than others or none. Such a rank does not
idle in nerfstudio's loop: its next iteration is the next epoch's first task. Ranks therefore run the same
schedule step at the same iteration only up to the first uneven short step; after that, a rank may be ahead of
another by the difference of their task counts, accumulated over epochs (fern's 17 train views with W = 2, B = 1:
rank 0 runs 9 tasks per epoch, rank 1 runs 8). Each camera carries its global schedule step in
``camera.metadata["odin_step"]``. Finding the epoch of an iteration then needs the task counts of all earlier
epochs (about 3 ms per epoch on fern, paid once on resume); when every epoch gives the rank the same count
(S divides V, or the rank runs every worker) it is a division. A rank with no task at all (W > V) is an error.

The run folder. When the trainer sets up its callbacks, the datamanager writes the schedule (config,
fingerprints of the RLG and the costs, epoch 0) to ``<base_dir>/odin_schedule.json`` from rank 0 and logs the
RLG and schedule statistics. On resume (``--load-dir <run>/nerfstudio_models`` or ``--load-checkpoint``) every
rank first reloads ``<run>/odin_schedule.json`` and checks it against the regenerated schedule: a different
scene (views, tracks, camera sizes) or different schedule options raise a ValueError that says which.

Rank: nerfstudio hands datamanagers the rank within the machine, so when torch.distributed is initialized the
global rank and the world size are taken from it instead. `train_cameras_sampling_strategy` and its seed are ignored.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Literal, Optional, Tuple, Type, Union

import numpy as np
import torch
import tyro
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.configs.dataparser_configs import AnnotatedDataParserUnion
from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanager, FullImageDatamanagerConfig
from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackAttributes
from nerfstudio.utils.rich_utils import CONSOLE

from odin_nerfstudio.culling.initial import RlgPointSets
from odin_nerfstudio.ns.dataparser import OdinColmapDataParserConfig
from odin_nerfstudio.scheduling.balance import BALANCE_TOLERANCE, MIN_BAND_GROUPS
from odin_nerfstudio.scheduling.regions import REGIONAL, OrderOption, resolved_order, view_keys

if TYPE_CHECKING:
    from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig

SCHEDULE_FILENAME = "odin_schedule.json"


@dataclass
class OdinDatamanagerConfig(FullImageDatamanagerConfig):
    """Full images in the order of Odin's schedule, compiled from the train views' SfM tracks."""

    _target: Type = field(default_factory=lambda: OdinDatamanager)
    dataparser: AnnotatedDataParserUnion = field(default_factory=OdinColmapDataParserConfig)
    """Must put per-view `sfm_tracks` and `sfm_in_view` in the train split's metadata, as odin-colmap does."""
    num_workers: Optional[int] = None
    """W, workers of the schedule; None: the world size N. In one process, W virtual workers; a distributed run needs
    one per process (W = N)."""
    views_per_step: int = 1
    """B, views each worker renders per step. odin-splat's trainer runs one step per iteration: W x B views, their
    gradients summed, one update (a plain nerfstudio loop over `next_train` would take one view per iteration)."""
    schedule_seed: int = 0
    """Seeds the schedule's per-epoch shuffle."""
    schedule_order: OrderOption = "auto"
    """rlg: Odin's locality schedule (consecutive steps loosely connected); random: a seeded random order of the
    views, the paper's "overlap without locality" control; regions: each worker the views of its own region of the
    scene (`scheduling/regions.py`), so that sharded ranks read mostly their own rows; halves: regions in two halves
    of the scene, consecutive steps in opposite halves (for many workers, whose regions are small); auto: with
    --sharded, regions below 16 workers and halves from 16 on, rlg otherwise."""
    sharded: tyro.conf.Suppress[bool] = False
    """Whether the run is sharded: not a flag of its own, OdinTrainer sets it from --sharded (for auto's order)."""
    ring_size: tyro.conf.Suppress[int] = 4
    """K, the farthest back (in steps) a step's overlap window reaches: not a flag of its own, OdinTrainer sets it
    from the runtime's K (``--runtime.ring-slots``), so the schedule and the staging ring agree."""
    overlap_threshold: float = 0.1
    """Largest conflict mass per view of a step with an earlier step for the two to overlap."""
    rebalance_every: int = 0
    """Every N epochs, cut the later epochs' steps by the views' measured render + backward seconds (the ranks' own
    measurements, added up at the epoch's first step; Grendel balances by measured time), so that a barrier step's
    workers finish together; 0: by predicted costs throughout. Each run then trains its own schedule, so two runs
    (quality-first and the barrier) are equal bit for bit only without it."""
    balance_tolerance: float = BALANCE_TOLERANCE
    """Largest relative cost spread of the views one step groups (B = 1; B times it with B views per worker), by the
    predicted costs or, with rebalance-every, the measured ones: the schedule takes the fewest cost bands that keep
    its steps within 1 + it, since each band narrows where locality is sought; 0: the evenest steps the bands give."""
    band_floor: int = MIN_BAND_GROUPS
    """The regions order's fewest steps' worth of views in a cost band: 4 keeps a worker's consecutive views apart,
    which quality-first reads ahead by; 1 (with balance-tolerance 0) gives a barrier its evenest steps
    (`benchmarks/bench_band_replay.py` replays both on a run's measured renders)."""
    rlg_points: RlgPointSets = "in-view"
    """Which points stand for a view in the RLG: in-view, the SfM points it observes plus every point in its field
    of view (what the rasterizer draws, so what conflicts); observed, its track observations alone (the paper's RLG,
    blind to far content: on a street SfM matches stop a few metres away while a view down it draws far beyond);
    candidates, its candidate set C(t) on the model training starts from, culled as the runtime culls (also the
    Gaussians whose bounding spheres reach into the view: the rows over which its tasks wait)."""
    candidate_margin: tyro.conf.Suppress[float] = 0.1
    """C(t)'s margin for rlg-points candidates: not a flag of its own, OdinTrainer sets it from the runtime's
    (``--runtime.candidate-margin``), so the RLG's sets are the runtime's candidate sets."""
    near_plane: tyro.conf.Suppress[float] = 0.01
    """The rasterizer's near plane for rlg-points candidates: OdinTrainer sets it from ``--runtime.near-plane``."""

    def schedule_config(self, world_size: int) -> ScheduleConfig:
        """The ScheduleConfig these options give in a world of ``world_size`` processes."""
        from odin_nerfstudio.scheduling.schedule import ScheduleConfig

        workers = world_size if self.num_workers is None else self.num_workers
        if workers % world_size:
            raise ValueError(
                f"num_workers = {workers} is not a multiple of the world size {world_size}: every rank must run "
                "the same number of the schedule's workers; leave num_workers unset to use the world size"
            )
        order = resolved_order(self.schedule_order, self.sharded, workers)
        return ScheduleConfig(
            num_workers=workers,
            views_per_worker=self.views_per_step,
            seed=self.schedule_seed,
            order=order,
            ring_size=self.ring_size,
            overlap_threshold=self.overlap_threshold,
            balance_tolerance=self.balance_tolerance,
            band_floor=self.band_floor,
        )


class OdinDatamanager(FullImageDatamanager):
    """FullImageDatamanager whose `next_train(step)` returns this rank's scheduled task for that iteration."""

    config: OdinDatamanagerConfig

    def __init__(
        self,
        config: OdinDatamanagerConfig,
        device: Union[torch.device, str] = "cpu",
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(
            config, device=device, test_mode=test_mode, world_size=world_size, local_rank=local_rank, **kwargs
        )
        self.rank = _global_rank(local_rank)
        self.world_size = world_size = _world_size(world_size)
        self.view_pixels = (self.train_dataset.cameras.width * self.train_dataset.cameras.height).view(-1).numpy()
        self.schedule = self._compile_schedule()
        self.predicted_schedule = self.schedule
        """The schedule by predicted costs; ``schedule`` is it re-balanced by measured ones from ``rebalanced``'s
        epoch on, once :meth:`rebalance` has run."""
        self.rebalanced: Optional[Tuple[int, np.ndarray]] = None
        self.workers = range(self.rank, self.schedule.config.num_workers, world_size)
        self._epoch_starts = [0]
        self._epoch_tasks: Dict[int, Tuple[Tuple[int, int], ...]] = {}
        self._check_rank_has_tasks()

    def next_train(self, step: int) -> Tuple[Cameras, Dict]:
        """Camera [1] and data (image [H, W, 3]) of this rank's task for iteration ``step``; a pure function of step."""
        schedule_step, view = self.task_at(step)
        camera, data = self._train_view(view)
        camera.metadata["odin_step"] = schedule_step
        return camera, data

    def task_at(self, iteration: int) -> Tuple[int, int]:
        """(global schedule step, train view index) of this rank's task number ``iteration``."""
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        epoch, position = self._locate(iteration)
        return self._rank_tasks(epoch)[position]

    def rebalance(self, epoch: int, view_cost: np.ndarray) -> None:
        """Train the epochs from ``epoch`` on by ``view_cost`` [V] (measured seconds per view; every rank passes the
        same); the epochs before it must all have been read (their tasks are not kept)."""
        self.schedule = self.predicted_schedule.with_view_cost(view_cost)
        self.rebalanced = (int(epoch), self.schedule.view_cost)
        del self._epoch_starts[epoch + 1 :]
        self._epoch_tasks = {}

    def get_training_callbacks(
        self, training_callback_attributes: TrainingCallbackAttributes
    ) -> List[TrainingCallback]:
        """Attach the schedule to the trainer's run folder (see :meth:`attach_run`); adds no callback."""
        trainer = training_callback_attributes.trainer
        if trainer is not None:
            self.attach_run(Path(trainer.base_dir), resumed_run_dir(trainer.config))
        return super().get_training_callbacks(training_callback_attributes)

    def attach_run(self, run_dir: Path, resumed_from: Optional[Path] = None) -> None:
        """Check the schedule saved in ``resumed_from`` (if any), save ours in ``run_dir`` (rank 0) and log it.

        Raises:
            ValueError: the saved schedule belongs to another scene or other schedule options.
        """
        from odin_nerfstudio.scheduling.report import describe

        if resumed_from is not None:
            self.check_saved_schedule(resumed_from / SCHEDULE_FILENAME)
        if self.rank != 0:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.schedule.save(run_dir / SCHEDULE_FILENAME)
        CONSOLE.print(f"[bold]Odin schedule[/bold], saved to {run_dir / SCHEDULE_FILENAME}")
        for line in describe(self.schedule):
            CONSOLE.print("  " + line)

    def check_saved_schedule(self, path: Path) -> None:
        """Reload the schedule saved at ``path`` and check it equals the regenerated one; warn when there is none."""
        from odin_nerfstudio.scheduling.schedule import Schedule

        if not path.exists():
            CONSOLE.print(
                f"[yellow]odin: the resumed run has no {SCHEDULE_FILENAME} at {path.parent}; continuing with the "
                "schedule regenerated from this run's options (the same scene and options give the same one).[/yellow]"
            )
            return
        try:
            saved = Schedule.load(path, self.schedule.rlg, self.view_pixels, view_keys=self.schedule.view_keys)
        except ValueError as error:
            raise ValueError(
                f"odin: cannot resume with the schedule saved at {path}: {error}. Usually the scene (COLMAP model, "
                "images, train split or camera-res-scale-factor) differs from the saved run's; resume with the same "
                "data and options, or start a new run."
            ) from error
        if saved.config != self.schedule.config:
            saved_options, options = asdict(saved.config), asdict(self.schedule.config)
            changed = ", ".join(
                f"{name}: saved {saved_options[name]!r}, now {value!r}"
                for name, value in options.items()
                if saved_options[name] != value
            )
            raise ValueError(
                f"odin: the schedule saved at {path} was compiled with other options ({changed}); resume with the "
                "saved run's world size and --pipeline.datamanager schedule options, or start a new run."
            )

    def _compile_schedule(self) -> Schedule:
        """RLG of the train views' tracks and its schedule for this world size."""
        from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
        from odin_nerfstudio.scheduling.schedule import Schedule

        key = "sfm_tracks" if self.config.rlg_points == "observed" else "sfm_in_view"
        metadata = self.train_dataparser_outputs.metadata
        tracks = metadata.get(key)
        if tracks is None:
            raise ValueError(
                f"OdinDatamanager needs per-view SfM point sets (metadata '{key}') to build the RLG; use the "
                "odin-colmap dataparser (`ns-train odin-splat ... odin-colmap`)."
            )
        if len(tracks) != len(self.train_dataset):
            raise ValueError(f"{key} holds {len(tracks)} views but the train split has {len(self.train_dataset)}")
        config = self.config.schedule_config(self.world_size)
        keys = None
        if config.order in REGIONAL:
            keys = view_keys(tracks, np.asarray(metadata["points3D_ids"]), np.asarray(metadata["points3D_xyz"]))
        point_sets = self.candidate_sets() if self.config.rlg_points == "candidates" else tracks
        return Schedule(RelativeLocalityGraph.from_point_sets(point_sets), config, self.view_pixels, view_keys=keys)

    def candidate_sets(self) -> List[np.ndarray]:
        """Per train view, its candidate set on the initial model (a Gaussian per SfM point, splatfacto's scales):
        rows of the dataparser's `points3D_xyz`, in the frame of the train cameras."""
        from odin_nerfstudio.culling.initial import initial_candidate_sets
        from odin_nerfstudio.ns.splat_runtime import odin_camera

        cameras = self.train_dataset.cameras
        views = [odin_camera(cameras, view) for view in range(len(self.train_dataset))]
        points = np.asarray(self.train_dataparser_outputs.metadata["points3D_xyz"])
        return initial_candidate_sets(points, views, self.config.candidate_margin, self.config.near_plane)

    def _check_rank_has_tasks(self) -> None:
        """Fail when this rank's workers get no task in epoch 0 (more workers than views)."""
        if not self._rank_tasks(0):
            config, views = self.schedule.config, self.schedule.num_views
            raise ValueError(
                f"rank {self.rank} has no task: the schedule spreads {views} train views over W = "
                f"{config.num_workers} workers (S = W x B = {config.step_size} views per step), so an epoch is one "
                f"short step in which only min(V, W) = {min(views, config.num_workers)} workers get a view; "
                "train with at most as many workers as views."
            )

    def _locate(self, iteration: int) -> Tuple[int, int]:
        """Epoch of this rank's task number ``iteration`` and its position among that epoch's tasks."""
        length = self._constant_epoch_length()
        if length is not None:
            return divmod(iteration, length)
        while self._epoch_starts[-1] <= iteration:
            epoch = len(self._epoch_starts) - 1
            self._epoch_starts.append(self._epoch_starts[-1] + len(self._rank_tasks(epoch)))
        epoch = bisect.bisect_right(self._epoch_starts, iteration) - 1
        return epoch, iteration - self._epoch_starts[epoch]

    def _constant_epoch_length(self) -> Optional[int]:
        """Tasks per epoch for this rank when every epoch has the same number, else None."""
        config, views = self.schedule.config, self.schedule.num_views
        if len(self.workers) == config.num_workers:
            return views
        if views % config.step_size == 0:
            return self.schedule.steps_per_epoch * config.views_per_worker * len(self.workers)
        return None

    def _rank_tasks(self, epoch: int) -> Tuple[Tuple[int, int], ...]:
        """(global step, view) of this rank's tasks in epoch ``epoch``, in order; the last epoch asked is cached."""
        if epoch not in self._epoch_tasks:
            steps = self.schedule.epoch(epoch).steps
            tasks = tuple((step.index, view) for step in steps for w in self.workers for view in step.tasks[w])
            self._epoch_tasks = {epoch: tasks}
        return self._epoch_tasks[epoch]

    def _train_view(self, view: int) -> Tuple[Cameras, Dict]:
        """Camera [1] on the device with `cam_idx` metadata and a copy of the cached data of train view ``view``."""
        data = self.cached_train[view].copy()
        data["image"] = data["image"].to(self.device)
        camera = self.train_cameras[view : view + 1].to(self.device)
        if camera.metadata is None:
            camera.metadata = {}
        camera.metadata["cam_idx"] = view
        return camera, data


def resumed_run_dir(trainer_config) -> Optional[Path]:
    """Run folder of the checkpoint a trainer config resumes from (``--load-dir`` or ``--load-checkpoint``), or None."""
    if trainer_config.load_dir is not None:
        return Path(trainer_config.load_dir).parent
    if trainer_config.load_checkpoint is not None:
        return Path(trainer_config.load_checkpoint).parent.parent
    return None


def _world_size(world_size: int) -> int:
    """torch.distributed's world size when a process group is up (a pipeline that never wraps its model in DDP
    hands datamanagers 1), else ``world_size``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return world_size


def _global_rank(local_rank: int) -> int:
    """torch.distributed's rank when a process group is up, else ``local_rank`` (nerfstudio's per-machine rank)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return local_rank
