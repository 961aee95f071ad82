"""Relative Locality Graph (RLG): how strongly two training views are predicted to touch the same Gaussians.

Odin (arXiv 2607.19893) schedules training from a graph whose nodes are the training views and whose edge
(i, j) weighs the Jaccard similarity |P_i n P_j| / |P_i u P_j| of the SfM point sets P_i, P_j the two views
observe. Tracks are available before training, stable across it, and predict primitive-level conflicts better
than camera geometry does. The graph takes any per-view point sets: odin-splat's default gives each view its
observed points plus the SfM points in its field of view (``SfMTracks.for_names(..., "in-view")``), because a
view draws, and so writes, far content that SfM never matched in it.

Built sparsely: a CSR views x points incidence matrix A [V, P] gives every intersection at once through the
sparse product A @ A.T (Gustavson's row-by-row algorithm in scipy), and the unions follow from the row counts,
|P_i u P_j| = |P_i| + |P_j| - |P_i n P_j|. Time and memory grow with the sum over points of their squared
track length (with in-view sets: the number of views each point is in view of) plus the number of co-observing
view pairs; no dense V x V array is ever formed.

A view with no tracks is an isolated node: degree 0, weighted degree 0, no edges (the Jaccard of two empty sets
is taken as 0, since they share no primitive that could conflict).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

# Point ids are used as columns directly while the id range stays within this multiple of the observation count;
# beyond it they are first compressed with np.unique (a sort of all observations).
_DIRECT_ID_SLACK = 4


@dataclass(frozen=True, eq=False)
class RelativeLocalityGraph:
    """Sparse symmetric Jaccard graph over V training views, with per-view statistics.

    Attributes:
        weights: Jaccard weights, symmetric ``scipy.sparse.csr_matrix`` [V, V] float64, zero diagonal, only
            the co-observing pairs stored, column indices sorted within each row.
        num_points: observed SfM points per view, |P_i|, [V] int64.
        degree: number of views sharing at least one point with each view, [V] int64.
        weighted_degree: sum of each view's edge weights, [V] float64.
    """

    weights: sp.csr_matrix
    num_points: np.ndarray
    degree: np.ndarray
    weighted_degree: np.ndarray

    @classmethod
    def from_point_sets(cls, point_sets: Sequence[np.ndarray]) -> RelativeLocalityGraph:
        """Build the RLG from each view's observed point ids (any integer ids; duplicates are ignored).

        Args:
            point_sets: V integer arrays, view i's SfM point ids [n_i] (as ``SfMTracks.for_names``).
        """
        incidence = incidence_matrix(point_sets)
        weights = jaccard_weights(incidence)
        return cls(
            weights=weights,
            num_points=np.diff(incidence.indptr).astype(np.int64),
            degree=np.diff(weights.indptr).astype(np.int64),
            weighted_degree=np.asarray(weights.sum(axis=1)).ravel(),
        )

    @property
    def num_views(self) -> int:
        """Number of views V."""
        return self.weights.shape[0]

    @property
    def num_edges(self) -> int:
        """Number of undirected edges (co-observing view pairs)."""
        return self.weights.nnz // 2

    def summary(self) -> dict[str, float]:
        """Views, edges, mean and max edge weight, isolated views (no edge) and mean degree."""
        weights = self.weights.data
        return {
            "views": self.num_views,
            "edges": self.num_edges,
            "mean_weight": float(weights.mean()) if weights.size else 0.0,
            "max_weight": float(weights.max()) if weights.size else 0.0,
            "isolated_views": int(np.count_nonzero(self.degree == 0)),
            "mean_degree": float(self.degree.mean()),
        }

    def fingerprint(self) -> str:
        """SHA-256 of the graph (structure, weights, point counts): identifies it in a saved schedule."""
        digest = hashlib.sha256()
        for array in (self.weights.indptr, self.weights.indices):
            digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(self.weights.data, dtype=np.float64).tobytes())
        digest.update(np.ascontiguousarray(self.num_points, dtype=np.int64).tobytes())
        return digest.hexdigest()


def incidence_matrix(point_sets: Sequence[np.ndarray]) -> sp.csr_matrix:
    """Binary views x points incidence matrix A [V, P'] (CSR, canonical) of the given point sets.

    Columns are the point ids themselves when they are non-negative and not much sparser than the observations,
    else the ranks of the distinct ids; either way only equality of ids matters to the RLG. Lean at city scale
    (300M observations): int32 indices whenever they fit, the ids copied once (int32 ids stay int32), and ones of
    the narrowest integer type that holds any intersection of two rows (at most the longest row), which is the
    type of the co-observation counts A @ A.T.
    """
    if len(point_sets) == 0:
        raise ValueError("the RLG needs at least one view; got an empty list of point sets")
    counts = np.fromiter((len(ids) for ids in point_sets), dtype=np.int64, count=len(point_sets))
    ids = np.concatenate([np.asarray(s).ravel() for s in point_sets]) if counts.sum() else np.zeros(0, np.int64)
    if ids.dtype.kind not in "iu":
        raise ValueError(f"point ids must be integers, got dtype {ids.dtype}")
    columns, num_columns = _point_columns(ids)
    del ids
    indptr = np.zeros(len(point_sets) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    index_dtype = np.int32 if max(num_columns, len(columns)) < np.iinfo(np.int32).max else np.int64
    count_dtype = np.min_scalar_type(-int(counts.max()) - 1)
    incidence = sp.csr_matrix(
        (np.ones(len(columns), dtype=count_dtype), columns.astype(index_dtype, copy=False), indptr.astype(index_dtype)),
        shape=(len(point_sets), num_columns),
    )
    incidence.sum_duplicates()
    incidence.data[:] = 1
    return incidence


def _point_columns(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Column index per observation [N] and column count for raw point ids [N]."""
    if len(ids) == 0:
        return ids.astype(np.int64), 0
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < _DIRECT_ID_SLACK * len(ids) + 1024:
        return ids, high + 1
    distinct, columns = np.unique(ids, return_inverse=True)
    return columns.ravel(), len(distinct)


def jaccard_weights(incidence: sp.csr_matrix) -> sp.csr_matrix:
    """Jaccard similarity of the rows of a binary incidence matrix [V, P], as a CSR [V, V] with zero diagonal.

    One transpose (the tracks, points x views, sharing the ones of ``incidence``) and one sparse product; the
    product [V, V] holds only co-observing pairs (tens per view), so it is small beside the incidence.
    """
    sizes = np.diff(incidence.indptr).astype(np.int64)
    tracks = incidence.T.tocsr()
    tracks.data = incidence.data
    intersections = incidence @ tracks
    del tracks
    intersections.sort_indices()
    rows = np.repeat(np.arange(incidence.shape[0], dtype=np.int64), np.diff(intersections.indptr))
    cols = intersections.indices
    off_diagonal = rows != cols
    rows, cols = rows[off_diagonal], cols[off_diagonal]
    shared = intersections.data[off_diagonal].astype(np.float64)
    weights = shared / (sizes[rows] + sizes[cols] - shared)
    indptr = np.zeros(incidence.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=incidence.shape[0]), out=indptr[1:])
    return sp.csr_matrix((weights, cols, indptr.astype(cols.dtype)), shape=(incidence.shape[0], incidence.shape[0]))
