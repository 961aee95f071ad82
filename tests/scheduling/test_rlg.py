"""Relative Locality Graph: exact Jaccard against brute force, sparse structure, stats, scale; the city generator."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odin_nerfstudio.scenes.citygen import CityConfig, city_point_sets, object_point_sets, street_point_sets
from odin_nerfstudio.scheduling.rlg import RelativeLocalityGraph
from odin_nerfstudio.scheduling.tracks import read_colmap_tracks


def brute_force_jaccard(point_sets: list[np.ndarray]) -> np.ndarray:
    """Dense [V, V] Jaccard of Python sets, zero diagonal and 0 for two empty sets."""
    sets = [set(np.asarray(s).tolist()) for s in point_sets]
    dense = np.zeros((len(sets), len(sets)))
    for i, a in enumerate(sets):
        for j, b in enumerate(sets):
            if i != j and a | b:
                dense[i, j] = len(a & b) / len(a | b)
    return dense


def assert_well_formed(rlg: RelativeLocalityGraph, point_sets: list[np.ndarray]) -> None:
    """Symmetric, zero diagonal, canonical CSR with no explicit zeros, stats consistent with the weights."""
    weights = rlg.weights
    assert weights.shape == (len(point_sets),) * 2
    assert weights.has_canonical_format
    assert np.all(weights.data > 0)
    assert np.all(weights.diagonal() == 0)
    assert (weights != weights.T).nnz == 0
    np.testing.assert_array_equal(rlg.num_points, [len(set(np.asarray(s).tolist())) for s in point_sets])
    np.testing.assert_array_equal(rlg.degree, (weights.toarray() > 0).sum(axis=1))
    np.testing.assert_allclose(rlg.weighted_degree, weights.toarray().sum(axis=1))


def test_real_scene_equals_brute_force(any_real_scene: Path) -> None:
    """On fern, fountain_p11 and kermit the sparse RLG equals brute-force Jaccard exactly."""
    point_sets = read_colmap_tracks(any_real_scene / "sparse" / "0").point_ids
    rlg = RelativeLocalityGraph.from_point_sets(point_sets)
    np.testing.assert_array_equal(rlg.weights.toarray(), brute_force_jaccard(point_sets))
    assert_well_formed(rlg, point_sets)
    assert rlg.num_edges > 0


point_set_lists = st.lists(st.lists(st.integers(0, 40), max_size=15), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(point_set_lists, st.sampled_from([0, -1000, 10**12]))
def test_random_point_sets_equal_brute_force(sets: list[list[int]], shift: int) -> None:
    """Any ids (duplicates, negative, huge), any empty views: exact Jaccard and consistent stats."""
    point_sets = [np.array(s, dtype=np.int64) + shift for s in sets]
    rlg = RelativeLocalityGraph.from_point_sets(point_sets)
    np.testing.assert_array_equal(rlg.weights.toarray(), brute_force_jaccard(point_sets))
    assert_well_formed(rlg, point_sets)


@pytest.mark.parametrize("shared", [126, 127, 128, 255, 256, 32767, 32768])
def test_narrow_counts_do_not_overflow(shared: int) -> None:
    """The co-observation counts use the narrowest integer type that holds the longest row: two views sharing
    ``shared`` points (at the int8 and int16 limits, with duplicates) still get their exact Jaccard."""
    common = np.arange(shared, dtype=np.int64)
    point_sets = [np.concatenate([common, common[:3], [10**6]]), np.concatenate([common, [10**6 + 1, 10**6 + 2]])]
    rlg = RelativeLocalityGraph.from_point_sets(point_sets)
    assert rlg.weights[0, 1] == shared / (shared + 3)
    np.testing.assert_array_equal(rlg.num_points, [shared + 1, shared + 2])
    identical = RelativeLocalityGraph.from_point_sets([common, common, common[: shared // 2]])
    np.testing.assert_array_equal(identical.weights.toarray()[0], [0.0, 1.0, (shared // 2) / shared])


def test_city_int32_ids_equal_brute_force() -> None:
    """The city generator's int32 ids (views into one buffer) give the brute-force Jaccard exactly."""
    point_sets = city_point_sets(CityConfig(num_views=300, seed=4)).point_sets
    assert point_sets[0].dtype == np.int32
    rlg = RelativeLocalityGraph.from_point_sets(point_sets)
    np.testing.assert_array_equal(rlg.weights.toarray(), brute_force_jaccard(point_sets))
    assert_well_formed(rlg, point_sets)
    assert rlg.num_edges > 300


def test_isolated_views_have_degree_zero() -> None:
    """Views without tracks, or sharing none, are isolated nodes."""
    point_sets = [np.array([1, 2]), np.array([], np.int64), np.array([2, 3]), np.array([9])]
    rlg = RelativeLocalityGraph.from_point_sets(point_sets)
    np.testing.assert_array_equal(rlg.degree, [1, 0, 1, 0])
    np.testing.assert_array_equal(rlg.weighted_degree, [1 / 3, 0, 1 / 3, 0])
    assert rlg.num_edges == 1


def test_no_views_and_non_integer_ids_are_rejected() -> None:
    """An empty view list or float ids are ValueErrors."""
    with pytest.raises(ValueError, match="at least one view"):
        RelativeLocalityGraph.from_point_sets([])
    with pytest.raises(ValueError, match="integers"):
        RelativeLocalityGraph.from_point_sets([np.array([1.0, 2.0])])


def test_fingerprint_tells_graphs_apart() -> None:
    """Same point sets give the same fingerprint; another view order gives another."""
    sets = street_point_sets(30)
    same = RelativeLocalityGraph.from_point_sets([s.copy() for s in sets]).fingerprint()
    assert RelativeLocalityGraph.from_point_sets(sets).fingerprint() == same
    assert RelativeLocalityGraph.from_point_sets(sets[::-1]).fingerprint() != same


def test_street_memory_grows_with_edges_not_views_squared() -> None:
    """20,000 street views: numpy memory stays far below a dense V x V float array (3.2 GB)."""
    point_sets = street_point_sets(20_000)
    tracemalloc.start()
    rlg = RelativeLocalityGraph.from_point_sets(point_sets)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100e6
    assert rlg.degree.max() <= 2 * 40 // 4


def test_street_and_object_overlap_regimes() -> None:
    """The street's RLG is a band (neighbours only); the object's is complete."""
    street = RelativeLocalityGraph.from_point_sets(street_point_sets(100, window=40, stride=4))
    rows, cols = street.weights.nonzero()
    assert np.abs(rows - cols).max() < 10
    dense = RelativeLocalityGraph.from_point_sets(object_point_sets(30))
    assert np.all(dense.degree == 29)


def test_city_generator_shape() -> None:
    """A small city: exact view count, sorted unique ids, mean track length about 6, no empty view."""
    city = city_point_sets(CityConfig(num_views=3001, seed=1))
    assert len(city.point_sets) == 3001
    assert city.camera_positions.shape == (3001, 3) and city.camera_headings.shape == (3001,)
    assert all(np.all(np.diff(ids) > 0) for ids in city.point_sets)
    observed = np.concatenate(city.point_sets)
    assert observed.min() == 0 and observed.max() == city.num_points - 1
    assert np.all(np.bincount(observed) >= 2)
    assert 5.0 < city.mean_track_length < 8.0
    assert min(len(ids) for ids in city.point_sets) > 0
    rlg = RelativeLocalityGraph.from_point_sets(city.point_sets)
    assert 5 < rlg.degree.mean() < 40
