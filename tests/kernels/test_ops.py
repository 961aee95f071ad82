"""Every compiled op equals its pure-torch reference bit for bit on random inputs (CPU here, CUDA on a GPU).

Hypothesis draws the sizes (empty sets included), the duplicates where an op allows them, the cameras and the write
sets; a separate test runs each op on N = 2^24 + 7 rows, past float32's exact integers and a 2^24-element block.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from odin_nerfstudio.core.camera import Camera
from odin_nerfstudio.core.conflicts import StepRows
from odin_nerfstudio.core.selective_adam import SelectiveAdam
from odin_nerfstudio.core.sparse import SparseUpdate
from odin_nerfstudio.core.tables import PrimitiveTables
from odin_nerfstudio.culling.candidates import BoundingSpheres, CullRegion
from odin_nerfstudio.kernels import ops
from tests.kernels.conftest import (
    DEVICES,
    clone_model,
    make_model,
    random_camera,
    random_rows,
    require_compiled,
    same_model,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _scene(generator: torch.Generator, num_rows: int, device: str) -> BoundingSpheres:
    """Bounds of random Gaussians (a few NaN rows when N > 8), with the index built and then loosened by updates."""
    means = 4.0 * torch.randn(num_rows, 3, generator=generator)
    scales = 0.3 * torch.rand(num_rows, 3, generator=generator)
    if num_rows > 8:
        means[torch.randint(0, num_rows, (2,), generator=generator)] = float("nan")
    bounds = BoundingSpheres.of(means.to(device), scales.to(device))
    if num_rows:
        bounds.index()
        moved = random_rows(generator, num_rows, num_rows // 4, device)
        bounds.update(moved, (means[moved.cpu()] + 0.5).to(device), (2.0 * scales[moved.cpu()]).to(device))
    return bounds


def _gradient(generator: torch.Generator, rows: torch.Tensor, param: torch.Tensor, device: str) -> torch.Tensor:
    """A random gradient [M, ...] for ``rows`` [M] of ``param`` [N, ...]."""
    return torch.randn(rows.numel(), *param.shape[1:], generator=generator).to(device)


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(num_rows=st.integers(0, 700), seed=st.integers(0, 2**31 - 1), sets=st.integers(0, 4), as_mask=st.booleans())
def test_cull_conflicts_equals_reference(device: str, num_rows: int, seed: int, sets: int, as_mask: bool) -> None:
    require_compiled(device)
    generator = torch.Generator().manual_seed(seed)
    bounds = _scene(generator, num_rows, device)
    region = CullRegion.candidates(random_camera(generator), margin=float(torch.rand((), generator=generator)) * 0.3)
    reader_step = 5
    writes = []
    for s in range(sets):
        rows = random_rows(generator, num_rows, int(torch.randint(0, num_rows + 1, (1,), generator=generator)), device)
        if as_mask and s == 0:
            mask = torch.zeros(num_rows, dtype=torch.bool, device=device)
            mask[rows] = True
            rows = mask
        writes.append(StepRows(int(torch.randint(2, 8, (1,), generator=generator)), rows))
    with ops.use_reference():
        want, want_conflicts = ops.cull_conflicts(bounds, region, reader_step, writes)
    got, got_conflicts = ops.cull_conflicts(bounds, region, reader_step, writes)
    assert torch.equal(got, want)
    assert torch.equal(got_conflicts.rows, want_conflicts.rows)
    assert torch.equal(got_conflicts.last_step, want_conflicts.last_step)
    assert torch.equal(got_conflicts.first_step, want_conflicts.first_step)


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(num_rows=st.integers(0, 700), seed=st.integers(0, 2**31 - 1))
def test_cull_rows_equals_rows_in(device: str, num_rows: int, seed: int) -> None:
    """The escape check's and the predictions' cull (a drawable region, no write sets) is ``rows_in`` exactly."""
    require_compiled(device)
    generator = torch.Generator().manual_seed(seed)
    bounds = _scene(generator, num_rows, device)
    region = CullRegion.drawable(random_camera(generator))
    assert torch.equal(ops.cull_rows(bounds, region), bounds.rows_in(region))


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(
    num_rows=st.integers(1, 500), reads=st.integers(0, 800), locked=st.integers(0, 20), seed=st.integers(0, 2**31 - 1)
)
def test_gather_rows_equals_reference(device: str, num_rows: int, reads: int, locked: int, seed: int) -> None:
    require_compiled(device)
    generator = torch.Generator().manual_seed(seed)
    params, _ = make_model(num_rows, seed, device)
    rows = torch.randint(0, num_rows, (reads,), generator=generator).to(device)  # duplicates allowed
    seq = 2 * torch.randint(0, 50, (num_rows,), generator=generator).to(device)
    seq[torch.randint(0, num_rows, (locked,), generator=generator).to(device)] += 1  # rows a publication holds
    with ops.use_reference():
        want = ops.gather_rows(params, rows, seq)
    got = ops.gather_rows(params, rows, seq)
    assert all(torch.equal(got[0][name], want[0][name]) for name in params)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert int(got[2].sum()) == int((seq[rows] & 1).sum())


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(
    num_rows=st.integers(0, 400),
    sparsity=st.floats(0.0, 1.0),
    given=st.sampled_from(["none", "positions", "mask"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_stage_rows_equals_reference(device: str, num_rows: int, sparsity: float, given: str, seed: int) -> None:
    """A task's active rows out of its leaves' gradients: rows with a gradient (a NaN counts, -0.0 does not), or
    the rows the render reports, as positions or as a mask."""
    require_compiled(device)
    generator = torch.Generator().manual_seed(seed)
    params, _ = make_model(num_rows, seed, device)
    candidate = torch.randperm(10 * num_rows + 1, generator=generator)[:num_rows].sort().values.to(device)
    grads = {}
    for name, param in params.items():
        grad = torch.randn(param.shape, generator=generator)
        grad[torch.rand(num_rows, generator=generator) < sparsity] = 0.0
        grads[name] = grad.to(device)
    if num_rows > 2:
        for grad in grads.values():
            grad[0] = 0.0
            grad[1] = -0.0  # only negative zeros: not active
        grads["means"][0, 1] = float("nan")  # only a NaN among zeros: active
    mask = (torch.rand(num_rows, generator=generator) < 0.5).to(device)
    positions = {"none": None, "positions": torch.nonzero(mask).flatten(), "mask": mask}[given]
    with ops.use_reference():
        want_rows, want = ops.stage_rows(candidate, grads, positions)
    got_rows, got = ops.stage_rows(candidate, grads, positions)
    assert torch.equal(got_rows, want_rows)
    for name in params:
        assert torch.equal(got[name].isnan(), want[name].isnan())
        assert torch.equal(torch.nan_to_num(got[name]), torch.nan_to_num(want[name]))
        assert torch.equal(torch.signbit(got[name]), torch.signbit(want[name]))
    if num_rows > 2 and given == "none":
        assert int(candidate[0]) in got_rows.tolist() and int(candidate[1]) not in got_rows.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_stage_rows_rejects_bad_positions(device: str) -> None:
    """A mask of another size than C(t), positions past C(t) (on the CPU) or on another device than C(t) (on CUDA)
    are refused with the reason."""
    require_compiled(device)
    params, _ = make_model(8, 0, device)
    candidate = torch.arange(8, dtype=torch.int64, device=device)
    grads = {name: torch.ones_like(param) for name, param in params.items()}
    with pytest.raises(RuntimeError, match="the active mask must be bool"):
        ops.stage_rows(candidate, grads, torch.ones(7, dtype=torch.bool, device=device))
    if device == "cpu":
        with pytest.raises(RuntimeError, match="position 8 out of range"):
            ops.stage_rows(candidate, grads, torch.tensor([0, 8]))
    else:  # on CUDA a range check would synchronize with the host: the device check runs instead
        with pytest.raises(RuntimeError, match="move them to the rows' device"):
            ops.stage_rows(candidate, grads, torch.tensor([0, 3]))


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(num_rows=st.integers(0, 400), tasks=st.integers(0, 6), seed=st.integers(0, 2**31 - 1))
def test_scatter_in_order_equals_reference(device: str, num_rows: int, tasks: int, seed: int) -> None:
    require_compiled(device)
    generator = torch.Generator().manual_seed(seed)
    params, _ = make_model(num_rows, seed, device)
    updates = []
    for _ in range(tasks):
        rows = random_rows(generator, num_rows, int(torch.randint(0, num_rows + 1, (1,), generator=generator)), device)
        grads = {name: _gradient(generator, rows, p, device) for name, p in params.items()}
        if rows.numel():
            grads["means"][0] = -0.0  # a negative zero: 0 + g turns it positive, a single task keeps it
        updates.append(SparseUpdate(rows, grads))
    with ops.use_reference():
        want = ops.scatter_in_order(updates, params)
    got = ops.scatter_in_order(updates, params)
    assert torch.equal(got.rows, want.rows)
    for name in params:
        assert torch.equal(got.grads[name], want.grads[name])
        assert torch.equal(torch.signbit(got.grads[name]), torch.signbit(want.grads[name]))


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(num_rows=st.integers(0, 400), steps=st.integers(1, 4), seed=st.integers(0, 2**31 - 1), lerp_large=st.booleans())
def test_publish_adam_equals_reference(device: str, num_rows: int, steps: int, seed: int, lerp_large: bool) -> None:
    require_compiled(device)
    generator = torch.Generator().manual_seed(seed)
    reference = make_model(num_rows, seed, device)
    if lerp_large:  # 1 - beta1 >= 0.5 takes lerp's other formula
        for optimizer in reference[1].values():
            optimizer.param_groups[0]["betas"] = (0.3, 0.99)
    compiled = clone_model(*reference)
    seq_ref = torch.zeros(num_rows, dtype=torch.int64, device=device)
    seq = seq_ref.clone()
    for _ in range(steps):
        rows = random_rows(generator, num_rows, int(torch.randint(0, num_rows + 1, (1,), generator=generator)), device)
        grads = {name: _gradient(generator, rows, p, device) for name, p in reference[0].items()}
        priority = rows[torch.rand(rows.numel(), generator=generator).to(device) < 0.3]
        with ops.use_reference():
            ops.publish_adam(reference[1], rows, grads, seq_ref, priority)
        contention = ops.publish_adam(compiled[1], rows, grads, seq, priority)
        assert int(contention) == 0  # one publisher: no row is ever held by another
    assert same_model(compiled, reference)
    assert torch.equal(seq, seq_ref)


@pytest.mark.parametrize("backend", ["reference", "compiled"])
@SETTINGS
@given(num_rows=st.integers(0, 200), steps=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_publish_adam_in_two_parts_equals_the_whole(backend: str, num_rows: int, steps: int, seed: int) -> None:
    """Priority publication: a step published as "first" (some rows) then "rest" (the others) gives every row,
    moment, version and step count the bits of one "whole" publication, and runs the step's post-hooks once."""
    if backend == "compiled":
        require_compiled("cpu")
    generator = torch.Generator().manual_seed(seed)
    whole = make_model(num_rows, seed, "cpu")
    parts = clone_model(*whole)
    hooks = {"whole": 0, "parts": 0}
    for key, (_, optimizers) in (("whole", whole), ("parts", parts)):
        for optimizer in optimizers.values():
            optimizer.register_step_post_hook(lambda *_, key=key: hooks.__setitem__(key, hooks[key] + 1))
    seq_whole = torch.zeros(num_rows, dtype=torch.int64)
    seq_parts = seq_whole.clone()
    reference = ops.use_reference() if backend == "reference" else contextlib.nullcontext()
    with reference:
        for _ in range(steps):
            count = int(torch.randint(0, num_rows + 1, (1,), generator=generator))
            rows = random_rows(generator, num_rows, count, "cpu")
            grads = {name: _gradient(generator, rows, p, "cpu") for name, p in whole[0].items()}
            first = torch.rand(rows.numel(), generator=generator) < 0.4
            ops.publish_adam(whole[1], rows, grads, seq_whole)
            ops.publish_adam(parts[1], rows[first], {n: g[first] for n, g in grads.items()}, seq_parts, part="first")
            ops.publish_adam(parts[1], rows[~first], {n: g[~first] for n, g in grads.items()}, seq_parts, part="rest")
    assert same_model(parts, whole)
    assert torch.equal(seq_parts, seq_whole)
    assert hooks["parts"] == hooks["whole"] == steps * len(whole[1])


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether two float tensors hold the same bits, NaNs in the same places (any NaN payload)."""
    integer = {torch.float32: torch.int32, torch.float64: torch.int64}[want.dtype]
    if got.shape != want.shape or not torch.equal(got.isnan(), want.isnan()):
        return False
    return torch.equal(got.nan_to_num(0.0, 0.0, 0.0).view(integer), want.nan_to_num(0.0, 0.0, 0.0).view(integer)) and (
        torch.equal(got.isinf(), want.isinf()) and torch.equal(got[got.isinf()], want[want.isinf()])
    )


@SETTINGS
@given(num_rows=st.integers(0, 700), seed=st.integers(0, 2**31 - 1), moved=st.integers(0, 700), odd=st.booleans())
def test_refresh_bounds_equals_reference(num_rows: int, seed: int, moved: int, odd: bool) -> None:
    """The culling index's refresh after a publication (CPU only): centres, radii, block spheres and bounds, the
    magnitude and whether the index went stale, with NaN and infinite centres and scales where ``odd``."""
    require_compiled("cpu")
    generator = torch.Generator().manual_seed(seed)
    bounds = _scene(generator, num_rows, "cpu")
    assume(bounds.blocks is not None)  # without a block index the op falls back to the reference itself
    rows = random_rows(generator, num_rows, moved, "cpu")
    means = 4.0 * torch.randn(rows.numel(), 3, generator=generator) + 6.0 * torch.rand((), generator=generator)
    scales = 0.5 * torch.rand(rows.numel(), 3, generator=generator)
    if odd and rows.numel() >= 3:
        means[0, 1], means[1, 2], scales[2, 0], scales[0, 2] = float("nan"), float("inf"), float("nan"), -0.0
    want = copy.deepcopy(bounds)
    with ops.use_reference():
        ops.refresh_bounds(want, rows, means, scales)
    ops.refresh_bounds(bounds, rows, means, scales)
    assert _same_bits(bounds.centres, want.centres) and _same_bits(bounds.radii, want.radii)
    assert (bounds.blocks is None) == (want.blocks is None)
    if want.blocks is not None:
        assert _same_bits(bounds.blocks.spheres, want.blocks.spheres)
        assert _same_bits(bounds.blocks.bounds, want.blocks.bounds)
        assert bounds.blocks.magnitude == want.blocks.magnitude


def _validation_case(seed: int, num_rows: int, steps: int) -> tuple:
    """A read's C(t), the rows published since (some moved into its region, some of C(t)), the bounds, the region."""
    generator = torch.Generator().manual_seed(seed)
    bounds = _scene(generator, num_rows, "cpu")
    region = CullRegion.candidates(random_camera(generator), margin=float(torch.rand((), generator=generator)) * 0.3)
    candidate, _ = ops.cull_conflicts(bounds, region, 0, [])
    moved = random_rows(generator, num_rows, num_rows // 3, "cpu")
    if moved.numel():  # rows moved by the publications since the read: some into the region, outside C(t)
        means = bounds.centres.T[moved] * torch.rand(moved.numel(), 1, generator=generator)
        bounds.update(moved, means, torch.full((moved.numel(), 3), 0.2))
    written = []
    for step in range(steps):
        rows = random_rows(generator, num_rows, int(torch.randint(0, 8, (1,), generator=generator)), "cpu")
        if step % 2 == 0:
            rows = rows[~torch.isin(rows, candidate)]  # even steps: only rows outside C(t)
        written.append((step, rows))
    return candidate, written, bounds, region


@SETTINGS
@given(num_rows=st.integers(0, 700), seed=st.integers(0, 2**31 - 1), steps=st.integers(0, 4))
def test_validate_read_equals_reference(num_rows: int, seed: int, steps: int) -> None:
    """A read's stale and candidate checks (CPU only; a read with admitted stale rows takes the reference)."""
    require_compiled("cpu")
    candidate, written, bounds, region = _validation_case(seed, num_rows, steps)
    with ops.use_reference():
        want = ops.validate_read(candidate, written, {}, bounds, region)
    assert ops.validate_read(candidate, written, {}, bounds, region) == want


def test_validate_read_finds_both_failures() -> None:
    """Over fixed random cases both checks fire and both pass (so the equality above compares both answers)."""
    require_compiled("cpu")
    outcomes = set()
    for seed in range(60):
        candidate, written, bounds, region = _validation_case(seed, 400, 3)
        with ops.use_reference():
            want = ops.validate_read(candidate, written, {}, bounds, region)
        got = ops.validate_read(candidate, written, {}, bounds, region)
        assert got == want, seed
        outcomes.add(got)
    assert {(True, True), (False, False), (False, True)} <= outcomes, outcomes


@SETTINGS
@given(num_rows=st.integers(0, 500), parts=st.integers(0, 5), seed=st.integers(0, 2**31 - 1))
def test_union_rows_equals_reference(num_rows: int, parts: int, seed: int) -> None:
    """The sorted union of sorted row sets (CPU only), empty and overlapping sets included."""
    require_compiled("cpu")
    generator = torch.Generator().manual_seed(seed)
    sets = [random_rows(generator, num_rows, int(torch.randint(0, 300, (1,), generator=generator)), "cpu")]
    sets += [sets[0][::2].contiguous()] + [random_rows(generator, num_rows, 50, "cpu") for _ in range(parts)]
    with ops.use_reference():
        want = ops.union_rows(sets)
    got = ops.union_rows(sets)
    assert torch.equal(got, want) and got.dtype == torch.int64


@SETTINGS
@given(num_rows=st.integers(1, 300), reads=st.integers(0, 6), seed=st.integers(0, 2**31 - 1))
def test_declare_and_settle_rows_equal_reference(num_rows: int, reads: int, seed: int) -> None:
    """The tables' pending-write marks (CPU only): reads of steps 3..5 declared, then step 4's publication settled
    (marks at or before it cleared on the declared rows, later ones kept)."""
    require_compiled("cpu")
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, num_rows + 1, (reads,), generator=generator).tolist()
    sets = [random_rows(generator, num_rows, size, "cpu") for size in sizes]
    written = random_rows(generator, num_rows, num_rows // 2, "cpu")
    tables = {backend: PrimitiveTables.create(num_rows) for backend in ("reference", "compiled")}
    for backend, table in tables.items():
        with ops.use_reference(backend == "reference"):
            for i, rows in enumerate(sets):
                ops.declare_rows(table, rows, 3 + i % 3)
            ops.settle_rows(table, written, sets[: reads // 2 + 1], 4)
    want, got = tables["reference"], tables["compiled"]
    assert torch.equal(got.pending_step, want.pending_step) and torch.equal(got.published_step, want.published_step)
    if reads >= 3:
        assert bool((got.pending_step[sets[2]] == 5).all())  # step 5's marks outlive step 4's publication
    if reads:
        assert bool((got.published_step[written] == 4).all()) and not bool((got.pending_step[sets[0]] == 3).any())


@pytest.mark.parametrize("device", DEVICES)
def test_ops_past_2_to_the_24_rows(device: str) -> None:
    """Every op on N = 2^24 + 7 rows (one float column): rows past 2^24 are read, summed and published exactly."""
    require_compiled(device)
    num_rows = 2**24 + 7
    generator = torch.Generator().manual_seed(0)
    tail = torch.arange(num_rows - 300, num_rows, dtype=torch.int64)
    rows = torch.cat([torch.randint(0, num_rows, (300,), generator=generator), tail, torch.tensor([2**24, 2**24 + 1])])
    rows = torch.unique(rows).to(device)

    params = {"opacities": torch.nn.Parameter(torch.randn(num_rows, generator=generator).to(device))}
    reference = (params, {"opacities": SelectiveAdam([params["opacities"]], lr=0.01)})
    compiled = clone_model(*reference)
    seq = torch.zeros(num_rows, dtype=torch.int64, device=device)
    seq_ref = seq.clone()
    grads = {"opacities": torch.randn(rows.numel(), generator=generator).to(device)}
    with ops.use_reference():
        ops.publish_adam(reference[1], rows, grads, seq_ref)
    ops.publish_adam(compiled[1], rows, grads, seq)
    assert same_model(compiled, reference) and torch.equal(seq, seq_ref)

    with ops.use_reference():
        want = ops.gather_rows(compiled[0], rows, seq)
    got = ops.gather_rows(compiled[0], rows, seq)
    assert torch.equal(got[0]["opacities"], want[0]["opacities"]) and torch.equal(got[1], want[1])
    assert int(got[1][-1]) == 1  # the last row (index 2^24 + 6) was published once

    gradient = grads["opacities"]
    halves = [
        SparseUpdate(rows[::2].contiguous(), {"opacities": gradient[::2].contiguous()}),
        SparseUpdate(rows[1::3].contiguous(), {"opacities": gradient[1::3].contiguous()}),
    ]
    with ops.use_reference():
        want = ops.scatter_in_order(halves, compiled[0])
    got = ops.scatter_in_order(halves, compiled[0])
    assert torch.equal(got.rows, want.rows) and torch.equal(got.grads["opacities"], want.grads["opacities"])

    sparse = {"opacities": gradient * (torch.arange(rows.numel()) % 3 == 0).to(gradient)}
    with ops.use_reference():
        want_rows, want = ops.stage_rows(rows, sparse)
    got_rows, got = ops.stage_rows(rows, sparse)
    assert torch.equal(got_rows, want_rows) and torch.equal(got["opacities"], want["opacities"])
    assert int(got_rows.max()) >= 2**24

    means = torch.full((num_rows, 3), 1e6)  # far away: only the rows placed in front of the camera are culled in
    means[rows.cpu()] = torch.tensor([0.0, 0.0, 5.0]) + 0.01 * torch.randn(rows.numel(), 3, generator=generator)
    bounds = BoundingSpheres.of(means.to(device), torch.full((num_rows, 3), 0.01, device=device))
    K = torch.tensor([[50.0, 0.0, 32.0], [0.0, 50.0, 24.0], [0.0, 0.0, 1.0]])
    region = CullRegion.candidates(Camera(viewmat=torch.eye(4), K=K, width=64, height=48), 0.1)
    writes = [StepRows(1, tail.to(device))]
    with ops.use_reference():
        want, want_conflicts = ops.cull_conflicts(bounds, region, 2, writes)
    got, got_conflicts = ops.cull_conflicts(bounds, region, 2, writes)
    assert torch.equal(got, want) and torch.equal(got_conflicts.rows, want_conflicts.rows)
    assert int(got.max()) >= 2**24 and got_conflicts.rows.numel() > 0
    if device != "cpu":
        return  # the CPU-only ops below run their reference on CUDA

    # The CPU-only ops on rows past 2^24: the index's refresh, validation's checks, unions and the pending marks.
    bounds.index()
    moved = rows[-40:]
    new_means = torch.tensor([0.0, 0.0, 6.0]) + 0.01 * torch.randn(moved.numel(), 3, generator=generator)
    new_scales = torch.full((moved.numel(), 3), 0.02)
    want_bounds = copy.deepcopy(bounds)
    with ops.use_reference():
        ops.refresh_bounds(want_bounds, moved, new_means, new_scales)
    ops.refresh_bounds(bounds, moved, new_means, new_scales)
    assert torch.equal(bounds.centres, want_bounds.centres) and torch.equal(bounds.radii, want_bounds.radii)
    assert torch.equal(bounds.blocks.bounds, want_bounds.blocks.bounds)

    written = [(1, tail[-100:]), (2, torch.tensor([2**24 + 3]))]
    with ops.use_reference():
        want_checks = ops.validate_read(got[: got.numel() // 2], written, {}, bounds, region)
        want_union = ops.union_rows([rows[::2].contiguous(), tail])
    assert ops.validate_read(got[: got.numel() // 2], written, {}, bounds, region) == want_checks
    assert torch.equal(ops.union_rows([rows[::2].contiguous(), tail]), want_union)

    tables = {backend: PrimitiveTables.create(num_rows) for backend in ("reference", "compiled")}
    for backend, table in tables.items():
        with ops.use_reference(backend == "reference"):
            ops.declare_rows(table, rows, 5)
            ops.settle_rows(table, tail, [rows], 5)
    assert torch.equal(tables["compiled"].pending_step, tables["reference"].pending_step)
    assert torch.equal(tables["compiled"].published_step, tables["reference"].published_step)
    assert int(tables["compiled"].published_step[-1]) == 5
