"""The modeled data plane the simulator hands the real runtime: a workload's sets, modeled costs and deliveries.

The simulator runs ``runtime.OdinRuntime`` and ``drivers.training_loop.TrainingLoop`` themselves (one protocol:
every rule the runtime has is in a prediction). What it replaces is what the runtime reads and what takes time:

- :class:`SetIndex`, the culling index: C(t) is the workload's set of the task's view (no geometry moves); the
  publication's modeled cost is spent when the index is told of the rows a publication wrote (once per
  publication, first parts included);
- :class:`ModeledRender`, the render function: spends the task's modeled render + backward time and returns a loss
  whose gradient is non-zero exactly on the view's write set (its A(t)), uneven across its rows;
- :class:`ModeledTransport`, the exchange: the real in-process merge (``comm/inprocess.VirtualTransport``), with
  each step delivered when the interconnect model says (the first part of a step by its own bytes);
- :class:`VirtualLanes`, the lane threads (``tasks_in_flight`` > 1): a lane's gather, render and backward run at
  once, its modeled time beside the process's own (two streams of one GPU taken as fully parallel: optimistic),
  and it is handed back once that time has passed.

The tensors are real but small: a replica per simulated process holds ``means`` and ``scales`` [N, 3] with their
Adam moments, which is what the runtime's gathers, staging, merge and selective Adam act on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from odin_nerfstudio.comm.inprocess import VirtualHandle, VirtualTransport
from odin_nerfstudio.comm.protocol import FirstPart
from odin_nerfstudio.core.conflicts import Conflicts, StepRows, isin_sorted, raw
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.kernels import _torch_impl
from odin_nerfstudio.runtime.culling_index import Reach
from odin_nerfstudio.simulation.clock import VirtualClock
from odin_nerfstudio.simulation.interconnect import Interconnect
from odin_nerfstudio.simulation.workload import Workload


@dataclass(frozen=True)
class ViewCamera:
    """What the runtime reads of a simulated view's camera: its image size (a task's pixels)."""

    width: int
    height: int = 1


class _NeverMeets:
    """Culling bounds under which no row moves into a region: a workload's sets do not move."""

    def meets(self, region: Any, rows: Tensor, *args: Any) -> Tensor:
        return torch.zeros(rows.numel(), dtype=torch.bool)


class SetIndex:
    """The culling index of a workload: C(t) is the set of t's view (see the module).

    Args:
        workload: the views' candidate and write sets.
        params: the replica (its device).
        clock: the virtual clock publications spend their time on.
        publish_s: a publication's modeled time from the rows it writes.
    """

    def __init__(
        self, workload: Workload, params: dict[str, Tensor], clock: VirtualClock, publish_s: Callable[[int], float]
    ) -> None:
        self.workload, self.params, self.clock, self.publish_s = workload, params, clock, publish_s

    def candidates(self, task: Task) -> Tensor:
        """C(t): the view's candidate set."""
        return self.workload.candidates[task.view]

    def candidates_and_conflicts(self, task: Task, writes: Sequence[StepRows]) -> tuple[Tensor, Conflicts]:
        """C(t) and its rows with an earlier unpublished write (RAW, ``core/conflicts.raw``)."""
        candidate = self.candidates(task)
        return candidate, raw(candidate, task.step, writes)

    def any_meets(self, task: Task, rows: Tensor, reach: Reach | None = None, region: Any = None) -> bool:
        """Whether any of ``rows`` lies in the task's region: in a workload, its candidate set."""
        return bool(isin_sorted(rows, self.candidates(task)).any())

    def validate_read(
        self, task: Task, candidate: Tensor, written: Sequence[tuple[int, Tensor]], admitted: dict[int, Tensor]
    ) -> tuple[bool, bool]:
        """The stale check of ``ops.validate_read`` (its reference); no row moves into a region."""
        return _torch_impl.validate_read(candidate, written, admitted, _NeverMeets(), None)  # type: ignore[arg-type]

    def reach(self, mean_step: float, scale_step: float) -> Reach:
        """Sets do not move: no reach."""
        return Reach(grow=1.0, shift=0.0)

    def update(self, rows: Tensor, means: Tensor, scales: Tensor) -> None:
        """A publication wrote ``rows``: spend its modeled time."""
        self.clock.spend(self.publish_s(rows.numel()))

    def rebuild(self) -> None:
        """Nothing to rebuild (no structural changes are simulated)."""


class ModeledRender:
    """The simulator's render function (see the module).

    A task's loss is a weighted sum of its write rows, the weights drawn per view (seeded, exponential, mean 1), so
    its gradient is non-zero exactly on A(t) and uneven across rows, as a real one is: throughput-first's
    gradient-size rule (a stale read's rows must carry a small share of the producer's gradient) then has something
    to decide on.

    Args:
        workload: the views' sets.
        clock: the virtual clock.
        task_s: a task's modeled render + backward (+ bookkeeping) seconds.
        seed: the weights' seed.
    """

    def __init__(
        self, workload: Workload, clock: VirtualClock, task_s: Callable[[Task], float], seed: int = 0
    ) -> None:
        self.workload, self.clock, self.task_s, self.seed = workload, clock, task_s, seed
        self._terms: dict[int, tuple[Tensor, Tensor]] = {}

    def __call__(self, task: Task, leaves: dict[str, Tensor], generator: torch.Generator) -> tuple[Tensor, None]:
        self.clock.spend(self.task_s(task))
        view = task.view
        if view not in self._terms:
            candidate, writes = self.workload.candidates[view], self.workload.writes[view]
            weights = torch.empty(writes.numel(), 1).exponential_(generator=torch.Generator().manual_seed(
                self.seed * 1_000_003 + view))
            self._terms[view] = torch.searchsorted(candidate, writes), weights
        positions, weights = self._terms[view]
        return (leaves["means"].index_select(0, positions) * weights).sum(), None


