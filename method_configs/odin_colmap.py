"""`odin-colmap`: the dataparser specification nerfstudio discovers.

Kept apart from the method specification: nerfstudio loads dataparser entry points while its datamanager
module is still importing, so this module must not import datamanagers, pipelines or trainers.
"""

from __future__ import annotations

from nerfstudio.plugins.registry_dataparser import DataParserSpecification

from odin_nerfstudio.ns.dataparser import OdinColmapDataParserConfig

odin_colmap = DataParserSpecification(
    config=OdinColmapDataParserConfig(),
    description="COLMAP scene (images/ + sparse/0/) with per-view SfM tracks read by pycolmap.",
)
