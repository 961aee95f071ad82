"""``--sharded``: odin-splat in the mixed-parallel mode, one shard of the Gaussians per process (torchrun).

``OdinTrainer`` hands its iteration, evaluation, checkpoints and metrics to :class:`ShardedTraining` when
``--sharded`` is on. What changes for a user:

- Set-up: every rank builds the initial model (rank 0's, broadcast), puts it in Z-order, cuts it by load (each row
  weighs 1 plus the epoch's views whose candidate set holds it over their mean; ``runtime/ownership.py``) and keeps
  only its range: from then on a rank holds about 1/W of the parameters, Adam moments and per-row tables.
- Each iteration is one schedule step of ``drivers/sharded_loop.py`` (rows fetched from their owners, gradients
  returned to them); a densification re-orders, re-cuts and moves rows (``runtime/resharding.py``).
- Evaluation renders the whole model on rank 0, gathered from the shards for it (rank 0 then holds every parameter
  row, not the moments); the viewer shows rank 0's shard while training, the whole model once loaded from a
  checkpoint.
- Checkpoints: each rank writes its shard (parameters, moments, versions, statistics, schedulers) atomically to
  ``<run>/odin_shards/step-<n>.rank-<r>-of-<W>.ckpt``; then rank 0 writes nerfstudio's ``step-<n>.ckpt`` with the
  whole model's parameters (what ns-eval, ns-export, ns-render and ns-viewer load) and the manifest
  ``<run>/odin_shards/step-<n>.json``, after which, with ``--save-only-latest-checkpoint`` (nerfstudio's default),
  the older steps' files go. Resume (``--load-dir``) reads only the rank's own shard, at the same W. Each shard file
  also holds the schedule's last re-balance by measured costs (``--pipeline.datamanager.rebalance-every``, which
  runs here as in the replicated mode, ``ns/rebalancing.py``), so a resumed run trains the same epochs.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from nerfstudio.utils.rich_utils import CONSOLE
from torch import Tensor

from odin_nerfstudio.adapter.gsplat import GsplatAdapter, structural_change_due
from odin_nerfstudio.comm.all_to_all import RowAllToAll, TableAllToAll
from odin_nerfstudio.comm.inprocess import VirtualRowExchange
from odin_nerfstudio.comm.link import link_preset
from odin_nerfstudio.comm.row_link import linked_rows
from odin_nerfstudio.core.row_order import restore_spatial_order
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.core.tasks import NO_STEP, Task, view_tasks
from odin_nerfstudio.drivers.sharded_loop import ShardedLoop
from odin_nerfstudio.ns.checkpoints import allow_nerfstudio_checkpoints, checkpoint_path, save_atomically
from odin_nerfstudio.ns.rank0_work import wait_for_rank0
from odin_nerfstudio.ns.rebalancing import REBALANCE_KEY, restore_rebalance, saved_rebalance
from odin_nerfstudio.ns.splat_runtime import GAUSSIAN_PARAMS
from odin_nerfstudio.runtime.culling_index import CullingIndex
from odin_nerfstudio.runtime.metering import Meter
from odin_nerfstudio.runtime.ownership import ShardCuts, cut_by_load, row_load, views_seeing
from odin_nerfstudio.runtime.shard_reader import Reader
from odin_nerfstudio.runtime.sharding import LearningRates, Owner

SHARDS_FOLDER = "odin_shards"
"""Beside ``nerfstudio_models``: the shard files and manifests (ns-eval lists the models folder's files as steps)."""


def shard_path(folder: Path, step: int, rank: int, num_shards: int) -> Path:
    """Where rank ``rank`` of ``num_shards`` writes its shard of ``step``."""
    return Path(folder) / f"step-{step:09d}.rank-{rank}-of-{num_shards}.ckpt"


def manifest_path(folder: Path, step: int) -> Path:
    """The manifest of ``step``'s sharded checkpoint."""
    return Path(folder) / f"step-{step:09d}.json"


class ShardedTraining:
    """One rank's part of a sharded run inside nerfstudio's trainer (see the module).

    Args:
        trainer: the ``OdinTrainer`` after nerfstudio's set-up (pipeline, optimizers, viewer, writers).
        renderer: the trainer's task renderer.
    """

    def __init__(self, trainer: Any, renderer: Any) -> None:
        config = trainer.config
        self.trainer, self.config = trainer, config
        model, datamanager = trainer.pipeline.model, trainer.pipeline.datamanager
        self.rank, self.num_shards = datamanager.rank, max(trainer.world_size, 1)
        schedule = datamanager.schedule.config
        if schedule.num_workers != self.num_shards:
            raise ValueError(
                f"--sharded runs one shard per process: the schedule has {schedule.num_workers} workers and the "
                f"world {self.num_shards} processes; launch odin-train under torchrun --nproc-per-node "
                f"{schedule.num_workers} (and leave --pipeline.datamanager.num-workers unset)"
            )
        self.adapter = GsplatAdapter(packed=False, absgrad=model.strategy.absgrad)
        resume = getattr(trainer, "_sharded_resume", None)
        model.strategy_state = model.strategy.initialize_state(scene_scale=1.0)
        if resume is None:
            cuts = self._initial_cuts(model.gauss_params)
            lo, hi = cuts.range(self.rank)
            self._install({name: model.gauss_params[name].detach()[lo:hi].clone() for name in GAUSSIAN_PARAMS})
        else:
            cuts = ShardCuts(torch.tensor(resume["manifest"]["bounds"]))
            self._install({name: resume["shard"]["params"][name].to(model.device) for name in GAUSSIAN_PARAMS})
        runtime = config.runtime
        self.owner = Owner(
            model.gauss_params, trainer.optimizers.optimizers, cuts, self.rank, self.adapter,
            runtime.candidate_margin, runtime.near_plane, trainer._start_step, model.strategy_state,
            drawable=renderer.drawable,
        )  # fmt: skip
        if resume is not None:
            self._restore(resume["shard"])
        gain = model.batch.gain()
        meter = Meter(model.device)
        self.reader = Reader(cuts, dict(model.gauss_params), renderer, self.adapter, meter, config.machine.seed,
                             runtime.ring_slots, keeps_stats=True, measure_norms=gain is not None)
        self.exchange = (
            TableAllToAll(RowAllToAll(timeout=runtime.wait_timeout_s))
            if self.num_shards > 1
            else VirtualRowExchange(1).endpoint(0)
        )
        link = link_preset(config.interconnect)
        if link is not None:
            self.exchange = linked_rows(self.exchange, link, self.rank, self.num_shards)
        last_step = trainer._start_step + config.max_num_iterations - 1
        self.loop = ShardedLoop(
            self.owner, self.reader, self.exchange, self.rank, lambda s: trainer._step_tasks(s)[0], runtime.mode,
            last_step, runtime.wait_timeout_s, gain, runtime.stale_fraction, runtime.stale_grad_ratio,
            runtime.max_staleness, settles=lambda step: not trainer._may_run_ahead(step),
            rates=scheduled_rates(trainer.optimizers), fetch_ahead=runtime.fetch_ahead,
            placement_by_time=runtime.placement_by_time,
        )  # fmt: skip
        self.loop.place(self.views())
        CONSOLE.log(f"Odin sharded: rank {self.rank} owns rows {cuts.range(self.rank)} of {cuts.num_rows}")

    def close(self) -> None:
        """Stop the lane of the tasks run ahead and the row exchange's progress thread (before the process group is
        destroyed)."""
        self.loop.close()
        close = getattr(self.exchange, "close", None)
        if close is not None:
            close()

    @property
    def meter(self) -> Meter:
        """The rank's timeline and render counters."""
        return self.reader.meter

    def _initial_cuts(self, params: Any) -> ShardCuts:
        """The initial model (rank 0's) in Z-order, cut by load: each row weighs 1 plus the training views whose
        candidate set holds it over their mean (every view once: one epoch)."""
        full = {name: params[name].detach() for name in GAUSSIAN_PARAMS}
        if self.num_shards > 1:
            for tensor in full.values():
                dist.broadcast(tensor, src=0)
        restore_spatial_order(full, {}, None)  # in place: the model's parameters share these tensors
        runtime = self.config.runtime
        index = CullingIndex(full, self.adapter, runtime.candidate_margin, runtime.near_plane)
        return cut_by_load(row_load(views_seeing(index, self.views())).cpu(), self.num_shards)

    def views(self) -> list[Task]:
        """One task per training view (an epoch's views), whose candidate sets weigh the rows for the cuts."""
        return view_tasks(len(self.trainer.pipeline.datamanager.cached_train), self.trainer._camera)

    def _install(self, shard: dict[str, Tensor]) -> None:
        """Make the model's Gaussian parameters the shard's rows, their optimizers fresh on them."""
        model, optimizers = self.trainer.pipeline.model, self.trainer.optimizers.optimizers
        for name in GAUSSIAN_PARAMS:
            new = torch.nn.Parameter(shard[name])
            optimizer = optimizers[name]
            (old,) = optimizer.param_groups[0]["params"]
            optimizer.state.pop(old, None)
            optimizer.param_groups[0]["params"] = [new]
            model.gauss_params[name] = new
            optimizer._state_of(new)

    def iteration(self, step: int) -> bool:
        """Schedule step ``step`` on this rank, after the structural change due after step - 1; returns whether one
        ran."""
        strategy = self.trainer.pipeline.model.strategy
        changed = step > 0 and structural_change_due(strategy, step - 1)
        if changed:
            self.loop.restructure(strategy, step - 1, self.config.machine.seed, self.views())
        if self.trainer.measured_balance.due(step):  # ``settles`` kept the step before from running ahead
            self.loop.settled(f"the re-balance before step {step}")
            self.trainer.measured_balance.rebalance_by(step, self.meter.timeline)
        self.loop.iteration(step)
        return changed

    def metrics(self) -> dict[str, float]:
        """The Gaussian count, this rank's shard and what it moved, for nerfstudio's writers."""
        counters = self.loop.counters
        return {
            "gaussian_count": float(self.owner.cuts.num_rows),
            "odin/shard_rows": float(self.owner.params["means"].shape[0]),
            "odin/published_step": float(self.owner.published_through),
            "odin/rows_fetched": float(counters.rows_fetched),
            "odin/rows_returned": float(counters.rows_returned),
            "odin/ran_ahead": float(counters.ran_ahead),
            "odin/settled_locally": float(counters.settled_locally),
            "odin/stale_reads": float(counters.stale_reads),
            "odin/reruns": float(counters.reruns),
            "odin/recuts": float(counters.recuts),
            "odin/cache_hits": float(counters.task_rows - counters.rows_fetched),
            "odin/bytes_sent": float(counters.bytes_sent),
            "odin/bytes_received": float(counters.bytes_received),
        }

    def _gathered(self) -> dict[str, Tensor] | None:
        """Every shard's parameter rows, on rank 0 (None elsewhere): a collective on every rank."""
        pieces = [{name: self.owner.params[name].detach() for name in GAUSSIAN_PARAMS}]
        pieces += [{name: value[:0] for name, value in pieces[0].items()}] * (self.num_shards - 1)
        parts = self.exchange.start(pieces, "the whole model for rank 0").wait(self.config.runtime.wait_timeout_s)
        if self.rank != 0:
            return None
        return {name: torch.cat([part[name] for part in parts]) for name in GAUSSIAN_PARAMS}

    @contextlib.contextmanager
    def whole_model(self) -> Iterator[None]:
        """Rank 0's model holds every shard's rows meanwhile (evaluation, the consolidated checkpoint)."""
        whole = self._gathered()
        params = self.trainer.pipeline.model.gauss_params
        shard = {name: params[name] for name in GAUSSIAN_PARAMS}
        try:
            if whole is not None:
                for name in GAUSSIAN_PARAMS:
                    params[name] = torch.nn.Parameter(whole[name], requires_grad=False)
            yield
        finally:
            for name in GAUSSIAN_PARAMS:
                params[name] = shard[name]

    def save(self, step: int) -> None:
        """This rank's shard, then (rank 0) nerfstudio's checkpoint of the whole model and the manifest."""
        trainer, owner = self.trainer, self.owner
        folder = Path(trainer.checkpoint_dir).parent / SHARDS_FOLDER
        state = {
            "step": step,
            "params": {name: owner.params[name].detach() for name in GAUSSIAN_PARAMS},
            "optimizers": {name: owner.optimizers[name].state_dict() for name in GAUSSIAN_PARAMS},
            "schedulers": {name: s.state_dict() for name, s in trainer.optimizers.schedulers.items()},
            "tables": {"seq": owner.tables.seq, "published_step": owner.tables.published_step},
            "strategy": dict(owner.strategy_state or {}),
            "bounds": owner.cuts.bounds.tolist(),
            REBALANCE_KEY: saved_rebalance(trainer.pipeline.datamanager),
        }
        save_atomically(state, shard_path(folder, step, self.rank, self.num_shards))
        with self.whole_model():
            if self.rank == 0:
                path = checkpoint_path(trainer.checkpoint_dir, step)
                pipeline = trainer.pipeline.module if hasattr(trainer.pipeline, "module") else trainer.pipeline
                save_atomically({"step": step, "pipeline": pipeline.state_dict(), "optimizers": {}, "scalers": {}},
                                path)
        if self.num_shards > 1:
            wait_for_rank0("shard checkpoints", step, self.config.rank0_work_timeout_s)
        if self.rank == 0:
            manifest = {
                "step": step,
                "num_shards": self.num_shards,
                "bounds": owner.cuts.bounds.tolist(),
                "files": [shard_path(folder, step, r, self.num_shards).name for r in range(self.num_shards)],
            }
            manifest_path(folder, step).write_text(json.dumps(manifest, indent=1))
            if self.config.save_only_latest_checkpoint:  # nerfstudio's default: the older steps' files go
                kept = {checkpoint_path(trainer.checkpoint_dir, step), manifest_path(folder, step)}
                kept |= {folder / name for name in manifest["files"]}
                older = [*Path(trainer.checkpoint_dir).glob("step-*.ckpt"), *folder.glob("step-*")]
                for path in older:
                    if path not in kept:
                        path.unlink()

    def _restore(self, shard: dict[str, Any]) -> None:
        """A resumed rank's moments, schedulers, versions and statistics from its shard file."""
        trainer, owner = self.trainer, self.owner
        for name in GAUSSIAN_PARAMS:
            owner.optimizers[name].load_state_dict(shard["optimizers"][name])
        for name, scheduler in trainer.optimizers.schedulers.items():
            if name in shard["schedulers"] and self.config.load_scheduler:
                scheduler.load_state_dict(shard["schedulers"][name])
        device = owner.params["means"].device
        rows = owner.params["means"].shape[0]
        owner.tables = PrimitiveTables(
            seq=shard["tables"]["seq"].to(device),
            pending_step=torch.full((rows,), NO_STEP, dtype=torch.int64, device=device),
            published_step=shard["tables"]["published_step"].to(device),
        )
        owner.strategy_state.update(
            {k: v.to(device) if isinstance(v, Tensor) else v for k, v in shard["strategy"].items()}
        )
        restore_rebalance(trainer.pipeline.datamanager, shard.get(REBALANCE_KEY))


def scheduled_rates(optimizers: Any) -> LearningRates:
    """The learning rates nerfstudio's schedulers will set (``optimizers``: its ``Optimizers``), for the bound on
    how far the rows of steps fetched ahead may move: the k-th publication from now takes a ``LambdaLR``'s rate k
    scheduler steps on (nerfstudio's schedulers are), the current rate without a scheduler, and an unknown one
    (another scheduler) is unbounded, so that nothing is read ahead past the next publication."""

    def rate(name: str, ahead: int) -> float:
        current = optimizers.optimizers[name].param_groups[0]["lr"]
        scheduler = optimizers.schedulers.get(name)
        if scheduler is None or ahead == 0:
            return current
        if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            return scheduler.base_lrs[0] * scheduler.lr_lambdas[0](scheduler.last_epoch + ahead)
        return math.inf

    return rate


def find_sharded_checkpoint(config: Any, rank: int, num_shards: int) -> dict[str, Any] | None:
    """The manifest and this rank's shard of the checkpoint ``--load-dir`` (``--load-step``, else the newest
    manifest) names, or None without ``--load-dir``; sets nothing. Errors name the file and say what to do."""
    if config.load_dir is None:
        return None
    folder = Path(config.load_dir).parent / SHARDS_FOLDER
    steps = sorted(int(p.name[5:14]) for p in folder.glob("step-*.json")) if folder.is_dir() else []
    if not steps:
        raise FileNotFoundError(
            f"{folder} holds no sharded checkpoint manifest (step-<n>.json): was the run trained with --sharded? "
            "Resume it without --sharded, or pass the run's nerfstudio_models folder as --load-dir"
        )
    step = config.load_step if config.load_step is not None else steps[-1]
    path = manifest_path(folder, step)
    if not path.is_file():
        raise FileNotFoundError(f"no sharded checkpoint of step {step}: {path} does not exist (steps: {steps})")
    manifest = json.loads(path.read_text())
    if manifest["num_shards"] != num_shards:
        raise ValueError(
            f"{path} was saved by {manifest['num_shards']} shards and this run has {num_shards}: resume a sharded "
            f"run with the same number of processes (torchrun --nproc-per-node {manifest['num_shards']}); "
            "changing W on resume is not supported yet"
        )
    missing = [name for name in manifest["files"] if not (folder / name).is_file()]
    if missing:  # every rank stops here, with the same message
        raise FileNotFoundError(f"shards {', '.join(missing)} of {path} are missing; resume from another step")
    shard_file = folder / manifest["files"][rank]
    allow_nerfstudio_checkpoints()
    try:
        shard = torch.load(shard_file, map_location="cpu")
    except Exception as error:  # a truncated or damaged file
        raise ValueError(f"shard {shard_file} cannot be read ({error}); resume from another step") from error
    return {"manifest": manifest, "shard": shard, "step": step}