class _ModeledHandle:
    """A worker's handle of one step's modeled exchange: the real merged update, at the modeled time."""

    def __init__(self, transport: ModeledTransport, inner: VirtualHandle, step: int) -> None:
        self.transport, self.inner, self.step = transport, inner, step

    def done(self) -> bool:
        delivery = self.transport.delivery.get(self.step)
        return delivery is not None and delivery <= self.transport.clock.now_s

    def wait(self, timeout: float) -> SparseUpdate:
        self.transport.clock.wait(lambda: self.transport.delivery.get(self.step), f"exchange of step {self.step}")
        return self.inner.wait(timeout)

    def first(self) -> FirstPart | None:
        delivery = self.transport.first_delivery.get(self.step)
        if delivery is None or delivery > self.transport.clock.now_s:
            return None
        return self.inner.first()

    def wait_first(self, timeout: float) -> FirstPart:
        what = f"first part of step {self.step}"
        self.transport.clock.wait(lambda: self.transport.first_delivery.get(self.step), what)
        return self.inner.wait_first(timeout)


class _ModeledEndpoint:
    """Worker ``worker``'s end of a :class:`ModeledTransport`."""

    def __init__(self, transport: ModeledTransport, worker: int) -> None:
        self.transport, self.worker = transport, worker

    def start_exchange(self, step: int, local_update: SparseUpdate, first: Tensor | None = None) -> _ModeledHandle:
        return self.transport.contribute(step, self.worker, local_update, first)


class ModeledTransport:
    """Every simulated worker's exchange: merged in process, delivered in virtual time (see the module).

    Args:
        num_workers: W.
        template: a replica's parameters (the gradient rows' shapes).
        clock: the virtual clock.
        interconnect: when a step is delivered, from the parts' send times and bytes.
        row_bytes: the bytes an active row adds to a part.
    """

    def __init__(
        self,
        num_workers: int,
        template: dict[str, Tensor],
        clock: VirtualClock,
        interconnect: Interconnect,
        row_bytes: int,
    ) -> None:
        self.inner = VirtualTransport(num_workers, template)
        self.num_workers, self.clock, self.interconnect, self.row_bytes = num_workers, clock, interconnect, row_bytes
        self.delivery: dict[int, float] = {}
        self.first_delivery: dict[int, float] = {}
        self._sends: dict[int, dict[int, tuple[float, Tensor, Tensor | None]]] = {}

    def endpoint(self, worker: int) -> _ModeledEndpoint:
        """The transport as worker ``worker`` sees it."""
        return _ModeledEndpoint(self, worker)

    def contribute(self, step: int, worker: int, update: SparseUpdate, first: Tensor | None) -> _ModeledHandle:
        """``worker`` sends its part of ``step`` now; with the last part the step's deliveries are known."""
        sends = self._sends.setdefault(step, {})
        sends[worker] = (self.clock.now_s, update.rows, first)
        handle = _ModeledHandle(self, self.inner.contribute(step, worker, update, first), step)
        if len(sends) == self.num_workers:
            del self._sends[step]
            self._deliver(step, [sends[w] for w in range(self.num_workers)])
        return handle

    def _deliver(self, step: int, parts: list[tuple[float, Tensor, Tensor | None]]) -> None:
        """The step's delivery (every part's rows) and, where rows were asked for first, its first part's."""
        times = [send for send, _, _ in parts]
        rows = [part_rows for _, part_rows, _ in parts]
        union = torch.unique(torch.cat(rows)).numel() if self.interconnect.collective == "chosen" else 0
        sizes = [r.numel() * self.row_bytes for r in rows]
        self.delivery[step] = self.interconnect.delivery_s(times, sizes, union)
        asked = [a for _, _, a in parts if a is not None]
        if asked:
            first = torch.unique(torch.cat(asked))
            counts = [int(isin_sorted(r, first).sum()) for r in rows]
            first_sizes = [count * self.row_bytes for count in counts]
            self.first_delivery[step] = self.interconnect.delivery_s(times, first_sizes, int(np.sum(counts)))


class _LaneWork:
    """A lane's finished work, handed back once the virtual clock reaches ``finish``."""

    def __init__(self, clock: VirtualClock, value: Any, finish: float) -> None:
        self.clock, self.value, self.finish = clock, value, finish

    def done(self) -> bool:
        return self.clock.now_s >= self.finish

    def result(self) -> Any:
        return self.value


class VirtualLanes:
    """The runtime's lane executor in virtual time (``runtime/lanes.LaneExecutor``; see the module)."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def submit(self, fn: Callable[..., Any], *args: Any) -> _LaneWork:
        start = self.clock.now_s
        with self.clock.beside() as spent:
            value = fn(*args)
        return _LaneWork(self.clock, value, start + spent[0])

    def wait_any(self, running: Sequence[_LaneWork], timeout: float) -> bool:
        self.clock.wait(lambda: min(work.finish for work in running), "a lane's render")
        return True

    def shutdown(self) -> None:
        """Nothing to stop."""
