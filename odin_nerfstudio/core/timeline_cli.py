"""`odin-timeline`: draw a run's per-rank timeline as a PNG a person can read, with the run's figures above it.

Why: the Chrome trace (``odin_timeline.json``, ``odin_timeline_rank<r>.json``) opens in Perfetto, but a figure for a
report or an issue should show at a glance where each rank computed and where it waited, and why. One lane per
worker of each rank: render (blue), backward (orange), wait coloured by its reason (raw conflict red, read behind
pink, barrier grey, ring purple, other brown); under it a thin lane of the rank's exchanges in flight (comm,
green, from its start to its publication) and its publications (black). Time runs from the run's first event;
the ranks of one host share its monotonic clock, so their lanes line up (traces from several hosts are offset by
their clocks). Above: views/s, the share of the wait-free bound, and per rank the idle and exposed wait shares
(``timeline_metrics``).

Usage: ``odin-timeline <run folder or trace json> [--output timeline.png] [--start S] [--end S]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tyro

from odin_nerfstudio.core.help_text import reflow_help_texts
from odin_nerfstudio.core.timeline import Event
from odin_nerfstudio.core.timeline_metrics import RunMetrics, load_run, rank_files

COLOURS = {"render": "#1f77b4", "backward": "#ff7f0e", "comm": "#2ca02c", "publish": "#000000"}
WAIT_COLOURS = {"raw": "#d62728", "behind": "#e377c2", "barrier": "#7f7f7f", "ring": "#9467bd"}
OTHER_WAIT = "#8c564b"
LANE, THIN = 1.0, 0.35


@dataclass
class TimelineCliConfig:
    """Draw a run's per-rank timeline (render, backward, wait by reason, comm, publish) as a PNG."""

    run: tyro.conf.Positional[Path]
    """A run folder (searched for odin_timeline*.json) or one Chrome trace file."""
    output: Optional[Path] = None
    """Where the PNG goes (default: odin_timeline.png beside the first trace)."""
    start: float = 0.0
    """First second shown (from the run's first event)."""
    end: Optional[float] = None
    """Last second shown (default: the end of the run)."""


def summary(run: RunMetrics) -> str:
    """Two lines of the run's figures for the title."""
    ranks = "; ".join(
        f"rank {r.rank}: idle {r.idle_share:.0%}, exposed wait {r.exposed_wait_share:.0%}" for r in run.ranks
    )
    return (
        f"{run.views} views, {run.views_per_s:.2f} views/s = {run.bound_share:.0%} of the wait-free bound "
        f"({run.wait_free_views_per_s:.2f}); conflicts {run.conflict_rate:.2f}, re-runs {run.fallback_rate:.3f} "
        f"per task\n{ranks}"
    )


def colour(event: Event) -> str:
    """An event's colour (waits by reason)."""
    if event.name == "wait":
        return WAIT_COLOURS.get(str(event.args.get("reason")), OTHER_WAIT)
    return COLOURS.get(event.name, OTHER_WAIT)


def draw(
    run: RunMetrics, events: list[list[Event]], output: Path, start: float = 0.0, end: float | None = None
) -> Path:
    """Draw every rank's lanes between ``start`` and ``end`` seconds into ``output`` (PNG); returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    origin = min((e.start_ns for rank in events for e in rank), default=0)
    last = (max((e.end_ns for rank in events for e in rank), default=origin) - origin) / 1e9
    end = last if end is None else end
    lanes: list[tuple[str, float, float, list[Event]]] = []
    y = 0.0
    for metrics, rank_events in zip(run.ranks, events, strict=True):
        workers = sorted({e.worker for e in rank_events if e.worker >= 0 and e.name != "comm"})
        for worker in workers:
            mine = [e for e in rank_events if e.worker == worker and e.name in ("render", "backward", "wait")]
            label = f"rank {metrics.rank}" + (f" w{worker}" if len(workers) > 1 else "")
            lanes.append((label, y, LANE, mine))
            y -= LANE + 0.15
        exchange = [e for e in rank_events if e.name in ("comm", "publish")]
        lanes.append((f"rank {metrics.rank} comm", y + LANE - THIN, THIN, exchange))
        y -= THIN + 0.6
    figure, axes = plt.subplots(figsize=(14, 1.2 + 0.55 * len(lanes)))
    for _, base, height, lane_events in lanes:
        shown = [e for e in lane_events if (e.end_ns - origin) / 1e9 >= start and (e.start_ns - origin) / 1e9 <= end]
        for name_group in ("comm", "other"):
            group = [e for e in shown if (e.name == "comm") == (name_group == "comm")]
            if not group:
                continue
            bars = [((e.start_ns - origin) / 1e9, max(e.end_ns - e.start_ns, 1) / 1e9) for e in group]
            heights = (base, height / 2) if name_group == "comm" else (base, height)
            axes.broken_barh(bars, heights, facecolors=[colour(e) for e in group], linewidth=0)
    axes.set_yticks([base + height / 2 for _, base, height, _ in lanes], [label for label, *_ in lanes])
    axes.set_xlim(start, end)
    axes.set_xlabel("seconds from the run's first event")
    axes.set_title(summary(run), fontsize=9, loc="left")
    legend = [Patch(color=c, label=n) for n, c in (("render", COLOURS["render"]), ("backward", COLOURS["backward"]))]
    legend += [Patch(color=c, label=f"wait: {reason}") for reason, c in WAIT_COLOURS.items()]
    legend += [Patch(color=OTHER_WAIT, label="wait: other")]
    legend += [Patch(color=COLOURS["comm"], label="exchange in flight"), Patch(color="black", label="publish")]
    axes.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)
    return output


def main(argv: list[str] | None = None) -> None:
    """Read the run, print its figures, draw the PNG."""
    reflow_help_texts()  # --help: each option's text as one paragraph, not cut where the source wraps
    config = tyro.cli(TimelineCliConfig, args=argv)
    run, events = load_run(config.run)
    output = config.output or rank_files(config.run)[0].trace.with_name("odin_timeline.png")
    print(summary(run))
    print(f"wrote {draw(run, events, output, config.start, config.end)}")


if __name__ == "__main__":
    main()
