"""The `odin-schedule` command: the scheduling layer's command with ``--checkpoint`` read through nerfstudio.

The schedule and its statistics are ``scheduling/cli.py``'s; a trained run's drawn rows need nerfstudio (its
config, dataparser and checkpoint), so this layer supplies them (``drawn_views.py``), imported only when
``--checkpoint`` is given: without it the command starts as fast as the scheduling layer's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from odin_nerfstudio.scheduling.cli import main as schedule_main


def drawn_rows_of_run(config_path: Path) -> Mapping[str, np.ndarray]:
    """Per training view of the run at ``config_path`` (its config.yml), the rows its newest checkpoint draws."""
    from odin_nerfstudio.ns.drawn_views import drawn_rows_of_run as read

    return read(config_path)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console entry point `odin-schedule`."""
    schedule_main(argv, drawn_rows_of_run)


if __name__ == "__main__":
    main()
