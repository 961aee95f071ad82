"""OdinDatamanager on kermit_320: follows the schedule, is pure in the step, splits steps across ranks, saves it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig
from nerfstudio.engine.callbacks import TrainingCallbackAttributes

from odin_nerfstudio.adapter.gsplat import GsplatAdapter
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.ns.datamanager import SCHEDULE_FILENAME, OdinDatamanager, OdinDatamanagerConfig
from odin_nerfstudio.ns.dataparser import OdinColmapDataParserConfig
from odin_nerfstudio.ns.splat_runtime import odin_camera
from odin_nerfstudio.runtime.config import OdinRuntimeConfig
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.schedule import Schedule, ScheduleConfig
from odin_nerfstudio.simulation.simulator import SimulationConfig
from odin_nerfstudio.simulation.workload import Workload, initial_model
from tests.conftest import real_scene


def make_datamanager(
    world_size: int = 1, local_rank: int = 0, scene: str | Path = "kermit_320", scale: float = 0.25, **options
):
    """An OdinDatamanager on a real scene (kermit_320: 9 train views; or a scene folder) at ``scale`` on CPU."""
    config = OdinDatamanagerConfig(
        dataparser=OdinColmapDataParserConfig(data=real_scene(scene) if isinstance(scene, str) else scene),
        camera_res_scale_factor=scale,
        cache_images_type="uint8",
        **options,
    )
    return config.setup(device="cpu", world_size=world_size, local_rank=local_rank)


@pytest.fixture(scope="module")
def single() -> OdinDatamanager:
    """One process, W = 1."""
    return make_datamanager()


def served(datamanager: OdinDatamanager, iterations: range) -> list[tuple[int, int]]:
    """(schedule step, view) of next_train's camera for each iteration."""
    cameras = [datamanager.next_train(i)[0] for i in iterations]
    return [(camera.metadata["odin_step"], camera.metadata["cam_idx"]) for camera in cameras]


def start_run(datamanager: OdinDatamanager, run_dir: Path, load_dir: Path | None = None, load_checkpoint=None):
    """What nerfstudio's Trainer.setup does for the datamanager: ask it for callbacks, with a trainer stub."""
    config = SimpleNamespace(load_dir=load_dir, load_checkpoint=load_checkpoint)
    trainer = SimpleNamespace(base_dir=run_dir, config=config)
    attributes = TrainingCallbackAttributes(optimizers=None, grad_scaler=None, pipeline=None, trainer=trainer)
    return datamanager.get_training_callbacks(attributes)


def test_first_epoch_visits_every_train_view_once_in_schedule_order(single: OdinDatamanager) -> None:
    schedule, views = single.schedule, len(single.train_dataset)
    assert schedule.num_views == views == 9 and schedule.config == ScheduleConfig(num_workers=1)
    expected = [(step.index, step.tasks[0][0]) for step in schedule.epoch(0).steps]
    assert served(single, range(views)) == expected
    assert sorted(view for _, view in expected) == list(range(views))
    next_epoch = schedule.at(schedule.steps_per_epoch)
    assert served(single, range(views, views + 1)) == [(next_epoch.index, next_epoch.tasks[0][0])]


def test_next_train_returns_the_cached_image_and_camera_of_the_view(single: OdinDatamanager) -> None:
    camera, data = single.next_train(5)
    view = camera.metadata["cam_idx"]
    assert torch.equal(data["image"], single.cached_train[view]["image"])
    assert data["image"].shape == (int(camera.height), int(camera.width), 3) == (59, 79, 3)
    assert torch.equal(camera.camera_to_worlds, single.train_cameras[view : view + 1].camera_to_worlds)


def test_next_train_is_a_pure_function_of_the_step(single: OdinDatamanager) -> None:
    steps = [60, 3, 60, 17, 0, 3]
    first = served(single, steps)
    assert first[0] == first[2] and first[1] == first[5]
    resumed = make_datamanager()
    assert served(resumed, [60, 60, 17, 3, 0]) == [first[0], first[2], first[3], first[1], first[4]]


