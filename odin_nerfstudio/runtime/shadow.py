"""The Shadow Graph: task-local copies of the candidate rows, and the staging ring that holds their gradients.

Odin (arXiv 2607.19893, "Shadow Graph") lets work of different steps overlap without aliasing state autograd
still needs: each task gathers its candidate rows into task-local leaf tensors, renders and back-propagates into
them, and its active rows' gradients are staged in the ring slot of its step (K slots, step s in slot s mod K).
Only publication writes the global state. Memory is O(|C|) per task in flight plus O(|A|) per staged task (and
the int64 candidate sets declared in open slots), never a second copy of the model; :class:`MemoryMeter` measures
it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from odin_nerfstudio.core.batch_gain import squared_norms
from odin_nerfstudio.core.conflicts import StepRows, union_sorted
from odin_nerfstudio.core.sparse import SparseUpdate, tensor_bytes
from odin_nerfstudio.core.tasks import TaskKey
from odin_nerfstudio.kernels import ops

MEMORY_KINDS = ("leaves", "grads", "staged", "candidates")
"""What :class:`MemoryMeter` tells apart: gathered rows, their gradients, staged updates, declared candidate sets."""


@dataclass
class MemoryMeter:
    """Bytes of gathered and staged tensors alive now, and their peak with its make-up (what to shrink first).

    Attributes:
        current: bytes alive now.
        peak: the largest ``current`` seen.
        parts: bytes alive now per kind ("leaves": gathered rows, "grads": their gradients, "staged": staged
            active rows and gradients, "candidates": the candidate sets declared in open slots, superseded ones
            included).
        at_peak: ``parts`` when the peak was reached.
    """

    current: int = 0
    peak: int = 0
    parts: dict[str, int] = field(default_factory=dict)
    at_peak: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int, kind: str) -> None:
        """Account ``nbytes`` more of ``kind`` (negative to release); lanes gather from their own threads."""
        with self._lock:
            self.current += nbytes
            self.parts[kind] = self.parts.get(kind, 0) + nbytes
            if self.current > self.peak:
                self.peak = self.current
                self.at_peak = dict(self.parts)


@dataclass
class RingSlot:
    """The staging slot of one step.

    Attributes:
        step: the step the slot holds.
        device: where its row tensors live.
        candidates: per task that has read, its candidate set C(t), sorted int64 [M].
        staged: per task that has finished backward, its active rows A(t), their gradients and its densification
            statistics.
        superseded: candidate sets replaced by a re-run of their task (still declared until publication).

    Change ``candidates`` and ``staged`` only through :class:`ShadowGraph` (``declare``, ``stage``), which drops
    the cached :meth:`writes`.
    """

    step: int
    device: torch.device
    candidates: dict[TaskKey, Tensor] = field(default_factory=dict)
    staged: dict[TaskKey, SparseUpdate] = field(default_factory=dict)
    superseded: list[Tensor] = field(default_factory=list)
    _writes: StepRows | None = field(default=None, repr=False)

    def writes(self) -> StepRows:
        """The rows the step may still write: A(t) of staged tasks, C(t) of tasks still running (cached: every
        reader checks against it, the slot changes once per task)."""
        if self._writes is None:
            parts = [self.staged[key].rows if key in self.staged else rows for key, rows in self.candidates.items()]
            self._writes = StepRows(self.step, ops.union_rows(parts, self.device))
        return self._writes

    def changed(self) -> None:
        """Drop the cached write set (a task declared or staged)."""
        self._writes = None

    def declared_sets(self) -> list[Tensor]:
        """The candidate sets read in this step, superseded ones included, each sorted int64 [M]."""
        return list(self.candidates.values()) + self.superseded

    def declared(self) -> Tensor:
        """Union of the candidate sets read in this step, superseded ones included, sorted int64 [M]."""
        return union_sorted(self.declared_sets(), self.device)

    def staged_update(self, template: dict[str, Tensor]) -> SparseUpdate:
        """Sum of every staged task's update, in task order (the producer's update so far)."""
        return ops.scatter_in_order([self.staged[key] for key in sorted(self.staged)], template)


class ShadowGraph:
    """Gathers candidate rows into leaves, stages active-row gradients in a K-slot ring, and meters memory.

    Args:
        ring_slots: K, the number of steps that may be staged at once.
        device: where the slots' row tensors live (the model's device).
        measure_norms: whether each staged task carries its gradients' squared norms (the adaptive batch rule's
            measurement; work on every task that nothing else reads, so off without the rule).
    """

    def __init__(self, ring_slots: int, device: torch.device | str = "cpu", measure_norms: bool = True) -> None:
        if ring_slots < 1:
            raise ValueError(f"ring_slots must be >= 1, got {ring_slots}")
        self.ring_slots = ring_slots
        self.device = torch.device(device)
        self.measure_norms = measure_norms
        self.slots: list[RingSlot | None] = [None] * ring_slots
        self.memory = MemoryMeter()
        ops.compiled(self.device)  # load the kernel library now (seconds), not inside the first hook's clock

    def slot(self, step: int) -> RingSlot | None:
        """The slot holding ``step``, or None if it does not hold it."""
        slot = self.slots[step % self.ring_slots]
        return slot if slot is not None and slot.step == step else None

    def is_free_for(self, step: int) -> bool:
        """Whether ``step`` can use its slot (it already holds the step, or it is empty)."""
        slot = self.slots[step % self.ring_slots]
        return slot is None or slot.step == step

    def open(self, step: int) -> RingSlot:
        """The slot of ``step``, claimed if empty; raises if an earlier step still holds it."""
        if not self.is_free_for(step):
            held = self.slots[step % self.ring_slots]
            raise RuntimeError(f"ring slot {step % self.ring_slots} still holds step {held.step}, wanted {step}")
        if self.slots[step % self.ring_slots] is None:
            self.slots[step % self.ring_slots] = RingSlot(step, self.device)
        return self.slots[step % self.ring_slots]

    def open_slots(self) -> list[RingSlot]:
        """Every claimed slot, in step order."""
        return sorted((s for s in self.slots if s is not None), key=lambda s: s.step)

    def gather(
        self, params: dict[str, Tensor], rows: Tensor, seq: Tensor, concurrent: bool = False, timeout_s: float = 60.0
    ) -> tuple[dict[str, Tensor], int]:
        """Copy the candidate rows into task-local leaves that require grad (the kernel op ``gather_rows``, under
        the rows' seqlocks).

        Args:
            params: per name, the global parameter [N, ...].
            rows: the candidate set, sorted int64 [M].
            seq: per row, its sequence word, int64 [N] (``PrimitiveTables.seq``).
            concurrent: whether a publication may run beside this gather (the runtime's lanes): rows it holds are
                then read again once it releases them; else none may be held.
            timeout_s: the longest a row may stay held (then TimeoutError, naming the rows).

        Returns:
            Per name, a fresh leaf [M, ...] with ``requires_grad=True``, and how many rows were read again.
        """
        leaves, _, locked = ops.gather_rows(params, rows, seq)
        rereads = 0
        if concurrent:
            # Each row is read whole, old or new (its version is a seqlock's); a row held through every try of the
            # op is read again, alone, after the publication releases it. The check waits for the copy on CUDA,
            # on this lane's thread and stream only.
            deadline = time.monotonic() + timeout_s
            while bool(locked.any()):
                positions = torch.nonzero(locked).flatten()
                if time.monotonic() > deadline:
                    held = rows.index_select(0, positions)[:8].tolist()
                    raise TimeoutError(f"gather: rows {held} held by a publication for over {timeout_s} s")
                rereads += positions.numel()
                time.sleep(1e-4)
                again, _, still = ops.gather_rows(params, rows.index_select(0, positions), seq)
                for name, leaf in leaves.items():
                    leaf.index_copy_(0, positions, again[name])
                locked = torch.zeros_like(locked).index_copy_(0, positions, still)
        elif rows.device.type == "cpu" and bool(locked.any()):
            # Without lanes publications run on this thread between gathers, so no row is ever held; the check is
            # free on the CPU and skipped on CUDA (it would wait for the copy).
            raise RuntimeError(f"gather: {int(locked.sum())} rows held by a publication (none may run concurrently)")
        for leaf in leaves.values():
            leaf.requires_grad_(True)
        self.memory.add(sum(tensor_bytes(leaf) for leaf in leaves.values()), "leaves")
        return leaves, rereads

    def release(self, leaves: dict[str, Tensor]) -> None:
        """End a task's leaves and the gradients autograd put in them: account them and drop them from ``leaves``.

        Emptying the dict drops the runtime's references, so the rows are freed here (once the renderer holds
        none) rather than when the caller lets go of its :class:`Read`, after re-runs and publications.
        """
        grads = sum(tensor_bytes(leaf.grad) for leaf in leaves.values() if leaf.grad is not None)
        self.memory.add(grads, "grads")
        self.memory.add(-grads, "grads")
        self.memory.add(-sum(tensor_bytes(leaf) for leaf in leaves.values()), "leaves")
        leaves.clear()

    def declare(self, key: TaskKey, candidate: Tensor) -> None:
        """Record that task ``key`` read ``candidate`` (sorted int64 [M]) in its step's slot."""
        slot = self.open(key[0])
        if key in slot.candidates:
            slot.superseded.append(slot.candidates[key])
        slot.candidates[key] = candidate
        slot.changed()
        self.memory.add(tensor_bytes(candidate), "candidates")

    def stage(self, key: TaskKey, update: SparseUpdate) -> None:
        """Stage task ``key``'s active rows, gradients and statistics (replacing an earlier attempt of the task)."""
        slot = self.open(key[0])
        if key in slot.staged:
            self.memory.add(-slot.staged[key].nbytes, "staged")
        slot.staged[key] = update
        slot.changed()
        self.memory.add(update.nbytes, "staged")

    def stage_task(
        self, key: TaskKey, candidate: Tensor, leaves: dict[str, Tensor], active: Tensor | None, stats: tuple = ()
    ) -> Tensor:
        """Stage a task's active set after backward and free its leaves; returns A(t), the rows staged.

        Args:
            key: the task.
            candidate: its C(t), sorted int64 [M] (the rows of ``leaves``).
            leaves: per name, its gathered leaves [M, ...] with their gradients.
            active: which rows of C(t) are in A(t), bool [M] (or their positions, sorted int64 [A]): the rows staged,
                with their gradient rows; None: the rows with a non-zero gradient (the op ``stage_rows`` finds them).
            stats: the task's statistics (none, or one dict).

        With ``measure_norms`` the staged update carries its gradients' squared norms (``SparseUpdate.sq_norms``),
        which the adaptive batch rule sums over a step's tasks.
        """
        grads = {name: leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for name, leaf in leaves.items()}
        rows, staged = ops.stage_rows(candidate, grads, active)
        self.stage(key, SparseUpdate(rows, staged, stats, squared_norms(staged) if self.measure_norms else None))
        self.release(leaves)
        return rows

    def local_update(self, step: int, worker: int, template: dict[str, Tensor]) -> SparseUpdate:
        """A worker's contribution to ``step``: its staged updates summed (statistics listed) in task order (the
        kernel op ``scatter_in_order``); empty for a worker with no task in the step."""
        slot = self.slot(step)
        keys = sorted(k for k in slot.staged if k[1] == worker)
        return ops.scatter_in_order([slot.staged[k] for k in keys], template)

    def free(self, step: int) -> RingSlot:
        """Release the slot of a published step and return what it held."""
        slot = self.slot(step)
        if slot is None:
            raise RuntimeError(f"no ring slot holds step {step}")
        self.memory.add(-sum(update.nbytes for update in slot.staged.values()), "staged")
        declared = [*slot.candidates.values(), *slot.superseded]
        self.memory.add(-sum(tensor_bytes(rows) for rows in declared), "candidates")
        self.slots[step % self.ring_slots] = None
        return slot

    def memory_report(self, params: dict[str, Tensor]) -> dict[str, int]:
        """Peak and current bytes of gathered plus staged tensors, the peak's make-up (``peak_{kind}_bytes`` for
        kind in :data:`MEMORY_KINDS`: they sum to the peak), and the bytes of the model ``params``."""
        meter = self.memory
        return {
            "peak_extra_bytes": meter.peak,
            "current_extra_bytes": meter.current,
            "model_bytes": model_bytes(params),
            **{f"peak_{kind}_bytes": meter.at_peak.get(kind, 0) for kind in MEMORY_KINDS},
        }


def model_bytes(params: dict[str, Tensor]) -> int:
    """Bytes of the model's parameters (the yardstick for the Shadow Graph's extra memory)."""
    return sum(tensor_bytes(p) for p in params.values())
