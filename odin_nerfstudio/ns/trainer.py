"""`OdinTrainer`: nerfstudio's trainer with each iteration one step of Odin's schedule, trained by the runtime.

Why a trainer: nerfstudio's loop renders a batch, back-propagates into the whole model and steps dense optimizers;
Odin's runtime renders each task from its gathered rows, stages sparse gradients, publishes them with selective Adam
in step order, and lets a worker read step s + 1 while step s is still in flight. `OdinTrainer` keeps the rest of
nerfstudio's trainer (viewer, writers, evaluation, checkpoints, resume) and replaces the iteration:

- iteration s runs the schedule's step s: the tasks of every worker when the W workers are virtual (one process),
  or of the rank's own worker when each process is one (torchrun, `odin_nerfstudio.ns.launch`);
- the Gaussian parameters are optimized by selective Adam (`SelectiveAdamOptimizerConfig`), whose learning-rate
  schedulers step once per publication, so step s is published with step s's rate whenever it publishes;
- densification, pruning and opacity resets (gsplat's DefaultStrategy as splatfacto configures it) run before step
  s + 1 reads, behind the runtime's barrier, from the statistics the runtime accumulated per task;
- with `--pipeline.datamanager.rebalance-every N`, the schedule is re-balanced by the ranks' measured costs before
  the first step of every Nth epoch reads, behind a settle too (`ns/rebalancing.py`);
- evaluation, checkpoints and the end of training first settle the runtime (every started step published), so they
  see the synchronous state of their step and a resumed run continues from exactly that state.

In a distributed run (`odin-train` under torchrun, or `ns-train --machine.num-devices N` on CUDA) each process is one
worker with its own replica: rank 0's initial Gaussians are broadcast, the pipeline never wraps the model in DDP
(`OdinPipeline`), only rank 0 evaluates and saves (the others wait for it at a barrier with its own timeout,
`rank0_work.py`, not against the wait timeout), and a checksum every `replica_check_every` steps and at the end
checks that the replicas are still bit-identical.

Logged every `steps_per_log`: the mean loss of the step's tasks, the Gaussian count, the runtime's counters
(waits, re-runs, stale reads, bookkeeping and communication per task) and the rank's timeline figures (`odin/*`:
views/s, share of the wait-free bound, idle and exposed wait shares, conflict and fallback rates, stale reads). At
the end the runtime's timeline is written as a Chrome trace (`odin_timeline.json`, or `odin_timeline_rank<r>.json`
per rank), which opens in Perfetto and `odin-timeline` draws, and its counters as `odin_counters.json`
(`odin_counters_rank<r>.json`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import Literal, Tuple, Type

import torch
from nerfstudio.engine.optimizers import OptimizerConfig, Optimizers
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils import comms
from nerfstudio.utils.misc import step_check
from nerfstudio.utils.rich_utils import CONSOLE

from odin_nerfstudio.adapter.gsplat import STATS_SCHEMA, structural_change_due
from odin_nerfstudio.comm.distributed import DistributedTransport
from odin_nerfstudio.comm.calibration import link_latency_bytes, measure_latency_bytes
from odin_nerfstudio.comm.exchange_choice import ExchangeChoice
from odin_nerfstudio.comm.inprocess import VirtualTransport
from odin_nerfstudio.comm.link import InterconnectName, link_preset, linked_distributed, linked_virtual
from odin_nerfstudio.comm.replicas import check_replicas
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.tasks import step_tasks
from odin_nerfstudio.core.timeline_metrics import TimelineMeter, live_scalars
from odin_nerfstudio.drivers.step_loop import settle
from odin_nerfstudio.drivers.training_loop import LoopConfig, TrainingLoop
from odin_nerfstudio.kernels.ops import scatter_in_order
from odin_nerfstudio.ns.checkpoints import load_trainer_checkpoint, restore_strategy_state, save_trainer_checkpoint
from odin_nerfstudio.ns.event_writers import close_writers_since, writers_mark
from odin_nerfstudio.ns.options import check_options, warn_if_step_exceeds_views
from odin_nerfstudio.ns.memory_cap import check_memory_cap
from odin_nerfstudio.ns.rank0_work import wait_for_rank0
from odin_nerfstudio.ns.rebalancing import REBALANCE_FILENAME, MeasuredBalance
from odin_nerfstudio.ns.sharded_training import ShardedTraining, find_sharded_checkpoint
from odin_nerfstudio.ns.splat_runtime import (
    GAUSSIAN_PARAMS,
    SplatTaskRenderer,
    build_runtime,
    odin_camera,
    structural_change,
)
from odin_nerfstudio.ns.startup import require_cuda_if_asked
from odin_nerfstudio.ns.threads import apply_cpu_threads
from odin_nerfstudio.runtime.config import OdinRuntimeConfig, Topology

TIMELINE_FILENAME = "odin_timeline.json"
COUNTERS_FILENAME = "odin_counters.json"


@dataclass
class SelectiveAdamOptimizerConfig(OptimizerConfig):
    """Selective Adam: Adam on the rows a publication touched; every other row keeps its value and moments."""

    _target: Type = field(default_factory=lambda: SelectiveAdam)
    eps: float = 1e-15
    """Added to the denominator (splatfacto's 1e-15)."""
    betas: Tuple[float, float] = (0.9, 0.999)
    """Adam's (beta1, beta2), torch's defaults (what splatfacto uses)."""


@dataclass
class OdinTrainerConfig(TrainerConfig):
    """nerfstudio's trainer settings, plus Odin's runtime."""

    _target: Type = field(default_factory=lambda: OdinTrainer)
    runtime: OdinRuntimeConfig = field(default_factory=OdinRuntimeConfig)
    """Mode (quality, throughput, barrier, ddp, hogwild), ring slots K, stale-read bounds, culling margin, wait
    timeout. Workers and views per step come from the datamanager's schedule (`--pipeline.datamanager.num-workers`,
    `views-per-step`); the seed from `--machine.seed`."""
    check_escapes: bool = True
    """Validate every task against the Gaussians the rasterizer would draw outside its candidate set."""
    export_timeline: bool = True
    """Write the runtime's timeline as a Chrome trace in the run folder at the end of training."""
    replica_check_every: int = 500
    """Steps between checks that every rank's replica is bit-identical (distributed runs; 0: at the end only)."""
    expect_remote_writes: bool = True
    """Distributed: treat the rows the other ranks' tasks would write (known from the schedule; a view's active rows
    from its last render here, else its drawn rows projected here once, or its candidate set without
    --check-escapes) as pending writes of their step, so a read that would miss one waits instead of being re-run
    after validation."""
    rank0_work_timeout_s: float = 3600.0
    """Distributed: how long the other ranks wait at a barrier for rank 0's evaluation or checkpoint (which do not
    count against --runtime.wait-timeout-s)."""
    follow_overlap_window: bool = False
    """Read a step only beside the earlier steps its schedule's overlap window names (their predicted conflict is
    low), waiting for older steps first. Off (default): read as early as the runtime's exact RAW check allows; the
    check waits on the conflicting rows only, which a schedule-level window (conflict mass per view) cannot see."""
    run_ahead: bool = True
    """Let a worker whose tasks of a step all wait on a conflicting publication run its task of the next step first
    (validated like any read, so quality-first still equals the barrier); never across a structural change,
    evaluation, checkpoint or replica check (`drivers/step_loop.py`)."""
    read_behind_after: int = 4
    """After this many steps in a row whose first read met a conflict (a dense scene), a step reads only once the
    step before is published, without trying first, as the barrier does: waiting is exact, and it spares the
    attempts' culls and checks, the running ahead's and the ask for rows first; a read behind that would not have
    conflicted ends the streak (`drivers/step_loop.py`). 0: never."""
    interconnect: InterconnectName = "none"
    """An emulated link under every exchange, the same for every mode (`odin_nerfstudio.comm.link`; with --sharded,
    under each row exchange, `comm/row_link.py`): each message delayed by latency + bytes / bandwidth of a preset
    (10gbe, pcie), for benchmarks on a machine whose loopback makes communication free. none: the real transport
    only."""
    exchange: ExchangeChoice = "auto"
    """Distributed: how a step's gradient rows travel (`comm/exchange_choice.py`): auto (per step, the least
    predicted time: bytes, and each collective's latency at the link's latency x bandwidth, measured at start-up or
    the --interconnect preset's), sparse (all-gather of every rank's rows), union (agree on the union of the rows, all_reduce
    them) or dense (all_reduce of every row)."""
    sharded: bool = False
    """Mixed parallel: each process owns a shard of the Gaussians (their parameters, Adam moments and tables) and
    fetches the rows its views read from their owners, so a scene larger than one worker trains (odin-train under
    torchrun, one shard per process; modes barrier, quality and throughput; `ns/sharded_training.py`). Off: every
    process holds the whole model (data parallel)."""
    memory_cap_gib: float = 0.0
    """Per process, the most GiB the Gaussians it holds may take (their parameters, Adam moments, per-row tables;
    `ns/memory_cap.py`), checked before training and after every densification: a model over it stops with the
    command that trains it (--sharded, more processes). 0: no cap."""
    cpu_threads: int = 0
    """Intra-op torch threads of each process on the CPU; 0: the plugin's rule (`ns/threads.py`: the cores this
    process may run on, shared among the ranks of its node). ODIN_CPU_THREADS sets it too; OMP_NUM_THREADS, when
    set, is left as torch applies it."""

    def print_to_terminal(self) -> None:
        """nerfstudio's config print, once the device it asks for exists (a `--load-config` run too)."""
        require_cuda_if_asked(self.machine.device_type, self.method_name or "odin-splat")
        super().print_to_terminal()


class OdinTrainer(Trainer):
    """Trains odin-splat through Odin's runtime, one schedule step per iteration."""

    config: OdinTrainerConfig

    def __init__(self, config: OdinTrainerConfig, local_rank: int = 0, world_size: int = 1) -> None:
        """nerfstudio's trainer, once the device it is asked to train on exists."""
        require_cuda_if_asked(config.machine.device_type, config.method_name or "odin-splat")
        apply_cpu_threads(config.cpu_threads)
        super().__init__(config, local_rank, world_size)
        self.distributed_transports: list = []
        """The torch.distributed transports this trainer made (`_transports`): it guards and closes them."""
        self.shards: ShardedTraining | None = None
        """The sharded mode's part of this rank (``--sharded``), else None."""
        self._writers_mark = writers_mark()
        """The process's event writers before this trainer's setup adds its own (closed by `_after_train`)."""

    def setup(self, test_mode: Literal["test", "val", "inference"] = "val") -> None:
        """nerfstudio's setup (pipeline, optimizers, checkpoint, viewer, writers), then the runtime over the model."""
        check_options(self.config)
        # K is named once, by the user, as the runtime's ring slots; the schedule's overlap windows use the same K.
        self.config.pipeline.datamanager.ring_size = self.config.runtime.ring_slots
        self.config.pipeline.datamanager.sharded = self.config.sharded  # auto's schedule order follows the mode
        # rlg-points candidates culls the runtime's C(t): with the runtime's margin and near plane.
        self.config.pipeline.datamanager.candidate_margin = self.config.runtime.candidate_margin
        self.config.pipeline.datamanager.near_plane = self.config.runtime.near_plane
        super().setup(test_mode)
        schedule = self.pipeline.datamanager.schedule
        warn_if_step_exceeds_views(schedule.config.num_workers, schedule.config.views_per_worker, schedule.num_views)
        model = self.pipeline.model
        self._bind_optimizers(GAUSSIAN_PARAMS)
        if self.world_size > 1 and not self.config.sharded:
            for param in model.gauss_params.values():
                torch.distributed.broadcast(param.data, src=0)
        self.callbacks = [callback for callback in self.callbacks if callback.func != model.step_post_backward]
        for name, scheduler in self.optimizers.schedulers.items():
            self.optimizers.optimizers[name].register_step_post_hook(lambda *_, scheduler=scheduler: scheduler.step())
        datamanager = self.pipeline.datamanager
        self.local_workers = list(datamanager.workers)
        images = [datamanager.cached_train[i]["image"] for i in range(len(datamanager.cached_train))]
        self._renderer = SplatTaskRenderer(model, images)
        self._cameras: dict = {}
        self._meter = TimelineMeter(self.pipeline.datamanager.rank)
        record = self.base_dir / self._per_rank(REBALANCE_FILENAME)
        self.measured_balance = MeasuredBalance(datamanager, record, model.device)
        if self.config.sharded:
            self.shards = ShardedTraining(self, self._renderer)
            self._check_memory_cap("before training")
            return
        self._check_memory_cap("before training")
        self.runtime = build_runtime(
            model,
            images,
            self.config.runtime,
            self.optimizers.optimizers,
            self._transports(),
            self.config.check_escapes,
            start_step=self._start_step,
            topology=self._topology(),
            seed=self.config.machine.seed,
            renderer=self._renderer,
        )
        runtime = self.runtime
        restore_strategy_state(runtime.strategy_state, self._saved_strategy, runtime.num_primitives, model.device)
        config = self.config
        loop = LoopConfig(config.follow_overlap_window, config.run_ahead, config.expect_remote_writes,
                          config.read_behind_after)
        last_step = self._start_step + config.max_num_iterations - 1
        self.loop = TrainingLoop(runtime, self._step_tasks, self.local_workers, last_step, loop)
        if self.world_size == 1 and self.runtime.topology.num_workers > 1:
            CONSOLE.log(f"Odin: {self.runtime.topology.num_workers} virtual workers in this process")

    def setup_optimizers(self) -> Optimizers:
        """nerfstudio's optimizers, once the model is known to optimize the Gaussian parameters only, under the
        batch rule for the schedule's W x B views per step (`ns/batch_scaling.py`): the model counts its schedules in
        steps of W x B views, and the configured rates, betas, eps and decays are scaled as Grendel does, eps for a
        sum of gradients where Grendel's is for their mean (`--pipeline.model.batch-scaling off`: as configured); the
        adaptive rule's gain on the rates is the runtime's, at each publication. The config keeps the one-view values
        the user wrote."""
        param_groups = self.pipeline.get_param_groups()
        extra = sorted(set(param_groups) - set(GAUSSIAN_PARAMS))
        if extra:
            raise ValueError(
                f"odin-splat trains the Gaussian parameters only, but the model also optimizes {extra}; turn them off "
                "(--pipeline.model.camera-optimizer.mode off, --pipeline.model.use-bilateral-grid False)"
            )
        schedule = self.pipeline.datamanager.schedule.config
        rule = self.pipeline.model.scale_to_batch(schedule.num_workers, schedule.views_per_worker)
        return Optimizers(rule.optimizers(self.config.optimizers), param_groups)

    def _topology(self) -> Topology:
        """W and B of this process's runtime, from the schedule: its local workers and their views per step."""
        schedule = self.pipeline.datamanager.schedule.config
        if self.world_size > 1 and schedule.num_workers != self.world_size:
            raise ValueError(
                f"a distributed run needs one schedule worker per process: num_workers = {schedule.num_workers}, "
                f"world size {self.world_size}; leave --pipeline.datamanager.num-workers unset"
            )
        return Topology.of(schedule, local_workers=len(self.local_workers))

    def _transports(self) -> list | None:
        """One torch.distributed transport per process in a distributed run; None (in-process) otherwise; behind
        the `interconnect` link model when one is chosen (then in-process workers get their linked endpoints)."""
        link = link_preset(self.config.interconnect)
        params = {name: param for name, param in self.pipeline.model.gauss_params.items()}
        if self.world_size == 1:
            if link is None:
                return None
            return linked_virtual(VirtualTransport(len(self.local_workers), params, scatter_in_order), link)
        timeout = self.config.runtime.wait_timeout_s
        latency_bytes = 0.0
        if self.config.exchange == "auto":  # the choice weighs latencies at the link's latency x bandwidth
            latency_bytes = (
                measure_latency_bytes(self.pipeline.model.device)
                if link is None
                else link_latency_bytes(link.latency_s, link.bandwidth_bytes_per_s)
            )
        transport = DistributedTransport(
            params, timeout, stats_schema=STATS_SCHEMA, choice=self.config.exchange, merge=scatter_in_order,
            latency_bytes=latency_bytes,
        )  # fmt: skip
        self.distributed_transports.append(transport)
        return [transport if link is None else linked_distributed(transport, link)]

    def close_transports(self) -> None:
        """Stop the progress threads of the transports this trainer made (before the process group is
        destroyed: a daemon thread inside a collective at exit aborts the process)."""
        for transport in self.distributed_transports:
            transport.close()
        if self.shards is not None:
            self.shards.close()

    def _bind_optimizers(self, names: tuple[str, ...]) -> None:
        """Point each selective Adam at the model's current parameter, carrying its state.

        nerfstudio builds the optimizers, then loads a checkpoint into the model, and splatfacto's loader replaces
        every Gaussian parameter with a new tensor of the checkpoint's size: the optimizer would keep stepping the
        old ones. The loaded moments have the checkpoint's rows, so they belong to the new parameter.
        """
        params = self.pipeline.model.gauss_params
        for name in names:
            optimizer = self.optimizers.optimizers[name]
            (old,) = optimizer.param_groups[0]["params"]
            new = params[name]
            if old is new:
                continue
            state = optimizer.state.pop(old, None)
            optimizer.param_groups[0]["params"] = [new]
            if state and state["exp_avg"].shape != new.shape:
                raise ValueError(
                    f"the checkpoint's optimizer state of {name} has shape {tuple(state['exp_avg'].shape)}, its "
                    f"parameter {tuple(new.shape)}: the checkpoint is inconsistent"
                )
            optimizer.state[new] = state or {}
            optimizer._state_of(new)

    def _camera(self, view: int):
        """The runtime camera of ``view``, built once per view."""
        if view not in self._cameras:
            cameras = self.pipeline.datamanager.train_dataset.cameras
            self._cameras[view] = odin_camera(cameras, view, self.pipeline.model.device)
        return self._cameras[view]

    def train_iteration(self, step: int):
        """Schedule step ``step``: a structural change due after step - 1, then the local tasks through the runtime
        (``drivers/training_loop.py``).

        Returns nerfstudio's (loss, loss dict, metrics dict): the mean loss of the step's local tasks, the Gaussian
        count and the runtime's counters so far.
        """
        model = self.pipeline.model
        if self.shards is not None:
            if self.shards.iteration(step):
                self._check_memory_cap(f"after the densification of step {step - 1}")
        else:
            if step > 0 and structural_change_due(model.strategy, step - 1):
                settle(self.runtime)
                self.runtime.remap(structural_change(model, self.runtime, step - 1))
                self._check_memory_cap(f"after the densification of step {step - 1}")
            if self.measured_balance.due(step):
                self.measured_balance.rebalance(step, self.runtime, self.distributed_transports)
                self.loop.forget_from(step)
            self.loop.iteration(step, self._may_run_ahead(step))
            if self.world_size > 1 and step > 0 and step_check(step, self.config.replica_check_every):
                self._check_replicas(step)
        losses = self._renderer.pop_losses(step)
        loss = torch.stack(losses).mean() if losses else torch.zeros((), device=model.device)
        logged = step_check(step, self.config.logging.steps_per_log, run_at_zero=True)
        return loss, {"main_loss": loss}, self._odin_metrics(timeline=logged)

    def _check_memory_cap(self, when: str) -> None:
        """``--memory-cap-gib`` against the Gaussians this process holds now (``ns/memory_cap.py``)."""
        params = self.pipeline.model.gauss_params
        held = params["means"].shape[0]
        total = held if self.shards is None else self.shards.owner.cuts.num_rows
        check_memory_cap(self.config.memory_cap_gib, params, held, total, self.shards is not None, when)

    def _step_tasks(self, step: int) -> tuple[list[list], int]:
        """Every schedule worker's runtime tasks of ``step`` and the length of its overlap window."""
        plan = self.pipeline.datamanager.schedule.at(step)
        return step_tasks(step, plan.tasks, self._camera), len(plan.overlap_window)

    def _may_run_ahead(self, step: int) -> bool:
        """Whether nothing after step ``step`` needs its synchronous state (a structural change, an evaluation, a
        checkpoint, a replica check, a re-balance of the schedule), so its workers may run step + 1's tasks
        (``--run-ahead``; the training loop also checks the last step and the overlap windows)."""
        config = self.config
        settles = [config.steps_per_save, config.steps_per_eval_batch, config.steps_per_eval_image]
        settles.append(config.steps_per_eval_all_images)
        if self.world_size > 1:
            settles.append(config.replica_check_every)
        if any(interval > 0 and step % interval == 0 for interval in settles) or self.measured_balance.due(step + 1):
            return False
        return not structural_change_due(self.pipeline.model.strategy, step)

    def _odin_metrics(self, timeline: bool = True) -> dict[str, float]:
        """The Gaussian count, the runtime's counters and, with ``timeline``, this rank's timeline figures so far
        (views/s, share of the wait-free bound, idle and exposed wait shares, conflict and fallback rates, stale
        reads: `core.timeline_metrics`), for nerfstudio's writers, which log them every `steps_per_log`."""
        if self.shards is not None:
            return self.shards.metrics()
        counters = self.runtime.counters
        figures = {}
        if timeline:
            timeline = self.runtime.timeline
            self._meter.consume(timeline.events, timeline.recorded)
            figures = live_scalars(self._meter.metrics(counters))
        return {
            "gaussian_count": float(self.runtime.num_primitives),
            "odin/published_step": float(self.runtime.published_through),
            "odin/waits": float(sum(counters.waits.values())),
            "odin/reruns": float(counters.reruns),
            "odin/read_behind": float(counters.read_behind),
            "odin/stale_reads": float(len(counters.stale_reads)),
            "odin/bookkeeping_ms_per_task": counters.bookkeeping_ns / 1e6 / max(counters.tasks, 1),
            "odin/bookkeeping_cpu_ms_per_task": counters.bookkeeping_cpu_ns / 1e6 / max(counters.tasks, 1),
            "odin/comm_ms_per_task": counters.comm_ns / 1e6 / max(counters.tasks, 1),
            **figures,
        }

    def eval_iteration(self, step: int) -> None:
        """nerfstudio's evaluation, on the synchronous state of ``step`` when an evaluation is due."""
        config = self.config
        intervals = (config.steps_per_eval_batch, config.steps_per_eval_image, config.steps_per_eval_all_images)
        if any(step_check(step, interval) for interval in intervals):
            self._settle()
            with self.shards.whole_model() if self.shards is not None else contextlib.nullcontext():
                if self.pipeline.datamanager.rank == 0:
                    super().eval_iteration(step)
                    # Fault injection for tests: an evaluation as slow as a full-resolution one on a large scene.
                    time.sleep(float(os.environ.get("ODIN_FAULT_EVAL_DELAY_S", "0")))
            self._after_rank0_work("evaluation", step)

    def save_checkpoint(self, step: int) -> None:
        """Settle the runtime on every rank (its steps <= ``step`` published), then save atomically with the
        strategy state (rank 0; ``checkpoints.py``)."""
        self._settle()
        if self.shards is not None:
            self.shards.save(step)
        elif comms.is_main_process():
            save_trainer_checkpoint(self, step)
        self._after_rank0_work("checkpoint", step)

    def _after_rank0_work(self, what: str, step: int) -> None:
        """Distributed: every rank waits for rank 0's ``what`` of ``step`` at a barrier of its own timeout."""
        if self.world_size > 1:
            wait_for_rank0(what, step, self.config.rank0_work_timeout_s, self.distributed_transports)

    def _load_checkpoint(self) -> None:
        """nerfstudio's resume, from the newest intact checkpoint, keeping its strategy state for the runtime; with
        ``--sharded``, the rank's own shard (``sharded_training.find_sharded_checkpoint``)."""
        if self.config.sharded:
            rank, num_shards = self.pipeline.datamanager.rank, max(self.world_size, 1)
            self._sharded_resume = find_sharded_checkpoint(self.config, rank, num_shards)
            if self._sharded_resume is not None:
                self._start_step = self._sharded_resume["step"] + 1
                self.pipeline.model.update_to_step(self._sharded_resume["step"])
            return
        self._saved_strategy = load_trainer_checkpoint(self)

    def _after_train(self) -> None:
        """Settle, write the timeline, then nerfstudio's end of training (last checkpoint; the banner from rank 0).

        A run stopped from the viewer may have run tasks of the next step ahead: that step is finished first, so the
        last checkpoint holds a whole step's state and names it."""
        if self.shards is None:
            finished = self.loop.finish()
            self.step = self.step if finished is None else finished
            self.runtime.close()
            if self.world_size > 1:
                self._check_replicas(self.step)
        timeline = self.runtime.timeline if self.shards is None else self.shards.meter.timeline
        if self.config.export_timeline:
            path = timeline.export_chrome_trace(self.base_dir / self._per_rank(TIMELINE_FILENAME))
            CONSOLE.log(f"Odin timeline (Chrome trace, opens in Perfetto): {path}")
        counters = self.runtime.counters if self.shards is None else self.shards.loop.counters
        counters = json.dumps(dataclasses.asdict(counters), indent=1)
        (self.base_dir / self._per_rank(COUNTERS_FILENAME)).write_text(counters)
        metrics = self._odin_metrics()
        CONSOLE.log("Odin: " + ", ".join(f"{name} {value:g}" for name, value in metrics.items()))
        quiet = CONSOLE.quiet
        CONSOLE.quiet = quiet or not comms.is_main_process()  # rank 0's "Training Finished" banner speaks for the job
        try:
            super()._after_train()
        finally:
            CONSOLE.quiet = quiet
            close_writers_since(self._writers_mark)

    def _per_rank(self, filename: str) -> str:
        """``filename`` in a one-process run, ``<stem>_rank<r><suffix>`` with the global rank otherwise."""
        if self.world_size == 1:
            return filename
        stem, suffix = filename.rsplit(".", 1)
        return f"{stem}_rank{self.pipeline.datamanager.rank}.{suffix}"

    def _check_replicas(self, step: int) -> None:
        """Settle, then compare every rank's replica with rank 0's (a collective at the same step on every rank)."""
        self._settle()
        check_replicas(dict(self.pipeline.model.gauss_params), step, transports=self.distributed_transports)

    def _settle(self) -> None:
        """Publish every started step (the runtime exists once setup has run; a sharded step publishes within its
        iteration)."""
        if hasattr(self, "runtime"):
            settle(self.runtime)
