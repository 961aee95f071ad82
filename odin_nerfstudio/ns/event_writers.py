"""The event writers one trainer added to nerfstudio's process-wide list, closed when its training ends.

Why: nerfstudio appends a writer per trainer to ``writer.EVENT_WRITERS`` and never removes or closes it, so a second
trainer in the same process (a notebook, a benchmark's rounds) logs into every earlier run's folder too, and
tensorboard's writer thread may still be writing an earlier run's event file after that run returned (a folder
removed right after training then fails: "Directory not empty").
"""

from __future__ import annotations

from nerfstudio.utils import writer


def writers_mark() -> int:
    """How many event writers the process holds now; pass it to `close_writers_since` at the end of training."""
    return len(writer.EVENT_WRITERS)


def close_writers_since(mark: int) -> None:
    """Flush and close the writers added after ``mark`` (tensorboard's file and thread) and drop them from the list.

    A wandb run stays open (nerfstudio ends it at exit, and a user may still log to it); only its writer is dropped.
    """
    added = writer.EVENT_WRITERS[mark:]
    del writer.EVENT_WRITERS[mark:]
    for event_writer in added:
        if isinstance(event_writer, writer.TensorboardWriter):
            event_writer.tb_writer.close()
