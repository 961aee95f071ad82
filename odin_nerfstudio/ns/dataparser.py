"""`odin-colmap`: nerfstudio's COLMAP dataparser plus the SfM tracks that Odin's RLG is built from.

Cameras, orientation, scaling and the train/eval split are nerfstudio's own. What changes: the model is read
at `sparse/0` (the layout COLMAP writes), images are never rescaled on disk (use the datamanager's
`camera-res-scale-factor`, which resizes in memory; the shared scenes are read-only), and the seed points and
per-view tracks come from pycolmap, matched to nerfstudio's image order by file name. nerfstudio's own track
reader keeps one observation per point and drops image ids; it is not used.

Metadata added to the outputs:
    sfm_tracks     list of [n_i] int64 arrays: the point3D ids each view of the split observes
    sfm_in_view    list of [m_i] int64 arrays: those plus the ids of every point in the view's field of view
    points3D_ids   [P] int64: COLMAP point3D id of each seed point (rows of points3D_xyz)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Type

import numpy as np
import torch
from nerfstudio.data.dataparsers.base_dataparser import DataparserOutputs
from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParser, ColmapDataParserConfig
from nerfstudio.utils.rich_utils import CONSOLE

MODEL_FILES = ("cameras", "images", "points3D")


@dataclass
class OdinColmapDataParserConfig(ColmapDataParserConfig):
    """COLMAP scene (`images/` + `sparse/0/`, bin or txt) with its SfM tracks per view."""

    _target: Type = field(default_factory=lambda: OdinColmapDataParser)
    colmap_path: Path = Path("sparse/0")
    """COLMAP model folder, relative to the data path."""
    downscale_factor: Optional[int] = 1
    """Images are read at this size; downscale in memory with --pipeline.datamanager.camera-res-scale-factor."""
    max_2D_matches_per_3D_point: int = 0
    """Kept at 0: tracks come from pycolmap (metadata `sfm_tracks`), not from nerfstudio's reader."""


class OdinColmapDataParser(ColmapDataParser):
    """Reads a COLMAP model with pycolmap; exposes each view's observed point3D ids as `sfm_tracks`."""

    config: OdinColmapDataParserConfig

    def _generate_dataparser_outputs(self, split: str = "train", **kwargs) -> DataparserOutputs:
        self._check_layout()
        outputs = super()._generate_dataparser_outputs(split, **kwargs)
        images_dir = self.config.data / self.config.images_path
        names = [Path(f).relative_to(images_dir).as_posix() for f in outputs.image_filenames]
        tracks = self._tracks().for_names(names)
        for name, observed in zip(names, tracks):
            if observed.size == 0:
                CONSOLE.print(
                    f"[yellow]odin-colmap: view {name} observes no SfM point; it is kept, "
                    "but the scheduler cannot predict its conflicts.[/yellow]"
                )
        outputs.metadata["sfm_tracks"] = tracks
        outputs.metadata["sfm_in_view"] = self._tracks().for_names(names, "in-view")
        return outputs

    def _check_layout(self) -> None:
        """Fail early, saying what is missing and how to fix it, before any work starts."""
        data = self.config.data
        if not data.is_dir():
            raise FileNotFoundError(f"odin-colmap: data folder {data} does not exist; pass --data <scene folder>.")
        model_dir = data / self.config.colmap_path
        for stem in MODEL_FILES:
            if not (model_dir / f"{stem}.bin").exists() and not (model_dir / f"{stem}.txt").exists():
                raise FileNotFoundError(
                    f"odin-colmap: no COLMAP model at {model_dir} ({stem}.bin or {stem}.txt missing). "
                    "Expected <scene>/images/ and <scene>/sparse/0/; run COLMAP (or `odin-synth`) first, "
                    "or point --colmap-path at the model folder."
                )
        tracks = self._tracks()
        missing = [n for n in tracks.image_names if not (data / self.config.images_path / n).exists()]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise FileNotFoundError(
                f"odin-colmap: {len(missing)} image(s) of the COLMAP model are missing from "
                f"{data / self.config.images_path}: {shown}. Copy them there or pass the right --images-path."
            )

    def _tracks(self):
        """The scene's SfM tracks, read once with pycolmap."""
        if getattr(self, "_sfm_tracks", None) is None:
            from odin_nerfstudio.scheduling.tracks import read_colmap_tracks

            self._sfm_tracks = read_colmap_tracks(self.config.data / self.config.colmap_path)
        return self._sfm_tracks

    def _load_3D_points(
        self, colmap_path: Path, transform_matrix: torch.Tensor, scale_factor: float
    ) -> Dict[str, torch.Tensor]:
        """Seed points [P, 3] and colours [P, 3] from pycolmap, in nerfstudio's oriented and scaled frame."""
        tracks = self._tracks()
        xyz = torch.from_numpy(tracks.points_xyz.astype(np.float32))
        xyz = torch.cat([xyz, torch.ones_like(xyz[:, :1])], dim=-1) @ transform_matrix.T
        return {
            "points3D_xyz": xyz * scale_factor,
            "points3D_rgb": torch.from_numpy(tracks.points_rgb.astype(np.uint8)),
            "points3D_ids": torch.from_numpy(tracks.point3d_ids.astype(np.int64)),
        }
