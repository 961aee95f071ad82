"""A schedule in words: the RLG's and the schedule's statistics, as ``odin-schedule`` prints them and the training
log records them (one function, so both report the same numbers)."""

from __future__ import annotations

from odin_nerfstudio.scheduling.schedule import Schedule


def describe(schedule: Schedule, epochs: int = 1) -> list[str]:
    """Human-readable RLG and schedule statistics over the first ``epochs`` epochs, one line per topic.

    Shared by the ``odin-schedule`` command and the training log, so both report the same numbers.
    """
    graph, stats, config = schedule.rlg.summary(), schedule.summary(epochs), schedule.config
    short = schedule.num_views % config.step_size
    return [
        f"RLG: {_count(graph['views'], 'view')}, {_count(graph['edges'], 'edge')}, mean weight "
        f"{graph['mean_weight']:.4f}, max weight {graph['max_weight']:.4f}, "
        f"{_count(graph['isolated_views'], 'isolated view')}",
        f"schedule: W={_count(config.num_workers, 'worker')} x B={_count(config.views_per_worker, 'view')} = "
        f"{_count(config.step_size, 'view')} per step, {_count(schedule.steps_per_epoch, 'step')} per epoch"
        + (f" (the last one short: {_count(short, 'view')})" if short else "")
        + f", seed {config.seed}",
        f"conflict mass between consecutive steps over {epochs} epoch(s): {stats['conflict_mass']:.4f} scheduled "
        f"vs {stats['random_conflict_mass']:.4f} random order, ratio {stats['ratio']:.3f}",
        f"balance (max/mean predicted worker cost, averaged over full steps): {stats['balance']:.3f}; "
        f"mean overlap window {stats['mean_overlap_window']:.2f} steps (ring size {config.ring_size})",
    ]


def _count(number: int, noun: str) -> str:
    """``number`` ``noun``, the noun in the plural unless the number is one."""
    return f"{number} {noun}" + ("" if number == 1 else "s")
