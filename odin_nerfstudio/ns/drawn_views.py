"""The rows a trained odin-splat model draws in each training view, read from a run or a pipeline in memory.

What ``odin-schedule --checkpoint`` and ``benchmarks/bench_point_sets.py`` judge the RLG by
(``scheduling/drawn_conflicts.py``): per training view, the Gaussians its render draws (radii > 0, the
rasterizer's projection at the view's full training resolution), named by the view's image file so that they
match the schedule's views.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from odin_nerfstudio.ns.splat_runtime import odin_camera


@torch.no_grad()
def drawn_rows_by_name(pipeline) -> dict[str, np.ndarray]:
    """Per training view of ``pipeline`` (its image path relative to the images folder, as COLMAP names it), the
    sorted rows of ``pipeline.model.gauss_params`` its render draws, int64 [n]."""
    from odin_nerfstudio.rendering.rasterize import drawn_rows

    datamanager, model = pipeline.datamanager, pipeline.model
    outputs = datamanager.train_dataparser_outputs
    images_dir = Path(datamanager.dataparser.config.data) / datamanager.dataparser.config.images_path
    rows = {name: model.gauss_params[name].detach() for name in ("means", "quats", "scales")}
    cameras = datamanager.train_dataset.cameras
    drawn = {}
    for index, filename in enumerate(outputs.image_filenames):
        camera = odin_camera(cameras, index, model.device)
        name = Path(filename).relative_to(images_dir).as_posix()
        drawn[name] = torch.nonzero(drawn_rows(camera, rows)).flatten().cpu().numpy()
    return drawn


def drawn_rows_of_run(config_path: Path) -> dict[str, np.ndarray]:
    """:func:`drawn_rows_by_name` of a finished run: its ``config.yml`` and its newest checkpoint (nerfstudio's
    ``eval_setup``), on the CPU unless CUDA is there.

    Raises:
        FileNotFoundError: no such config.yml.
    """
    if not config_path.is_file():
        raise FileNotFoundError(
            f"--checkpoint {config_path} does not exist; pass a run's config.yml (outputs/<scene>/<method>/<run>/)"
        )
    from nerfstudio.utils.eval_utils import eval_setup

    _, pipeline, _, _ = eval_setup(config_path, test_mode="inference")
    return drawn_rows_by_name(pipeline)
