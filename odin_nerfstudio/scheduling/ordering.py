"""The epoch's algorithm, step by step: group views along RLG edges, order the groups (greedy chain, then 2-opt
untangling), and assign each step's views to workers by longest processing time first.

Pure functions on the RLG's sparse weights and numpy arrays; :mod:`odin_nerfstudio.scheduling.schedule` explains the
algorithm, its complexity and what it optimizes, and composes these into a seeded per-epoch schedule.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

UNTANGLE_MAX_GROUPS = 2048
"""Largest epoch, in groups, that :func:`untangle` improves (its dense G x G weights: 32 MiB at the limit)."""
_UNTANGLE_MAX_PASSES = 64
_UNTANGLE_MIN_GAIN = 1e-12
_SCAN_CHUNK = 32


def grow_groups(
    weights: sp.csr_matrix, order: np.ndarray, size: int, bounds: np.ndarray | None = None
) -> list[np.ndarray]:
    """Partition the views into groups of ``size`` (the last one shorter) grown along strong RLG edges.

    Args:
        weights: RLG weights [V, V] (CSR).
        order: a permutation of the views [V]; seeds are taken from it in turn.
        size: S, views per group.
        bounds: cuts of ``order`` into bands [bands + 1] (0 first, V last; see ``balance.cost_bands``): a group
            holds views of one band only, grown along the edges between them. None: one band.

    Returns:
        ceil(V / S) int64 arrays of view indices (bands in turn).
    """
    indptr, indices, data = weights.indptr, weights.indices, weights.data
    taken = np.ones(len(order), dtype=bool)  # assigned, or outside the band being grown
    bounds = np.array([0, len(order)]) if bounds is None else bounds
    groups = []
    for low, high in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        taken[order[low:high]] = False
        cursor = low
        for start in range(low, high, size):
            members = np.empty(min(size, high - start), dtype=np.int64)
            frontier, strength = indices[:0], data[:0]
            for slot in range(members.size):
                if frontier.size:
                    strength = np.where(taken[frontier], -1.0, strength)
                    best = int(strength.argmax())
                if frontier.size and strength[best] > 0:
                    view = int(frontier[best])
                else:
                    cursor = _next_unassigned(order, taken, cursor)
                    view = int(order[cursor])
                taken[view] = True
                members[slot] = view
                row = slice(indptr[view], indptr[view + 1])
                frontier = np.concatenate((frontier, indices[row]))
                strength = np.concatenate((strength, data[row]))
            groups.append(members)
    return groups


def _next_unassigned(order: np.ndarray, taken: np.ndarray, cursor: int) -> int:
    """First position >= cursor of ``order`` whose view is not taken (one exists)."""
    while taken[order[cursor]]:
        cursor += 1
    return cursor


def order_groups(
    weights: sp.csr_matrix, groups: Sequence[np.ndarray], size: int, ring_size: int, rng: np.random.Generator
) -> list[int]:
    """Order groups so each has little RLG weight to its predecessors; a short last group stays last.

    Returns:
        a permutation of range(len(groups)).
    """
    cross = group_weights(weights, groups)
    movable = len(groups) - (len(groups[-1]) < size)
    priority = rng.permutation(movable)
    rank = np.empty(movable, dtype=np.int64)
    rank[priority] = np.arange(movable)
    used = np.zeros(movable, dtype=bool)
    blocked_at = np.full(movable, -1, dtype=np.int64)
    recent: deque[int] = deque(maxlen=ring_size)
    sequence, pointer = [], 0
    for t in range(movable):
        for group in recent:
            neighbours = cross.indices[cross.indptr[group] : cross.indptr[group + 1]]
            blocked_at[neighbours[neighbours < movable]] = t
        pick = _first_free(priority, used, blocked_at, t, pointer)
        if pick < 0:
            pick = _least_conflicting(cross, recent, np.flatnonzero(~used), rank)
        used[pick] = True
        sequence.append(pick)
        recent.appendleft(pick)
        while pointer < movable and used[priority[pointer]]:
            pointer += 1
    return sequence + list(range(movable, len(groups)))


def untangle(weights: sp.csr_matrix, groups: Sequence[np.ndarray], order: Sequence[int], size: int) -> list[int]:
    """2-opt on a chain of groups: reverse runs while that lowers the conflict mass between consecutive steps.

    Reversing positions i..j of the chain replaces the pairs (before i, i) and (j, after j) with (before i, j)
    and (i, after j); every pair inside the run stays a pair. Each pass tries, for every i, the best j and
    applies it if it gains; passes repeat until none gains (at most ``_UNTANGLE_MAX_PASSES``). The short last
    group (fewer than ``size`` views) stays last but its pair with its predecessor counts. A chain with no
    conflict mass, or longer than ``UNTANGLE_MAX_GROUPS``, is returned as is. Deterministic.

    Args:
        weights: RLG weights [V, V] (CSR).
        groups: the groups' views (their lengths tell a short last group).
        order: the chain, a permutation of range(G) with a short last group last.
        size: S, views of a full group.

    Returns:
        the improved chain, a permutation of range(G) with the same last group if it is short.
    """
    chain = np.asarray(order, dtype=np.int64)
    movable = len(chain) - (len(groups[chain[-1]]) < size) if len(chain) else 0
    if movable < 2 or len(chain) > UNTANGLE_MAX_GROUPS:
        return chain.tolist()
    dense = group_weights(weights, groups).toarray()
    if dense[chain[:-1], chain[1:]].sum() <= 0:
        return chain.tolist()
    for _ in range(_UNTANGLE_MAX_PASSES):
        gained = False
        for i in range(movable - 1):
            ends = chain[i + 1 : movable]
            after = np.append(chain[i + 2 : movable], chain[movable] if movable < len(chain) else -1)
            has_after = after >= 0
            after = np.maximum(after, 0)
            first = chain[i]
            old_in = dense[chain[i - 1], first] if i > 0 else 0.0
            new_in = dense[chain[i - 1], ends] if i > 0 else np.zeros(ends.size)
            old_out = np.where(has_after, dense[ends, after], 0.0)
            new_out = np.where(has_after, dense[first, after], 0.0)
            gain = old_in + old_out - new_in - new_out
            best = int(np.argmax(gain))
            if gain[best] > _UNTANGLE_MIN_GAIN:
                j = i + 1 + best
                chain[i : j + 1] = chain[i : j + 1][::-1].copy()
                gained = True
        if not gained:
            break
    return chain.tolist()


def group_weights(weights: sp.csr_matrix, groups: Sequence[np.ndarray]) -> sp.csr_matrix:
    """Summed RLG weight between every two groups, CSR [G, G] with zero diagonal: M.T @ W @ M."""
    group_of = group_of_views(groups, weights.shape[0])
    membership = sp.csr_matrix(
        (np.ones(weights.shape[0]), (np.arange(weights.shape[0]), group_of)), shape=(weights.shape[0], len(groups))
    )
    cross = (membership.T @ weights @ membership).tocsr()
    cross.setdiag(0)
    cross.eliminate_zeros()
    return cross


def _first_free(priority: np.ndarray, used: np.ndarray, blocked_at: np.ndarray, t: int, pointer: int) -> int:
    """First group in priority order from ``pointer`` that is unused and not blocked at time t, or -1."""
    chunk = _SCAN_CHUNK
    while pointer < priority.size:
        candidates = priority[pointer : pointer + chunk]
        free = ~used[candidates] & (blocked_at[candidates] != t)
        if free.any():
            return int(candidates[np.argmax(free)])
        pointer += chunk
        chunk *= 2
    return -1


def _least_conflicting(cross: sp.csr_matrix, recent: deque[int], remaining: np.ndarray, rank: np.ndarray) -> int:
    """Remaining group with least weight to the previous group, then to the earlier recent ones, then rank."""
    previous = cross[recent[0]].toarray().ravel()[remaining]
    earlier = sum((cross[g].toarray().ravel()[remaining] for g in list(recent)[1:]), np.zeros(remaining.size))
    return int(remaining[np.lexsort((rank[remaining], earlier, previous))[0]])


def assign_lpt(
    views: np.ndarray, cost: np.ndarray, num_workers: int, quota: int, carried: Sequence[float] | None = None,
    first: int = 0,
) -> tuple[tuple[tuple[int, ...], ...], tuple[float, ...]]:
    """Longest-processing-time-first: views by decreasing cost to the worker with the least cost in this step that
    holds fewer than ``quota`` views.

    Ties between workers of equal step cost (all of them for the step's first W views) go to the one with the
    least ``carried`` cost (its cost in the epoch's earlier steps; zeros when None), so the costliest view of a
    step goes to the worker that has had least to do, not always to worker 0; then to the worker after
    ``first - 1`` in index order (``first``, ``first + 1``, ..., wrapping). Returns per-worker view tuples [W] and
    the step's own loads [W] (without ``carried``).
    """
    start = list(carried) if carried is not None else [0.0] * num_workers
    ranked = views[np.argsort(-cost[views], kind="stable")].tolist()
    heap = [(0.0, start[worker], (worker - first) % num_workers, worker) for worker in range(num_workers)]
    heapq.heapify(heap)
    tasks: list[list[int]] = [[] for _ in range(num_workers)]
    loads = [0.0] * num_workers
    for view in ranked:
        load, before, tie, worker = heapq.heappop(heap)
        tasks[worker].append(view)
        loads[worker] = load + float(cost[view])
        if len(tasks[worker]) < quota:
            heapq.heappush(heap, (loads[worker], before, tie, worker))
    return tuple(tuple(t) for t in tasks), tuple(loads)


def conflict_by_lag(
    edges: tuple[np.ndarray, np.ndarray, np.ndarray], step_of: np.ndarray, num_steps: int, max_lag: int
) -> np.ndarray:
    """Conflict mass between each step and the steps 1..max_lag before it, [num_steps, max_lag].

    Args:
        edges: the RLG's upper-triangle edges (rows [E], cols [E], weights [E]).
        step_of: step of every view [V].
    """
    rows, cols, weight = edges
    a, b = step_of[rows], step_of[cols]
    lag = np.abs(a - b)
    near = (lag >= 1) & (lag <= max_lag)
    slot = np.maximum(a, b)[near] * max_lag + lag[near] - 1
    return np.bincount(slot, weights=weight[near], minlength=num_steps * max_lag).reshape(num_steps, max_lag)


def group_of_views(groups: Sequence[np.ndarray], num_views: int) -> np.ndarray:
    """Group index of every view [V] for groups that partition range(num_views)."""
    step_of = np.empty(num_views, dtype=np.int64)
    step_of[np.concatenate(groups)] = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    return step_of
