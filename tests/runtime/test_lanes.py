"""Two tasks in flight per process (``runtime/lanes.py``): lane threads gather, render and back-propagate while the
driver's thread stages, validates and publishes; quality-first through the trainer's step loop still equals the
barrier bit for bit at the default thread count, across a densification. (All workers are local here, so a step's
reads never meet an unpublished step; ``tests/ns/test_launch.py`` runs two lanes per gloo rank, where they do.) A gather that meets a row a publication holds reads it again once it is
released, and a row held too long ends in an error naming it.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from odin_nerfstudio.drivers.step_loop import run_step, settle
from odin_nerfstudio.drivers.virtual import run_virtual
from odin_nerfstudio.runtime.config import Topology
from odin_nerfstudio.runtime.lanes import Lanes
from odin_nerfstudio.runtime.runtime import OdinRuntimeConfig
from odin_nerfstudio.runtime.shadow import ShadowGraph
from tests.runtime.test_runtime import SPARSE, schedule_of, structural_change
from odin_nerfstudio.scenes.toy import assert_identical, make_params, make_runtime, render, snapshot

CHANGE_AT = 4


def slowed_render(task, leaves, generator):
    """The toy render, 10 ms longer: long enough that a second lane starts while the first still renders."""
    time.sleep(0.01)
    return render(task, leaves, generator)


@pytest.mark.parametrize("workers, per_worker", [(2, 2), (4, 1)])
def test_two_tasks_in_flight_equal_the_barrier_bit_for_bit_across_a_densification(
    workers: int, per_worker: int, default_torch_threads: int
) -> None:
    topology = Topology(workers, per_worker)
    config = OdinRuntimeConfig(mode="quality", tasks_in_flight=2)
    runtime = make_runtime(config, make_params(), slowed_render, lr_scale=SPARSE["lr_scale"], topology=topology)
    schedule = schedule_of(SPARSE, workers, per_worker)
    for step, tasks in enumerate(schedule):
        if step == CHANGE_AT:  # the trainer's structural change: behind settle, which joins the lanes
            settle(runtime)
            runtime.remap(structural_change(runtime))
        run_step(runtime, step, tasks)
    settle(runtime)
    barrier = make_runtime(OdinRuntimeConfig(mode="barrier"), make_params(), lr_scale=SPARSE["lr_scale"], topology=topology)
    run_virtual(barrier, schedule, structural_changes={CHANGE_AT: structural_change})

    assert torch.get_num_threads() == default_torch_threads > 1
    assert runtime.num_primitives != make_params()["means"].shape[0], "the densification changed the model"
    assert_identical(snapshot(runtime), snapshot(barrier))
    counters = runtime.counters
    assert counters.most_in_flight == 2 and runtime.lanes.in_flight == 0
    renders = sorted((e.start_ns, e.end_ns) for e in runtime.timeline.events if e.name == "render")
    overlapping = [(a, b) for a, b in zip(renders, renders[1:]) if b[0] < a[1]]
    assert overlapping, "no two renders ran at the same time"


def test_a_gather_beside_a_publication_reads_a_held_row_again_once_it_is_released() -> None:
    """Row 3 is held (odd sequence word) while a 'publication' writes it; the gather reads the others at once and
    row 3 again once it is released, with its new value, never the half-written one."""
    params = {"means": torch.zeros(6, 3), "opacities": torch.zeros(6)}
    seq = torch.zeros(6, dtype=torch.int64)
    seq[3] = 1
    params["means"][3] = -1.0  # half written

    def publish() -> None:
        time.sleep(0.05)
        params["means"][3] = 7.0
        params["opacities"][3] = 7.0
        seq[3] = 2

    writer = threading.Thread(target=publish)
    writer.start()
    leaves, rereads = ShadowGraph(ring_slots=2).gather(params, torch.tensor([1, 3, 5]), seq, concurrent=True)
    writer.join()
    assert rereads >= 1
    assert leaves["means"].tolist() == [[0.0] * 3, [7.0] * 3, [0.0] * 3]
    assert leaves["opacities"].tolist() == [0.0, 7.0, 0.0] and leaves["means"].requires_grad


def test_a_row_held_past_the_timeout_stops_the_gather_naming_it() -> None:
    params = {"means": torch.zeros(6, 3)}
    seq = torch.zeros(6, dtype=torch.int64)
    seq[4] = 3
    with pytest.raises(TimeoutError, match=r"rows \[4\] held by a publication"):
        ShadowGraph(ring_slots=2).gather(params, torch.tensor([2, 4]), seq, concurrent=True, timeout_s=0.2)


def test_lanes_hand_back_finished_reads_and_raise_their_errors() -> None:
    """Two lanes: a round's first read renders on the lane thread, its last on the driver's (so it is done first); a
    read is handed back once its lane finished; an exception in a lane is raised on the driver's thread; a lane that
    does not finish in time is named."""

    class Fake:
        def __init__(self, key, delay, error=None):
            self.task = type("T", (), {"key": key})()
            self.delay, self.error = delay, error

    def work(read, inline):
        time.sleep(read.delay)
        if read.error:
            raise read.error
        return {"key": read.task.key}

    lanes = Lanes(work, 2, torch.device("cpu"), timeout_s=5.0)
    lanes.start(Fake("a", 0.1))
    lanes.start(Fake("b", 0.0))
    assert not lanes.free and lanes.in_flight == 2
    first = [info["key"] for _, info in lanes.finished(block=True)]
    assert first == ["b"], "b rendered on the driver's thread while a rendered on the lane's"
    time.sleep(0.15)
    assert [info["key"] for _, info in lanes.finished()] == ["a"] and lanes.in_flight == 0
    lanes.start(Fake("c", 0.0, ValueError("render failed")))
    with pytest.raises(ValueError, match="render failed"):
        while True:
            lanes.finished(block=True)
    slow = Lanes(work, 2, torch.device("cpu"), timeout_s=0.1)
    slow.start(Fake("d", 1.0))
    slow.start(Fake("e", 0.0))
    assert [info["key"] for _, info in slow.finished(block=True)] == ["e"]
    with pytest.raises(TimeoutError, match=r"tasks \['d'\] still rendering"):
        slow.finished(block=True)
    lanes.close()
    slow.close()
