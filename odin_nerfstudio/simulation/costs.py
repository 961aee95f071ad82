"""The simulator's cost model, fitted on a real run's timeline: what a task, a publication and a step cost.

Why fitted: a task's render + backward grows with the rows it reads and the pixels it draws, so a model fitted on
one scene predicts another's tasks from their |C(t)| and image size. From each rank's Chrome trace
(``odin_timeline_rank<r>.json``, whose render and backward spans carry ``candidates`` = |C(t)| and ``pixels``) and
counters (``odin_counters_rank<r>.json``):

- task: render + backward = a + b |C(t)| + c pixels (least squares; a column that does not vary is dropped), R^2
  reported; plus the hooks' bookkeeping per task (the counters' ``bookkeeping_ns`` less the publish spans, over
  the renders);
- publication: a + b rows (the publish spans, which carry the rows published);
- the exchange's own time on the run's transport (``base_s``): per step, the first publication on any rank after
  the last rank sent its part, the lower quartile over steps (a step's first publication may also wait behind a
  rank's unfinished render or publication, which the simulator adds itself); a sharded run
  (no such spans): per fetch, the shortest wait of a rank (the last to send waits for the all-to-all alone), the
  median over fetches;
- the re-runs validation adds besides stale reads (``rerun_share``: re-runs less "stale" failures, per task; escapes
  on bench_train's street), which the simulator adds to every task's time in the modes that re-run them;
- the trainer's time per step outside the runtime (``step_overhead_s``: nerfstudio's iteration, the step's tasks
  built, logging): per rank, the span less compute, less the time inside wait spans, less the transport's
  ``comm_ns``, over the steps; the median over ranks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from odin_nerfstudio.core.timeline import Event
from odin_nerfstudio.core.timeline_metrics import events_from_chrome_trace, rank_files


@dataclass(frozen=True)
class LinearFit:
    """y = intercept + sum_i coefficient_i x_i, fitted by least squares, with its R^2 and sample count."""

    intercept: float
    coefficients: tuple[float, ...]
    r2: float
    samples: int

    @classmethod
    def of(cls, features: np.ndarray, targets: np.ndarray) -> LinearFit:
        """Fit on ``features`` [S, F] and ``targets`` [S]; a feature that does not vary gets coefficient 0 (its
        effect is in the intercept)."""
        features = np.asarray(features, dtype=np.float64).reshape(len(targets), -1)
        targets = np.asarray(targets, dtype=np.float64)
        if targets.size == 0:
            raise ValueError("a cost fit needs at least one sample")
        varies = features.std(axis=0) > 0
        design = np.column_stack([np.ones(len(targets)), features[:, varies]])
        solution, *_ = np.linalg.lstsq(design, targets, rcond=None)
        coefficients = np.zeros(features.shape[1])
        coefficients[varies] = solution[1:]
        residual = targets - design @ solution
        total = float(((targets - targets.mean()) ** 2).sum())
        r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
        return cls(float(solution[0]), tuple(float(c) for c in coefficients), r2, int(targets.size))

    def __call__(self, *features: float) -> float:
        """The fitted value at ``features``."""
        return self.intercept + sum(c * x for c, x in zip(self.coefficients, features))


@dataclass(frozen=True)
class CostModel:
    """Seconds a simulated worker spends on each thing (see the module).

    Attributes:
        task: render + backward of a task from (|C(t)|, pixels).
        bookkeeping_s: the runtime hooks' time per task (culling, checks, gathers, staging, validation).
        publish: a publication from its rows.
        base_s: the transport's own time per exchange after the last part is sent.
        step_overhead_s: the trainer's time per step outside the runtime.
        rerun_share: re-runs per task other than stale reads' (escapes, moved candidate sets).
        residuals: the task fit's residuals (measured - fitted seconds): the simulator draws a task's variation
            from them, so workers are as unequal as the fitted run's tasks were (the barrier's idle).
    """

    task: LinearFit
    bookkeeping_s: float
    publish: LinearFit
    base_s: float = 0.0
    step_overhead_s: float = 0.0
    rerun_share: float = 0.0
    residuals: tuple[float, ...] = ()

    def task_s(self, candidates: int, pixels: int) -> float:
        """One task's time: render + backward + bookkeeping."""
        return max(self.task(candidates, pixels), 0.0) + self.bookkeeping_s

    def publish_s(self, rows: int) -> float:
        """One publication's time on one replica."""
        return max(self.publish(rows), 0.0)

    @classmethod
    def fit(cls, runs: Sequence[Path]) -> CostModel:
        """Fit on the timelines of ``runs`` (run folders, or trace files): every rank's tasks and publications."""
        ranks = [rank for run in runs for rank in _RankTrace.read_all(Path(run))]
        samples = np.array([sample for rank in ranks for sample in rank.task_samples()], dtype=np.float64)
        if samples.size == 0:
            raise ValueError(
                f"no render span with 'candidates' and 'pixels' in {[str(r) for r in runs]}: the run predates the "
                "timeline's task sizes; re-run it"
            )
        publishes = np.array([p for rank in ranks for p in rank.publish_samples()], dtype=np.float64).reshape(-1, 2)
        bookkeeping = [rank.bookkeeping_per_task_s() for rank in ranks]
        runs_of = {}
        for rank in ranks:
            runs_of.setdefault(rank.run, []).append(rank)
        bases = [_exchange_base_s(g) or _row_exchange_base_s(g) for g in runs_of.values() if len(g) > 1]
        task = LinearFit.of(samples[:, :2], samples[:, 2])
        residuals = samples[:, 2] - np.array([task(c, p) for c, p in samples[:, :2]])
        return cls(
            task=task,
            bookkeeping_s=float(np.median([b for b in bookkeeping if b is not None] or [0.0])),
            publish=LinearFit.of(publishes[:, :1], publishes[:, 1]) if len(publishes) else LinearFit(0.0, (0.0,), 1, 0),
            base_s=float(np.median([b for b in bases if b is not None] or [0.0])),
            step_overhead_s=float(np.median([rank.step_overhead_s() for rank in ranks])),
            rerun_share=float(np.median([rank.rerun_share() for rank in ranks])),
            residuals=tuple(float(r) for r in residuals),
        )

    def save(self, path: Path) -> None:
        """Write the model as JSON (``odin-simulate --costs`` reads it back)."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> CostModel:
        """A model written by :meth:`save`; ValueError naming the file if it is not one."""
        try:
            fields = json.loads(Path(path).read_text())
            task, publish = (_fit(fields.pop(name)) for name in ("task", "publish"))
            fields["residuals"] = tuple(fields.get("residuals", ()))
            return cls(task=task, publish=publish, **fields)
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            raise ValueError(f"--costs {path} is not a cost model written by --save-costs: {error}") from None

    def describe(self) -> str:
        """One line: the fitted formulas and their R^2."""
        a, (b, c) = self.task.intercept, self.task.coefficients
        return (
            f"render + backward = {a * 1e3:.2f} ms + {b * 1e6:.2f} us x |C(t)| + {c * 1e9:.2f} ns x pixels "
            f"(R^2 {self.task.r2:.2f}, {self.task.samples} tasks); bookkeeping {self.bookkeeping_s * 1e3:.2f} ms per "
            f"task; publication {self.publish.intercept * 1e3:.2f} ms + {self.publish.coefficients[0] * 1e6:.2f} us "
            f"x rows (R^2 {self.publish.r2:.2f}); exchange base {self.base_s * 1e3:.2f} ms; trainer "
            f"{self.step_overhead_s * 1e3:.2f} ms per step; re-runs besides stale reads {self.rerun_share:.1%} of tasks"
        )


def _fit(fields: dict) -> LinearFit:
    """A LinearFit from its JSON fields."""
    return LinearFit(fields["intercept"], tuple(fields["coefficients"]), fields["r2"], fields["samples"])


@dataclass
class _RankTrace:
    """One rank's events and counters, read from a run folder."""

    run: Path
    events: list[Event]
    counters: dict | None

    @classmethod
    def read_all(cls, run: Path) -> list[_RankTrace]:
        """Every rank of the run folder (or trace file) ``run``."""
        traces = []
        for files in rank_files(run):
            counters = json.loads(files.counters.read_text()) if files.counters else None
            traces.append(cls(run, events_from_chrome_trace(json.loads(files.trace.read_text())), counters))
        return traces

    def task_samples(self) -> list[tuple[float, float, float]]:
        """(|C(t)|, pixels, render + backward seconds) per task rendered (re-runs included)."""
        return [(float(r.args["candidates"]), float(r.args["pixels"]), s) for r, s in self._renders()]

    def task_durations(self) -> list[tuple[int, int, float]]:
        """(step, view, render + backward seconds) per task rendered (re-runs included), in the order they ended."""
        return [(r.step, int(r.args["view"]), s) for r, s in self._renders()]

    def _renders(self) -> list[tuple[Event, float]]:
        """Each render span with its task's render + backward seconds."""
        renders: dict[tuple[int, int, int], list[Event]] = {}
        samples = []
        for event in self.events:
            key = (event.worker, event.step, int(event.args.get("view", -1)))
            if event.name == "render" and "candidates" in event.args:
                renders.setdefault(key, []).append(event)
            elif event.name == "backward" and renders.get(key):
                render = renders[key].pop(0)
                samples.append((render, (render.end_ns - render.start_ns + event.end_ns - event.start_ns) / 1e9))
        return samples

    def publish_samples(self) -> list[tuple[float, float]]:
        """(rows, seconds) per publication."""
        return [
            (float(e.args.get("rows", 0)), (e.end_ns - e.start_ns) / 1e9) for e in self.events if e.name == "publish"
        ]

    def _total_s(self, name: str) -> float:
        return sum(e.end_ns - e.start_ns for e in self.events if e.name == name) / 1e9

    def bookkeeping_per_task_s(self) -> float | None:
        """The hooks' time per render, publications left out (they are fitted on their own)."""
        renders = sum(1 for e in self.events if e.name == "render")
        if self.counters is None or "bookkeeping_ns" not in self.counters or not renders:
            return None  # a sharded run's counters hold no bookkeeping time
        return max(self.counters["bookkeeping_ns"] / 1e9 - self._total_s("publish"), 0.0) / renders

    def rerun_share(self) -> float:
        """Re-runs that were not stale reads', per task (0 without counters)."""
        if self.counters is None or not self.counters.get("tasks"):
            return 0.0
        stale = self.counters["validation_failures"].get("stale", 0)
        views = self.counters["tasks"] - self.counters["reruns"]
        return max(self.counters["reruns"] - stale, 0) / max(views, 1)

    def step_overhead_s(self) -> float:
        """Time per step outside compute, waits and the transport (see the module)."""
        renders = [e for e in self.events if e.name == "render"]
        if not renders:
            return 0.0
        start = min(e.start_ns for e in renders)
        span = (max(e.end_ns for e in self.events) - start) / 1e9
        compute = self._total_s("render") + self._total_s("backward")
        counters = self.counters or {}
        compute += counters["bookkeeping_ns"] / 1e9 if "bookkeeping_ns" in counters else self._total_s("publish")
        comm = counters.get("comm_ns", 0) / 1e9
        waits = _union_s([(e.start_ns, e.end_ns) for e in self.events if e.name == "wait"])
        steps = len({e.step for e in renders})
        return max(span - compute - max(waits, comm), 0.0) / max(steps, 1)


