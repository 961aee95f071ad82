"""A training process stopped by SIGTERM (torchrun ending a job, a scheduler's preemption) exits at once with one
line instead of a stack trace, even while its main thread is blocked in a collective.

Why a thread: Python runs signal handlers only when the main thread returns to the interpreter, which a rank
blocked in a gloo wait does not do until that wait times out, and torchrun SIGKILLs it 30 s later. With
``signal.set_wakeup_fd`` the C-level handler writes the signal number to a pipe at once; a daemon thread reading
it prints the line and ends the process with ``os._exit(128 + SIGTERM)``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def exit_on_sigterm(who: str) -> None:
    """From now on, SIGTERM prints ``<who>: stopped by SIGTERM`` on stderr and exits with 143 (main thread only)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.signal(signal.SIGTERM, lambda *_: None)  # a Python handler, so that the C handler writes the wakeup fd
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            if signal.SIGTERM in os.read(read_end, 64):
                sys.stderr.write(f"{who}: stopped by SIGTERM (the job is ending; the first failing rank says why)\n")
                sys.stderr.flush()
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="odin-sigterm", daemon=True).start()