def test_two_ranks_partition_every_step_and_continue_across_epochs() -> None:
    ranks = [make_datamanager(world_size=2, local_rank=r) for r in (0, 1)]
    schedule = ranks[0].schedule
    assert schedule.config.num_workers == 2 and schedule.config.step_size == 2
    assert schedule.to_json() == ranks[1].schedule.to_json()
    epochs = 3
    steps = [step for e in range(epochs) for step in schedule.epoch(e).steps]
    for rank, datamanager in enumerate(ranks):
        sequence = [(step.index, view) for step in steps for view in step.tasks[rank]]
        assert [datamanager.task_at(i) for i in range(len(sequence))] == sequence
        assert served(datamanager, range(len(sequence) - 2, len(sequence))) == sequence[-2:]
    by_step = {step.index: [] for step in steps}
    for rank, datamanager in enumerate(ranks):
        # a rank's tasks per epoch may differ by epoch: the idle worker of a short last step rotates
        for i in range(sum(len(step.tasks[rank]) for step in steps)):
            index, view = datamanager.task_at(i)
            by_step[index].append(view)
    for step in steps:
        assert sorted(by_step[step.index]) == sorted(step.views)


def test_a_rank_running_several_workers_interleaves_them_step_by_step() -> None:
    datamanager = make_datamanager(num_workers=2)
    steps = datamanager.schedule.epoch(0).steps
    expected = [(step.index, view) for step in steps for view in step.tasks[0] + step.tasks[1]]
    assert [datamanager.task_at(i) for i in range(9)] == expected
    assert sorted(view for _, view in expected) == list(range(9))


def test_schedule_json_is_written_to_the_run_folder_and_checked_on_resume(
    single: OdinDatamanager, tmp_path: Path
) -> None:
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    assert start_run(single, first) == []
    saved = first / SCHEDULE_FILENAME
    assert Schedule.load(saved, single.schedule.rlg, single.view_pixels).to_json() == single.schedule.to_json()
    start_run(single, resumed, load_dir=first / "nerfstudio_models")
    assert (resumed / SCHEDULE_FILENAME).read_text() == saved.read_text()

    Schedule(single.schedule.rlg, ScheduleConfig(seed=1), single.view_pixels).save(saved)
    with pytest.raises(ValueError, match=r"other options \(seed: saved 1, now 0\)"):
        start_run(single, resumed, load_dir=first / "nerfstudio_models")


@pytest.mark.parametrize(("change", "reason"), [("views", "different RLG"), ("image sizes", "other view costs")])
def test_a_saved_schedule_of_another_scene_is_refused(
    single: OdinDatamanager, tmp_path: Path, change: str, reason: str
) -> None:
    tracks, pixels = single.train_dataparser_outputs.metadata["sfm_in_view"], single.view_pixels
    if change == "views":
        other = Schedule(RelativeLocalityGraph.from_point_sets(tracks[:-1]), single.schedule.config, pixels[:-1])
    else:
        other = Schedule(single.schedule.rlg, single.schedule.config, pixels * 4)
    other.save(tmp_path / SCHEDULE_FILENAME)
    checkpoint = tmp_path / "nerfstudio_models" / "step-000000099.ckpt"
    with pytest.raises(ValueError, match=f"cannot resume .*{reason}.* the scene .* differs from the saved run"):
        start_run(single, tmp_path / "resumed", load_checkpoint=checkpoint)


def test_resuming_a_run_without_a_saved_schedule_warns_and_saves_one(single: OdinDatamanager, tmp_path: Path) -> None:
    start_run(single, tmp_path / "resumed", load_dir=tmp_path / "old" / "nerfstudio_models")
    assert (tmp_path / "resumed" / SCHEDULE_FILENAME).exists()


def test_the_trainer_saves_the_schedule_and_a_resumed_trainer_continues_it(tmp_path: Path) -> None:
    from tests.ns.test_training import fern_trainer_config

    config = fern_trainer_config(tmp_path, iterations=1, scene="kermit_320")
    config.timestamp = "first"
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    trainer.save_checkpoint(step=4)
    assert (trainer.base_dir / SCHEDULE_FILENAME).exists()

    config = fern_trainer_config(tmp_path, iterations=1, scene="kermit_320")
    config.timestamp, config.load_dir = "resumed", trainer.checkpoint_dir
    resumed = config.setup(local_rank=0, world_size=1)
    resumed.setup()
    assert resumed._start_step == 5
    assert (resumed.base_dir / SCHEDULE_FILENAME).read_text() == (trainer.base_dir / SCHEDULE_FILENAME).read_text()
    original, continued = trainer.pipeline.datamanager, resumed.pipeline.datamanager
    assert continued.task_at(resumed._start_step) == original.task_at(5)


