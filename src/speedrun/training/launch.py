"""Where this process of a training run runs: its rank among torchrun's processes (:class:`Launch`), its
device (:func:`resolve_device`) and the default process group (:func:`process_group`).

Nothing here runs at import: the environment is read only when :class:`Launch` is built from it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

import torch
import torch.distributed as dist

from speedrun.errors import SpeedrunError
from speedrun.training.config import TrainConfig


class Launch:
    """This process's place in the run: ``rank``, ``local_rank``, ``world_size`` (torchrun's variables)."""

    def __init__(self, env: Mapping[str, str]):
        try:
            self.rank = int(env.get("RANK", "0"))
            self.local_rank = int(env.get("LOCAL_RANK", "0"))
            self.world_size = int(env.get("WORLD_SIZE", "1"))
        except ValueError:
            raise SpeedrunError("RANK, LOCAL_RANK and WORLD_SIZE must be integers when set") from None

    def check(self, config: TrainConfig) -> None:
        """Raise :class:`SpeedrunError` unless the config's world_size is the launched WORLD_SIZE."""
        if config.world_size != self.world_size:
            raise SpeedrunError(
                f"train.world_size is {config.world_size} but this run was launched with WORLD_SIZE="
                f"{self.world_size}; launch `torchrun --standalone --nproc_per_node={config.world_size} "
                "--no-python speedrun train ...` or change world_size"
            )


def resolve_device(device: str, local_rank: int) -> torch.device:
    """``cpu``, ``cuda:<local_rank>``, or for ``auto`` CUDA when available. Raises :class:`SpeedrunError`
    when CUDA is asked for and absent or has too few GPUs."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SpeedrunError("train.device is 'cuda' but torch sees no CUDA GPU (use device: cpu or auto)")
    if local_rank >= torch.cuda.device_count():
        raise SpeedrunError(f"LOCAL_RANK {local_rank} needs {local_rank + 1} GPUs, "
                            f"found {torch.cuda.device_count()}")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


@contextlib.contextmanager
def process_group(launch: Launch, device: torch.device) -> Iterator[None]:
    """The default process group (NCCL on CUDA, gloo on CPU) for a multi-process run; nothing for one."""
    if launch.world_size == 1:
        yield
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=launch.rank,
                            world_size=launch.world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