def _union_s(spans: list[tuple[int, int]]) -> float:
    """Seconds covered by the union of ``spans`` (ns)."""
    total, end = 0, None
    for start, stop in sorted(spans):
        if end is None or start > end:
            total, end = total + stop - start, stop
        elif stop > end:
            total, end = total + stop - end, stop
    return total / 1e9


def _exchange_base_s(ranks: Sequence[_RankTrace]) -> float | None:
    """Lower quartile over steps of (the first publication on any rank - the last rank's send), clipped at 0."""
    sends: dict[int, list[int]] = {}
    publishes: dict[int, list[int]] = {}
    for rank in ranks:
        for event in rank.events:
            if event.name == "comm":
                sends.setdefault(event.step, []).append(event.start_ns)
            elif event.name == "publish":
                publishes.setdefault(event.step, []).append(event.start_ns)
    gaps = [
        (min(publishes[step]) - max(times)) / 1e9
        for step, times in sends.items()
        if len(times) == len(ranks) and step in publishes
    ]
    return max(float(np.percentile(gaps, 25)), 0.0) if gaps else None


def _row_exchange_base_s(ranks: Sequence[_RankTrace]) -> float | None:
    """A sharded run's (no comm spans): the median over its fetches of the shortest wait any rank had for it (the
    last rank to send waits only for the all-to-all itself); None without fetch waits."""
    waits = [[e.end_ns - e.start_ns for e in rank.events if e.name == "wait" and e.args.get("reason") == "fetch"]
             for rank in ranks]
    shortest = [min(each) / 1e9 for each in zip(*waits)]
    return float(np.median(shortest)) if shortest else None


def recorded_durations(runs: Sequence[Path]) -> dict[tuple[int, int], float]:
    """Per (step, view), the render + backward seconds its first render measured in ``runs`` (a replay's task times:
    the run's own imbalance, task by task)."""
    durations: dict[tuple[int, int], float] = {}
    for run in runs:
        for rank in _RankTrace.read_all(Path(run)):
            for step, view, seconds in rank.task_durations():
                durations.setdefault((step, view), seconds)
    return durations


def recorded_sizes(runs: Sequence[Path]) -> dict[int, float]:
    """Per view, the mean |C(t)| its renders recorded in ``runs``' timelines (to replay a run with its own sizes)."""
    sizes: dict[int, list[float]] = {}
    for run in runs:
        for rank in _RankTrace.read_all(Path(run)):
            for event in rank.events:
                if event.name == "render" and "candidates" in event.args:
                    sizes.setdefault(int(event.args["view"]), []).append(float(event.args["candidates"]))
    return {view: float(np.mean(values)) for view, values in sizes.items()}