def test_bad_setups_fail_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="num_workers = 3 is not a multiple of the world size 2"):
        make_datamanager(world_size=2, num_workers=3)
    with pytest.raises(ValueError, match="rank 9 has no task.*9 train views over W = 10 workers"):
        make_datamanager(world_size=10, local_rank=9)
    plain = ColmapDataParserConfig(
        data=real_scene("kermit_320"), colmap_path=Path("sparse/0"), downscale_factor=1, load_3D_points=False
    )
    with pytest.raises(ValueError, match="needs per-view SfM point sets.*sfm_in_view.*odin-colmap"):
        OdinDatamanagerConfig(dataparser=plain, camera_res_scale_factor=0.25).setup(device="cpu")


def test_view_costs_use_the_rescaled_train_cameras() -> None:
    # fern: kermit_320's SIMPLE_RADIAL cameras are cropped to 79x59 when nerfstudio undistorts their images, after
    # view_pixels was taken at 80x60, so there the costs miss the crop
    single = make_datamanager(scene="fern")
    cameras = single.train_dataset.cameras
    np.testing.assert_array_equal(single.view_pixels, (cameras.width * cameras.height).view(-1).numpy())
    assert set(single.view_pixels.tolist()) == {126 * 94}


def test_rlg_points_candidates_builds_the_rlg_from_the_runtimes_candidate_sets_on_the_seed_points(
    tmp_path: Path,
) -> None:
    # a street: views down it reach Gaussians whose bounding spheres enter the view from outside its SfM points
    scene = make_scene(SynthConfig(preset="street", num_views=16, street_length=60.0, output=tmp_path / "street"))
    candidates = make_datamanager(scene=scene, scale=1.0, rlg_points="candidates")
    in_view = make_datamanager(scene=scene, scale=1.0)
    # what the runtime culls for each train view's first task: its CullingIndex over splatfacto's initial model
    config = OdinRuntimeConfig()
    params = initial_model(np.asarray(candidates.train_dataparser_outputs.metadata["points3D_xyz"]))
    index = CullingIndex(params, GsplatAdapter(), config.candidate_margin, config.near_plane)
    cameras = candidates.train_dataset.cameras
    culled = [index.candidates(Task(0, 0, 0, view, odin_camera(cameras, view))).numpy() for view in range(len(cameras))]
    expected = RelativeLocalityGraph.from_point_sets(culled).weights
    assert (candidates.schedule.rlg.weights != expected).nnz == 0
    assert (in_view.schedule.rlg.weights != expected).nnz > 0  # the option changed the graph
    assert candidates.schedule.config == in_view.schedule.config


def test_a_sharded_simulation_trains_each_worker_on_the_region_a_sharded_run_gives_it(tmp_path: Path) -> None:
    # odin-simulate --sharded schedules as odin-train --sharded does: the regional order, worker w the views of
    # region w. Its keys are in the COLMAP frame and the datamanager's in the dataparser's (oriented, scaled), so
    # the regions are compared as sets of views per worker over an epoch, not step by step.
    def regions(schedule: Schedule) -> list[set[int]]:
        """Each worker's views over the first epoch."""
        steps = [schedule.at(step).tasks for step in range(schedule.steps_per_epoch)]
        return [{view for step in steps for view in step[worker]} for worker in range(schedule.config.num_workers)]

    street = make_scene(SynthConfig(preset="street", num_views=24, street_length=90.0, output=tmp_path / "street"))
    for scene, workers in ((real_scene("kermit_320"), 2), (street, 4)):
        sharded = make_datamanager(workers, scene=scene, scale=1.0, sharded=True).schedule
        workload = Workload.from_colmap(scene, eval_interval=8)
        simulated = workload.schedule(SimulationConfig(num_workers=workers, sharded=True).schedule_config())
        replicated = workload.schedule(SimulationConfig(num_workers=workers).schedule_config())
        assert sharded.config.order == simulated.config.order == "regions" and replicated.config.order == "rlg"
        assert regions(simulated) == regions(sharded), scene
        assert regions(replicated) != regions(sharded), scene  # the locality order mixes the regions
