"""What an odin-splat run folder says about the run it holds: its scene, mode, W, B, K, steps and interconnect.

Why: ``odin-simulate --run <folder>`` replays a real run without being told again what it was. The folder's
``config.yml`` is nerfstudio's dump, full of Python object tags; it is read here with a loader that keeps every
tagged object as a plain mapping (paths as paths), so no nerfstudio class is imported (this layer sits below
``ns/``). The number of ranks is the number of per-rank traces beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from odin_nerfstudio.core.timeline_metrics import rank_files
from odin_nerfstudio.scheduling.balance import BALANCE_TOLERANCE, MIN_BAND_GROUPS


class _TaggedLoader(yaml.SafeLoader):
    """A safe YAML loader that reads ``!!python/...`` objects as mappings, sequences or scalars."""


def _construct_tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    """A tagged node as plain data; ``pathlib`` paths (``object/apply:pathlib.PosixPath``) as a Path."""
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        parts = loader.construct_sequence(node, deep=True)
        return Path(*parts) if "Path" in suffix else parts
    return loader.construct_scalar(node)


_TaggedLoader.add_multi_constructor("tag:yaml.org,2002:python/", _construct_tagged)


@dataclass(frozen=True)
class RunSettings:
    """The run a folder holds.

    Attributes:
        scene: the scene folder it trained on.
        mode: the runtime's mode.
        ring_slots: K.
        interconnect: the ``--interconnect`` preset.
        num_workers: W.
        views_per_worker: B.
        steps: schedule steps trained.
        seed: the schedule's seed.
        processes: processes (ranks) that trained: W with one worker each, 1 with virtual workers.
        sharded: whether it trained with ``--sharded True`` (a shard of the Gaussians per rank).
        fetch_ahead: sharded quality-first's steps fetched ahead (1 in a run saved before the option existed).
        schedule_order: the datamanager's ``schedule_order`` (auto in a run saved before the option existed).
        rebalance_every: the datamanager's ``rebalance_every`` (0: the schedule by predicted costs throughout).
        balance_tolerance, band_floor: the datamanager's cost bands (the defaults in a run saved before the options).
    """

    scene: Path
    mode: str
    ring_slots: int
    interconnect: str
    num_workers: int
    views_per_worker: int
    steps: int
    seed: int
    processes: int
    sharded: bool = False
    fetch_ahead: int = 1
    schedule_order: str = "auto"
    rebalance_every: int = 0
    balance_tolerance: float = BALANCE_TOLERANCE
    band_floor: int = MIN_BAND_GROUPS


def read_run_settings(run: Path) -> RunSettings:
    """The settings of the run in folder ``run`` (its ``config.yml`` and traces).

    Raises:
        FileNotFoundError: no config.yml in ``run``, or no trace.
        ValueError: a config.yml that is not odin-splat's (the key it lacks is named).
    """
    path = Path(run) / "config.yml"
    if not path.is_file():
        raise FileNotFoundError(f"--run {run} holds no config.yml; pass an odin-splat run folder")
    config = yaml.load(path.read_text(), Loader=_TaggedLoader)
    processes = len(rank_files(Path(run)))
    try:
        datamanager, runtime = config["pipeline"]["datamanager"], config["runtime"]
        workers = datamanager.get("num_workers") or processes
        return RunSettings(
            scene=Path(config["data"]),
            mode=str(runtime["mode"]),
            ring_slots=int(runtime["ring_slots"]),
            interconnect=str(config.get("interconnect", "none")),
            num_workers=int(workers),
            views_per_worker=int(datamanager.get("views_per_step", 1)),
            steps=int(config["max_num_iterations"]),
            seed=int(datamanager.get("schedule_seed", 0)),
            processes=processes,
            sharded=bool(config.get("sharded", False)),
            fetch_ahead=int(runtime.get("fetch_ahead", 1)),
            schedule_order=str(datamanager.get("schedule_order", "auto")),
            rebalance_every=int(datamanager.get("rebalance_every", 0)),
            balance_tolerance=float(datamanager.get("balance_tolerance", BALANCE_TOLERANCE)),
            band_floor=int(datamanager.get("band_floor", MIN_BAND_GROUPS)),
        )
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path} is not an odin-splat config: it lacks {error}") from None
