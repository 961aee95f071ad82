"""`odin-train`: ns-train under torchrun, so that multi-process runs work on CPU (gloo) as well as on CUDA (NCCL).

nerfstudio's own launcher asserts CUDA for more than one process. Under torchrun every process runs this entry
point: it parses ns-train's command line for the methods plugins register, joins the process group torchrun
describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in the environment; NCCL on CUDA, gloo on CPU),
takes rank 0's timestamp so that every rank writes to one run folder, seeds every rank alike and trains. Without
torchrun's environment it is ns-train. One process per schedule worker (leave `--pipeline.datamanager.num-workers`
unset)::

    torchrun --nproc-per-node 2 --no-python odin-train odin-splat --data data/synth-street --machine.device-type cpu
"""

from __future__ import annotations

import datetime
import os
import random
import signal
import socket
import sys
import traceback
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist
import tyro
import yaml
from nerfstudio.engine.trainer import TrainerConfig
from nerfstudio.plugins.registry import discover_methods
from nerfstudio.utils.rich_utils import CONSOLE

from odin_nerfstudio.comm.liveness import SILENCE_S, Heartbeat
from odin_nerfstudio.ns.options import OptionError, check_options
from odin_nerfstudio.ns.signals import exit_on_sigterm
from odin_nerfstudio.ns.startup import quiet_empty_profile, reflow_help_texts, require_cuda_if_asked
from odin_nerfstudio.ns.threads import apply_cpu_threads

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
JOIN_TIMEOUT = datetime.timedelta(minutes=5)
"""How long a rank waits for the others to join the process group."""


def entrypoint() -> None:
    """Console script: parse ns-train's command line, then train in this process (one rank of torchrun)."""
    tyro.extras.set_accent_color("bright_yellow")
    reflow_help_texts()
    config = tyro.cli(plugin_methods(), description=__doc__.splitlines()[0])
    try:
        check_options(config)
    except OptionError as error:
        CONSOLE.print(f"[bold red]odin-train: {error}")
        sys.exit(2)
    require_cuda_if_asked(config.machine.device_type, config.method_name or "odin-splat")
    apply_cpu_threads(getattr(config, "cpu_threads", 0))  # this rank's share (LOCAL_WORLD_SIZE under torchrun)
    quiet_empty_profile()
    main(config)


def plugin_methods() -> type:
    """tyro's union over the methods plugins register (odin-splat and its kin), each with its defaults.

    Not nerfstudio's `AnnotatedBaseConfigUnion`: building that (its catalogue of installable external methods calls
    `inspect.stack()` per entry) takes 5 s and more per process, paid by every rank of every launch.
    """
    methods, descriptions = discover_methods()
    return tyro.conf.SuppressFixed[
        tyro.conf.FlagConversionOff[
            tyro.extras.subcommand_type_from_defaults(defaults=dict(sorted(methods.items())), descriptions=descriptions)
        ]
    ]


def main(config: TrainerConfig) -> None:
    """Train ``config`` as the rank torchrun's environment names, or as ns-train when there is none."""
    if "WORLD_SIZE" not in os.environ:
        from nerfstudio.scripts import train as ns_train  # builds nerfstudio's method catalogue: only here

        exit_on_sigterm("odin-train")
        ns_train.main(config)
        return
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise RuntimeError(f"odin-train needs torchrun's environment; missing {missing} (launch it with torchrun)")
    rank, world_size, local_rank = (int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    require_cuda_if_asked(config.machine.device_type)
    cuda = config.machine.device_type == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=JOIN_TIMEOUT)
    exit_on_sigterm(f"odin-train rank {rank}")
    heartbeat = Heartbeat(rank, world_size)
    try:
        config = _resolved(config)
        stamp = [config.timestamp]
        dist.broadcast_object_list(stamp, src=0)
        config.timestamp = stamp[0]
        config.get_base_dir().mkdir(parents=True, exist_ok=True)  # each node's own, without a shared file system
        if rank == 0:
            config.print_to_terminal()
            config.save_config()
        CONSOLE.log(f"odin-train: rank {rank} of {world_size} ({'NCCL' if cuda else 'gloo'})")
        _seed(config.machine.seed)
        trainer = config.setup(local_rank=local_rank, world_size=world_size)
        trainer.setup()
        trainer.train()
    except BaseException as error:
        _end_job(error, rank, heartbeat)
    trainer.close_transports()  # the exchanges' progress thread, like the heartbeat, must not outlive the process group
    heartbeat.stop()
    dist.destroy_process_group()


def _end_job(error: BaseException, rank: int, heartbeat: Heartbeat) -> NoReturn:
    """Report ``error`` in one line naming the ranks that stopped answering, and end this rank at once.

    Why not ``destroy_process_group``: after a failed collective, gloo's destructor blocks until the process group's
    own timeout (minutes) while the other ranks wait. Ranks found silent on this host (stopped or hung) are killed,
    as torchrun would do 30 s later, so that the whole job ends within the wait timeout plus seconds; torchrun then
    stops the remaining ranks (SIGTERM, one line each).
    """
    traceback.print_exception(error)
    silent = heartbeat.silent() if isinstance(error, TimeoutError) else []
    line = f"odin-train: rank {rank} failed: {type(error).__name__}: {error}"
    if silent:
        line += f"; {', '.join(map(str, silent))} stopped answering (no heartbeat for {SILENCE_S:g} s)"
        for other in silent:
            if other.host == socket.gethostname():
                os.kill(other.pid, signal.SIGKILL)
                line += f"; killed {other}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(1)


def _resolved(config: TrainerConfig) -> TrainerConfig:
    """ns-train's aliases (`--data`, `--load-config`) applied, and the timestamp set (rank 0's wins)."""
    if config.data:
        config.pipeline.datamanager.data = config.data
    if config.load_config:
        config = yaml.load(config.load_config.read_text(), Loader=yaml.Loader)
    config.set_timestamp()
    return config


def _seed(seed: int) -> None:
    """The same seed on every rank (nerfstudio adds the rank), so the replicas start identical."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
