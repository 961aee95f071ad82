"""RAW / WAW / WAR checks and the per-primitive tables, against plain-Python set references (property tests)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from odin_nerfstudio.core.conflicts import NO_STEP, StepRows, as_rows, isin_sorted, raw, war, waw
from odin_nerfstudio.core.tables import PrimitiveTables, index_map_from_uid, remap, remap_row_sets

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 40
row_sets = st.sets(st.integers(0, N - 1), max_size=N)
step_writes = st.lists(st.tuples(st.integers(0, 8), row_sets), max_size=5, unique_by=lambda t: t[0])


def rows_of(values: set[int]) -> torch.Tensor:
    return torch.tensor(sorted(values), dtype=torch.int64)


def mask_of(values: set[int]) -> torch.Tensor:
    mask = torch.zeros(N, dtype=torch.bool)
    mask[rows_of(values)] = True
    return mask


def reference(rows: set[int], others: list[tuple[int, set[int]]], keep) -> dict[int, tuple[int, int]]:
    """Row -> (latest, earliest) step among ``others`` that hold it and pass ``keep``."""
    out: dict[int, tuple[int, int]] = {}
    for row in rows:
        steps = [step for step, other in others if keep(step) and row in other]
        if steps:
            out[row] = (max(steps), min(steps))
    return out


def as_dict(conflicts) -> dict[int, tuple[int, int]]:
    return {
        int(r): (int(last), int(first))
        for r, last, first in zip(conflicts.rows, conflicts.last_step, conflicts.first_step, strict=True)
    }


@settings(max_examples=60, deadline=None)
@given(candidate=row_sets, reader=st.integers(0, 9), writes=step_writes, use_mask=st.booleans())
def test_raw_matches_reference(candidate, reader, writes, use_mask) -> None:
    unpublished = [StepRows(step, mask_of(rows) if use_mask else rows_of(rows)) for step, rows in writes]
    got = raw(mask_of(candidate) if use_mask else rows_of(candidate), reader, unpublished)
    expected = reference(candidate, writes, lambda step: step < reader)
    assert as_dict(got) == expected
    assert got.any == bool(expected)
    assert got.wait_step == (max(last for last, _ in expected.values()) if expected else NO_STEP)
    assert torch.equal(got.rows, torch.sort(got.rows).values)


@settings(max_examples=40, deadline=None)
@given(written=row_sets, writer=st.integers(0, 9), writes=step_writes)
def test_waw_matches_reference(written, writer, writes) -> None:
    got = waw(rows_of(written), writer, [StepRows(step, rows_of(rows)) for step, rows in writes])
    assert as_dict(got) == reference(written, writes, lambda step: step < writer)


@settings(max_examples=40, deadline=None)
@given(written=row_sets, writer=st.integers(0, 9), reads=step_writes)
def test_war_matches_reference(written, writer, reads) -> None:
    got = war(mask_of(written), writer, [StepRows(step, rows_of(rows)) for step, rows in reads])
    assert as_dict(got) == reference(written, reads, lambda step: step <= writer)


@settings(max_examples=40, deadline=None)
@given(a=st.lists(st.integers(0, N - 1), max_size=30), b=row_sets)
def test_isin_sorted_and_as_rows(a, b) -> None:
    rows = torch.tensor(a, dtype=torch.int64)
    assert torch.equal(isin_sorted(rows, rows_of(b)), torch.isin(rows, rows_of(b)))
    assert torch.equal(as_rows(rows), torch.unique(rows))
    assert torch.equal(as_rows(mask_of(b)), rows_of(b))


@settings(max_examples=40, deadline=None)
@given(
    n_old=st.integers(1, 20),
    data=st.data(),
)
def test_remap_carries_every_table(n_old, data) -> None:
    index_map = torch.tensor(data.draw(st.lists(st.integers(-1, n_old - 1), max_size=30)), dtype=torch.int64)
    tables = PrimitiveTables.create(n_old)
    tables.versions = torch.arange(n_old) * 3
    tables.published_step = torch.arange(n_old) % 5
    new = remap(tables, index_map)
    for new_row, old_row in enumerate(index_map.tolist()):
        if old_row < 0:
            assert (new.versions[new_row], new.pending_step[new_row], new.published_step[new_row]) == (0, -1, -1)
        else:
            assert new.versions[new_row] == tables.versions[old_row]
            assert new.published_step[new_row] == tables.published_step[old_row]
            assert new.pending_step[new_row] == NO_STEP
    assert new.num_primitives == index_map.numel()


@settings(max_examples=40, deadline=None)
@given(n_old=st.integers(1, 20), data=st.data())
def test_remap_row_sets_keeps_the_children_of_each_set(n_old, data) -> None:
    """A row set carried through a structural change holds exactly the new rows whose parent was in it."""
    index_map = torch.tensor(data.draw(st.lists(st.integers(-1, n_old - 1), max_size=30)), dtype=torch.int64)
    sets = [rows_of(data.draw(st.sets(st.integers(0, n_old - 1)))) for _ in range(3)]
    for rows, carried in zip(sets, remap_row_sets(sets, index_map), strict=True):
        expected = [new for new, old in enumerate(index_map.tolist()) if old in set(rows.tolist())]
        assert carried.tolist() == expected


def test_remap_refuses_pending_writes() -> None:
    tables = PrimitiveTables.create(5)
    tables.declare(torch.tensor([2]), step=7)
    with pytest.raises(RuntimeError, match="drain barrier"):
        tables.remap(torch.tensor([0, 1, 2]))
    assert tables.remap(torch.tensor([0, 1, 3])).num_primitives == 3


def test_publish_clears_pending_marks_up_to_its_step() -> None:
    tables = PrimitiveTables.create(4)
    tables.declare(torch.tensor([0, 1]), step=3)
    tables.declare(torch.tensor([1, 2]), step=4)
    tables.publish(torch.tensor([1]), declared=torch.tensor([0, 1]), step=3)
    assert tables.pending_step.tolist() == [-1, 4, 4, -1]
    assert tables.versions.tolist() == [0, 1, 0, 0]
    assert tables.published_step.tolist() == [-1, 3, -1, -1]


def test_index_map_from_gsplat_uid_column() -> None:
    assert index_map_from_uid(torch.tensor([1, 2, 3, 1])).tolist() == [1, 2, 3, 1]
