"""OdinTrainer: ns-train's odin-splat trains through the runtime, one schedule step per iteration.

Quality-first equals the barrier in the trainer too (with a densification, the adaptive batch rule raising the rates),
learning-rate schedules follow the
publications, a resumed run continues bit for bit, the timeline and counters are written, and models the runtime
cannot train are refused before any work.
"""

from __future__ import annotations

import dataclasses

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig

from odin_nerfstudio.ns.trainer import OdinTrainer
from odin_nerfstudio.scenes.synth import SynthConfig, make_scene


@pytest.fixture(scope="module")
def street(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic street scene (24 views)."""
    return make_scene(SynthConfig(preset="street", output=tmp_path_factory.mktemp("street")))


def trainer_config(scene: Path, output: Path, iterations: int, workers: int = 2, mode: str = "quality", **model):
    """odin-splat on CPU, no viewer or evaluation, W virtual workers, a densification at step 40 when asked."""
    from odin_nerfstudio.method_configs.odin_splat import odin_splat

    config = copy.deepcopy(odin_splat.config)
    config.pipeline.datamanager.data = scene
    config.pipeline.datamanager.num_workers = workers
    config.pipeline.model.num_downscales = 0
    for name, value in model.items():
        setattr(config.pipeline.model, name, value)
    config.runtime.mode = mode
    config.machine.device_type = "cpu"
    config.vis = "tensorboard"
    config.output_dir = output
    config.max_num_iterations = iterations
    config.steps_per_eval_all_images = 0
    config.steps_per_eval_image = 0
    config.steps_per_save = 10
    config.logging.steps_per_log = 5
    config.optimizers["means"]["scheduler"] = ExponentialDecaySchedulerConfig(lr_final=1.6e-6, max_steps=40)
    config.set_timestamp()
    return config


def train(config) -> OdinTrainer:
    """Set up and run a trainer from ``config``; returns it."""
    torch.manual_seed(0)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    trainer.train()
    return trainer


def snapshot(trainer: OdinTrainer) -> dict[str, torch.Tensor]:
    """Every Gaussian parameter and its selective Adam moments."""
    out = {}
    for name, param in trainer.pipeline.model.gauss_params.items():
        out[name] = param.detach().clone()
        state = trainer.optimizers.optimizers[name].state[param]
        out[f"{name}.exp_avg"], out[f"{name}.exp_avg_sq"] = state["exp_avg"].clone(), state["exp_avg_sq"].clone()
    return out


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


DENSIFY = {"warmup_length": 60, "refine_every": 20, "densify_grad_thresh": 2e-4}
"""Counts in views of one worker: with 2 workers (batch scaling on) a warmup of 30 steps and a refinement every 10,
so one densification, after step 40."""


@pytest.mark.parametrize("tasks_in_flight", [1, 2])
def test_quality_equals_barrier_in_the_trainer_across_a_densification(
    street: Path, tmp_path: Path, default_torch_threads: int, tasks_in_flight: int
) -> None:
    """The trainer's path (two virtual workers, a densification, and with two tasks in flight two lanes rendering a
    step's two tasks at once, ``runtime/lanes.py``) ends at the barrier's model. In one process every step is
    published before the next reads (asserted), so reads ahead are not what this shows: ``tests/runtime`` and the
    gloo tests show those."""
    config = trainer_config(street, tmp_path / "q", 42, **DENSIFY)
    config.runtime.tasks_in_flight = tasks_in_flight
    quality = train(config)
    barrier = train(trainer_config(street, tmp_path / "b", 42, mode="barrier", **DENSIFY))
    assert torch.get_num_threads() == default_torch_threads > 1
    assert quality.runtime.topology.num_workers == 2 and quality.runtime.published_through == 41
    assert quality.runtime.counters.overlapped_reads == 0
    seeded = quality.pipeline.datamanager.train_dataparser_outputs.metadata["points3D_xyz"].shape[0]
    assert quality.pipeline.model.num_points != seeded, "the densification at step 40 changed the Gaussians"
    assert_identical(snapshot(quality), snapshot(barrier))
    gains = {name: optimizer.param_groups[0]["lr_gain"] for name, optimizer in quality.optimizers.optimizers.items()}
    assert gains == {name: opt.param_groups[0]["lr_gain"] for name, opt in barrier.optimizers.optimizers.items()}
    assert any(gain > 1.0 for gain in gains.values()), f"the adaptive rule (the default) never raised a rate: {gains}"

    run = quality.base_dir
    trace = json.loads((run / "odin_timeline.json").read_text())
    assert {event["name"] for event in trace["traceEvents"]} >= {"render", "backward", "publish"}
    assert quality.runtime.counters.most_in_flight == tasks_in_flight
    if tasks_in_flight > 1:
        renders = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"] if e["name"] == "render")
        assert any(b[0] < a[1] for a, b in zip(renders, renders[1:])), "no two renders ran at the same time"
    counters = json.loads((run / "odin_counters.json").read_text())
    schedule = quality.pipeline.datamanager.schedule
    scheduled = sum(len(views) for step in range(42) for views in schedule.at(step).tasks)
    assert counters["publications"] == 42 and counters["tasks"] == scheduled + counters["reruns"]
    events = list(run.glob("events.out.tfevents.*"))
    assert events and b"odin/bookkeeping_ms_per_task" in events[0].read_bytes()


def test_learning_rate_schedule_steps_once_per_published_step(street: Path, tmp_path: Path) -> None:
    """2 workers: Grendel's rule scales the rates by sqrt(2) and counts the decay's 40 views as 20 steps."""
    trainer = train(trainer_config(street, tmp_path, 12))
    lr, lr_final = 1.6e-4 * math.sqrt(2), 1.6e-6 * math.sqrt(2)
    reference = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = ExponentialDecaySchedulerConfig(lr_final=lr_final, max_steps=20).setup().get_scheduler(reference, lr)
    for _ in range(12):
        reference.step()
        scheduler.step()
    assert trainer.optimizers.optimizers["means"].param_groups[0]["lr"] == reference.param_groups[0]["lr"]


def test_a_resumed_run_continues_bit_for_bit(street: Path, tmp_path: Path, default_torch_threads: int) -> None:
    straight = train(trainer_config(street, tmp_path / "straight", 20))
    first = train(trainer_config(street, tmp_path / "first", 10))
    resumed_config = trainer_config(street, tmp_path / "resumed", 10)
    resumed_config.load_dir = first.checkpoint_dir
    resumed = train(resumed_config)
    assert torch.get_num_threads() == default_torch_threads > 1
    assert resumed.runtime.published_through == 19
    assert_identical(snapshot(resumed), snapshot(straight))


def test_a_model_with_a_camera_optimizer_is_refused_before_training(street: Path, tmp_path: Path) -> None:
    config = trainer_config(street, tmp_path, 5)
    config.pipeline.model.camera_optimizer.mode = "SO3xR3"
    trainer = config.setup(local_rank=0, world_size=1)
    with pytest.raises(ValueError, match="camera-optimizer.mode off"):
        trainer.setup()


def test_without_cuda_the_trainer_stops_in_one_line_naming_the_cpu_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nerfstudio's default device is CUDA: without one, odin-splat stops before any set-up (no scene is read)."""
    config = trainer_config(tmp_path / "no-scene-needed", tmp_path, 5)
    config.machine.device_type = "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        config.setup(local_rank=0, world_size=1)
    message = str(stop.value.code)
    assert "no CUDA device found" in message and "--machine.device-type cpu" in message and "\n" not in message


def test_an_emulated_interconnect_delays_every_exchange_and_changes_no_bit(street: Path, tmp_path: Path) -> None:
    """`--interconnect pcie`: every exchange is in flight at least the link's latency (its comm span, from the
    exchange's start to its publication), the model ends bit-identical to the run without it, and the rank's
    timeline figures reach the writers as odin/* scalars."""
    from odin_nerfstudio.comm.link import PRESETS, LinkedTransport

    linked_config = trainer_config(street, tmp_path / "linked", 8)
    linked_config.interconnect = "pcie"
    linked = train(linked_config)
    plain = train(trainer_config(street, tmp_path / "plain", 8))
    assert [type(t) for t in linked.runtime.exchange.transports] == [LinkedTransport, LinkedTransport]
    comm = [e.end_ns - e.start_ns for e in linked.runtime.timeline.events if e.name == "comm"]
    assert len(comm) == 2 * 8 and min(comm) >= PRESETS["pcie"].latency_s * 1e9
    assert_identical(snapshot(linked), snapshot(plain))
    logged = b"".join(path.read_bytes() for path in linked.base_dir.glob("events.out.tfevents.*"))
    for name in (b"odin/views_per_s", b"odin/wait_free_bound_share", b"odin/idle_share", b"odin/conflict_rate"):
        assert name in logged, name


def set_up(config) -> OdinTrainer:
    """A trainer set up from ``config`` (pipeline, optimizers, runtime), not trained."""
    torch.manual_seed(0)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    return trainer


@pytest.mark.parametrize("batch_scaling", ["adaptive", "sqrt", "off"])
def test_four_workers_get_grendels_rates_and_refine_in_views_unless_turned_off(
    street: Path, tmp_path: Path, batch_scaling: str
) -> None:
    trainer = set_up(trainer_config(street, tmp_path, 8, workers=4, batch_scaling=batch_scaling, **DENSIFY))
    size = 1 if batch_scaling == "off" else 4
    assert (trainer.runtime.publisher.gain is not None) == (batch_scaling == "adaptive"), "the measured gain's rule"
    for name, group in trainer.config.optimizers.items():
        (param_group,) = trainer.optimizers.optimizers[name].param_groups
        assert param_group["lr"] == pytest.approx(group["optimizer"].lr * math.sqrt(size)), name
        assert param_group["betas"] == pytest.approx((0.9**size, 0.999**size)), name
        assert param_group["eps"] == pytest.approx(1e-15 * math.sqrt(size)), name
    strategy = trainer.pipeline.model.strategy
    assert (strategy.refine_start_iter, strategy.refine_every, strategy.views_per_step) == (60, 20, size), "in views"
    assert trainer.config.optimizers["means"]["optimizer"].lr == 1.6e-4, "the config keeps the one-view rate"


def test_densification_statistics_count_views_not_steps(street: Path, tmp_path: Path) -> None:
    """gsplat's grad2d / count must stay a mean over views when a step holds 4: each task adds 1 per visible row."""
    trainer = train(trainer_config(street, tmp_path, 3, workers=4))
    state = trainer.runtime.strategy_state
    schedule = trainer.pipeline.datamanager.schedule
    views = sum(len(tasks) for step in range(3) for tasks in schedule.at(step).tasks)
    assert views == 12
    assert 3 < float(state["count"].max()) <= views, "a row seen by several views of one step counts each view"


def test_running_ahead_is_offered_except_before_what_needs_the_synchronous_state(street: Path, tmp_path: Path) -> None:
    """The trainer offers the next step's tasks to a waiting worker (``--run-ahead``) at every step but one followed
    by a structural change, an evaluation or a checkpoint, and the last; never with ``--run-ahead False``."""
    from odin_nerfstudio.adapter.gsplat import structural_change_due

    config = trainer_config(street, tmp_path, 42, **DENSIFY)
    config.steps_per_save, config.steps_per_eval_batch = 15, 0
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    strategy = trainer.pipeline.model.strategy
    structural = [step for step in range(42) if structural_change_due(strategy, step)]
    assert structural, "the densification config refines within the run"
    offered = [step for step in range(42) if trainer.loop.offers_ahead(step, trainer._may_run_ahead(step))]
    settling = {0, 15, 30, 41, *structural}
    assert offered == [step for step in range(42) if step not in settling]
    trainer.loop.config = dataclasses.replace(trainer.loop.config, run_ahead=False)
    assert not any(trainer.loop.offers_ahead(step, trainer._may_run_ahead(step)) for step in range(42))


def test_the_candidate_rlg_is_culled_with_the_runtimes_margin(street: Path, tmp_path: Path) -> None:
    # --pipeline.datamanager.rlg-points candidates: the RLG's sets are the C(t) the runtime will cull, so the trainer
    # hands the datamanager --runtime.candidate-margin (a wider margin, larger sets, another graph)
    from odin_nerfstudio.culling.initial import initial_candidate_sets
    from odin_nerfstudio.ns.splat_runtime import odin_camera
    from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph

    config = trainer_config(street, tmp_path, 5)
    config.pipeline.datamanager.rlg_points = "candidates"
    config.runtime.candidate_margin = 0.5
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    datamanager = trainer.pipeline.datamanager
    cameras = datamanager.train_dataset.cameras
    views = [odin_camera(cameras, view) for view in range(len(cameras))]
    points = np.asarray(datamanager.train_dataparser_outputs.metadata["points3D_xyz"])
    near = config.runtime.near_plane
    graphs = {
        margin: RelativeLocalityGraph.from_point_sets(initial_candidate_sets(points, views, margin, near))
        for margin in (0.5, 0.1)
    }
    assert (datamanager.schedule.rlg.weights != graphs[0.5].weights).nnz == 0
    assert (graphs[0.5].weights != graphs[0.1].weights).nnz > 0


def test_a_finished_run_closes_its_event_writers_and_a_second_run_logs_only_to_its_own(
    street: Path, tmp_path: Path
) -> None:
    """nerfstudio keeps every trainer's writers in one process-wide list; the trainer closes and drops its own."""
    from nerfstudio.utils import writer

    before = list(writer.EVENT_WRITERS)
    first = train(trainer_config(street, tmp_path / "first", 6))
    assert writer.EVENT_WRITERS == before, "the first run left its writers in nerfstudio's list"
    (events,) = first.base_dir.glob("events.out.tfevents.*")
    written = events.read_bytes()
    assert b"odin/bookkeeping_ms_per_task" in written, "the run's scalars were not on disk when training returned"
    second = train(trainer_config(street, tmp_path / "second", 6))
    assert writer.EVENT_WRITERS == before
    assert events.read_bytes() == written, "the second run wrote into the first run's event file"
    assert b"odin/bookkeeping_ms_per_task" in next(second.base_dir.glob("events.out.tfevents.*")).read_bytes()
