"""Range checks of odin-splat's command-line options, run before any work, with errors naming the CLI flag.

Why: the runtime and the schedule take their options as plain numbers and would accept, say, a stale fraction of
1.5 or a wait timeout of 0 and fail later (or never) in a way that names an internal field. ``check_options`` runs
first in ``odin-train`` and in the trainer's setup, so ``ns-train`` and every torchrun rank refuse a bad command
line before reading the scene or joining a process group. ``warn_if_step_exceeds_views`` warns, once the scene is
known, when W x B is larger than the number of train views (every iteration would be a whole epoch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from nerfstudio.utils.rich_utils import CONSOLE

from odin_nerfstudio.drivers.sharded_loop import SHARDED_MODES
from odin_nerfstudio.runtime.config import OdinRuntimeConfig


class OptionError(ValueError):
    """An option out of range; the message names its CLI flag, the value and the allowed range."""


def _integer_at_least(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f"an integer >= {low}"


def _number(test: Callable[[float], bool], allowed: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, (int, float)) and math.isfinite(v) and test(v)), allowed


RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "runtime.stale_fraction": _number(lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "runtime.stale_grad_ratio": _number(lambda v: v >= 0, "a number >= 0"),
    "runtime.max_staleness": _integer_at_least(0),
    "runtime.candidate_margin": _number(lambda v: v >= 0, "a number >= 0"),
    "runtime.wait_timeout_s": _number(lambda v: v > 0, "a number of seconds > 0"),
    "replica_check_every": _integer_at_least(0),
    "read_behind_after": _integer_at_least(0),
    "rank0_work_timeout_s": _number(lambda v: v > 0, "a number of seconds > 0"),
    "memory_cap_gib": _number(lambda v: v >= 0, "a number of GiB >= 0 (0: no cap)"),
    "pipeline.datamanager.views_per_step": _integer_at_least(1),
    "pipeline.datamanager.ring_size": _integer_at_least(1),
    "pipeline.datamanager.schedule_seed": _integer_at_least(0),
    "pipeline.datamanager.overlap_threshold": _number(lambda v: v >= 0, "a number >= 0"),
    "pipeline.datamanager.rebalance_every": _integer_at_least(0),
    "pipeline.datamanager.balance_tolerance": _number(lambda v: v >= 0, "a number >= 0"),
    "pipeline.datamanager.band_floor": _integer_at_least(1),
}
"""Each checked option (its path in the trainer config) with its test and the allowed range in words (the runtime
itself refuses ring slots, steps fetched ahead or tasks in flight < 1 and unknown modes while the command line is
parsed)."""


def flag(path: str) -> str:
    """The CLI flag of a config path as tyro spells it: ``runtime.stale_fraction`` -> ``--runtime.stale-fraction``."""
    return "--" + path.replace("_", "-")


def _value(config: Any, path: str) -> Any:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def check_options(config: Any) -> None:
    """Refuse options of an odin-splat trainer config that are out of range.

    Configs of other methods (without Odin's runtime) are left alone.

    Raises:
        OptionError: naming every offending flag, its value and its allowed range.
    """
    if not isinstance(getattr(config, "runtime", None), OdinRuntimeConfig):
        return
    problems = [
        f"{flag(path)} {_value(config, path)!r}: must be {allowed}"
        for path, (test, allowed) in RULES.items()
        if not test(_value(config, path))
    ]
    workers = config.pipeline.datamanager.num_workers
    if workers is not None and not _integer_at_least(1)[0](workers):
        problems.append(f"{flag('pipeline.datamanager.num_workers')} {workers!r}: must be an integer >= 1 (or unset)")
    if getattr(config, "sharded", False):
        problems += _sharded_problems(config)
    if problems:
        raise OptionError("odin-splat: option(s) out of range: " + "; ".join(problems))


def _sharded_problems(config: Any) -> list[str]:
    """What ``--sharded`` does not run: the modes outside :data:`SHARDED_MODES`."""
    problems = []
    if config.runtime.mode not in SHARDED_MODES:
        problems.append(
            f"{flag('runtime.mode')} {config.runtime.mode!r} with --sharded True: the sharded mode runs "
            f"{', '.join(SHARDED_MODES)}"
        )
    return problems


def warn_if_step_exceeds_views(num_workers: int, views_per_step: int, num_views: int) -> bool:
    """Warn when a step of W x B views is larger than the scene's ``num_views`` train views; whether it warned."""
    if num_workers * views_per_step <= num_views:
        return False
    CONSOLE.print(
        f"[yellow]odin-splat: {flag('pipeline.datamanager.num_workers')} x "
        f"{flag('pipeline.datamanager.views_per_step')} = {num_workers} x {views_per_step} views per step, but the "
        f"scene has {num_views} train views: every iteration is a whole epoch and at most {num_views} of the "
        f"{num_workers} workers get a view. Choose W x B <= {num_views}.[/yellow]"
    )
    return True
