"""What every command that runs odin-splat does first: the CUDA check, the CPU threads, nerfstudio's output trimmed.

nerfstudio's commands reach the plugin through its entry points: ``ns-train`` (and ``ns-eval``, ``ns-export``,
``ns-viewer``, ``ns-render``, which import nerfstudio's method catalogue) load ``method_configs/odin_splat.py``, which
calls :func:`prepare_command` before nerfstudio has parsed its command line; ``odin-train``
(``odin_nerfstudio/ns/launch.py``) calls the same steps itself once it has parsed its own. For a command that runs
odin-splat (``ns-train odin-splat...``, or any ns-* command whose ``--load-config`` names one of Odin's configs):

- ``ns-train`` asked for CUDA (nerfstudio's default device) on a machine without a CUDA device stops here in one
  line, before nerfstudio prints the config or writes ``outputs/.../config.yml``;
- torch's CPU threads are set by the plugin's rule (``odin_nerfstudio/ns/threads.py``);
- nerfstudio's "Printing profiling stats" heading is left out when nothing was profiled (the runtime's iteration is
  timed by its own timeline, not nerfstudio's profiler);
- the commands that compute no metric (``ns-export``, ``ns-viewer``, ``ns-render``) skip LPIPS, and with it the
  warning that its AlexNet weights are missing.

Other methods' commands are left as nerfstudio runs them, but for :func:`reflow_help_texts` (every ns-* command's
``--help`` reflows its options' descriptions instead of cutting them where the source wraps) and
:func:`skip_catalogue_stack_walk`, which ``method_configs/odin_splat.py`` takes in every process that builds
nerfstudio's method catalogue (the plugins load first): 2.7 s less start-up on this project's CPU machine
(BENCHMARKS.md, bench_startup).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from odin_nerfstudio.core.help_text import reflow_help_texts, reflowed

__all__ = [
    "prepare_command",
    "quiet_empty_profile",
    "reflow_help_texts",
    "reflowed",
    "require_cuda_if_asked",
    "skip_catalogue_stack_walk",
]

COMMANDS_WITHOUT_METRICS = ("ns-export", "ns-viewer", "ns-render")
"""ns-* commands that load a trained model without evaluating it: LPIPS would never be computed."""
HELP_FLAGS = ("-h", "--help")

_prepared: list[str] = []


def require_cuda_if_asked(device_type: str, method: str = "odin-splat") -> None:
    """Stop in one line, before any set-up, when CUDA is asked for (nerfstudio's default) but torch finds no device,
    instead of a traceback from deep in the set-up; the message names the flag that trains on the CPU."""
    import torch

    if device_type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"{method}: no CUDA device found (torch.cuda.is_available() is False); "
            "add --machine.device-type cpu to train on the CPU."
        )


def odin_methods() -> set[str]:
    """The method names this plugin registers with nerfstudio (its ``nerfstudio.method_configs`` entry points)."""
    from importlib.metadata import entry_points

    found = entry_points(group="nerfstudio.method_configs")
    return {point.name for point in found if point.value.startswith("odin_nerfstudio.")}


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last ``--name value`` or ``--name=value`` among ``argv`` (tyro's spellings), else None."""
    value = None
    for index, arg in enumerate(argv):
        for name in names:
            if arg == name and index + 1 < len(argv):
                value = argv[index + 1]
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1 :]
    return value


def runs_odin(command: str, args: Sequence[str]) -> bool:
    """Whether an ns-* command line runs one of Odin's methods: ``ns-train <odin method>``, or a ``--load-config``
    whose file names Odin's trainer config."""
    if command == "ns-train" and args and args[0] in odin_methods():
        return True
    config = flag_value(args, "--load-config", "--load_config")
    if config is None:
        return False
    try:
        return "odin_nerfstudio." in Path(config).read_text(errors="replace")
    except OSError:
        return False


def check_device_on_command_line(args: Sequence[str]) -> None:
    """``ns-train <odin method> ...`` asking for CUDA (by flag or by default) without a CUDA device: one line, exit.

    Left to the trainer when the command asks for help or loads its config from a file."""
    from nerfstudio.configs.base_config import MachineConfig

    if any(arg in HELP_FLAGS for arg in args) or flag_value(args, "--load-config", "--load_config") is not None:
        return
    device = flag_value(args, "--machine.device-type", "--machine.device_type") or MachineConfig().device_type
    require_cuda_if_asked(device, args[0])


def quiet_empty_profile() -> None:
    """nerfstudio's profiler prints its heading ("Printing profiling stats...") at the end of ``ns-train`` even when
    it timed nothing (odin-splat's iteration is not nerfstudio's): print it only when something was timed."""
    from nerfstudio.utils import profiler

    original = profiler.Profiler.print_profile
    if getattr(original, "odin_quiet", False):
        return

    def print_profile(self) -> None:
        if self.profiler_dict:
            original(self)

    print_profile.odin_quiet = True  # type: ignore[attr-defined]
    profiler.Profiler.print_profile = print_profile


def skip_catalogue_stack_walk() -> None:
    """Build nerfstudio's catalogue of installable external methods without walking the stack for each entry.

    nerfstudio 1.1.5 tells its catalogue's placeholders (``ExternalMethodDummyTrainerConfig``) from a user's choice by
    ``inspect.stack()[2].function == "get_external_methods"`` in their ``__post_init__``. ``inspect.stack()`` reads
    the source lines of every frame (the import machinery's included) and looks each one's module up among the
    thousands torch has loaded: 26 entries took 2.7 s of every ns-* command's start-up on this project's CPU machine
    (BENCHMARKS.md, bench_startup). The same test on the frame itself (``sys._getframe(2)``: the dataclass's
    ``__init__`` is frame 1) costs nothing; a user's choice still reaches nerfstudio's offer to install the method.
    """
    from nerfstudio.configs.external_methods import ExternalMethodDummyTrainerConfig as Placeholder

    offer_install = Placeholder.__post_init__
    if getattr(offer_install, "odin_quick", False):
        return

    @functools.wraps(offer_install)
    def __post_init__(self) -> None:
        if sys._getframe(2).f_code.co_name == "get_external_methods":
            return
        offer_install(self)

    __post_init__.odin_quick = True  # type: ignore[attr-defined]
    Placeholder.__post_init__ = __post_init__


def skip_lpips() -> None:
    """Build odin-splat's model without LPIPS (a command that computes no metric), so no warning about its weights."""
    from odin_nerfstudio.ns import model

    model.make_lpips = lambda: None


def prepare_command(argv: Sequence[str] | None = None) -> None:
    """The steps above for an ns-* command running odin-splat (``argv``: ``sys.argv``); once per process, and
    nothing for any other program (tests, scripts, other methods)."""
    argv = list(sys.argv if argv is None else argv)
    command = Path(argv[0]).name if argv else ""
    if _prepared or not command.startswith("ns-"):
        return
    reflow_help_texts()
    if not runs_odin(command, argv[1:]):
        return
    _prepared.append(command)
    if command == "ns-train":
        check_device_on_command_line(argv[1:])
    from odin_nerfstudio.ns.threads import apply_cpu_threads

    apply_cpu_threads(training=command == "ns-train")
    quiet_empty_profile()
    if command in COMMANDS_WITHOUT_METRICS:
        skip_lpips()
