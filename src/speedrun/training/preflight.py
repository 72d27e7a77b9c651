"""Preflight of a GPU training run: the GPUs this process sees are the ones the config asks for.

A run that lands on the wrong machine (a node with fewer GPUs, another model, a smaller memory) would still
train, but its ``train_time`` would not be comparable with the rest of the experiment, or it would fail late, in
compilation or at the first out-of-memory. So every rank checks its node before building the model: the number
of visible GPUs (at least the processes torchrun started on this node, LOCAL_WORLD_SIZE), each GPU's name
(``cluster.gpu_model`` in config.yaml, matched case-insensitively inside the name) and total memory
(``cluster.gpu_memory_gib``, GiB = 2**30 bytes). A mismatch raises :class:`~speedrun.errors.SpeedrunError`
saying what was expected and what was found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from speedrun.errors import SpeedrunError

GIB = 2**30


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU: ``name`` (e.g. ``NVIDIA H100 80GB HBM3``) and ``memory_bytes`` (total memory)."""

    name: str
    memory_bytes: int


@dataclass(frozen=True)
class GpuRequirement:
    """What every GPU of a GPU run must be (config.yaml ``cluster``): ``model`` inside its name, matched
    case-insensitively ("" for any), and ``memory_gib`` GiB of total memory at least (0 for any)."""

    model: str = ""
    memory_gib: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise SpeedrunError(f"cluster.gpu_model must be a string, got {self.model!r}")
        if not isinstance(self.memory_gib, (int, float)) or self.memory_gib < 0:
            raise SpeedrunError(f"cluster.gpu_memory_gib must be a number >= 0, got {self.memory_gib!r}")


def local_process_count(env: Mapping[str, str], world_size: int) -> int:
    """Processes of this run on this node: torchrun's LOCAL_WORLD_SIZE, else ``world_size`` (one node)."""
    value = env.get("LOCAL_WORLD_SIZE")
    try:
        return int(value) if value is not None else world_size
    except ValueError:
        raise SpeedrunError(f"LOCAL_WORLD_SIZE must be an integer, got {value!r}") from None


def describe(gpus: Sequence[GpuInfo]) -> str:
    """``2 x NVIDIA H200 (139.8 GiB)``-style summary of the visible GPUs (``none`` for no GPU)."""
    if not gpus:
        return "none"
    kinds: dict[tuple[str, float], int] = {}
    for gpu in gpus:
        key = (gpu.name, round(gpu.memory_bytes / GIB, 1))
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{n} x {name} ({gib} GiB)" for (name, gib), n in kinds.items())


def check_gpus(requirement: GpuRequirement, count: int, gpus: Sequence[GpuInfo]) -> None:
    """Raise :class:`SpeedrunError` unless ``gpus`` (those this process sees) are ``count`` at least and each
    meets ``requirement``; the message gives what was expected, where it comes from and what was found."""
    found = describe(gpus)
    if len(gpus) < count:
        gpus_word = "GPU" if count == 1 else "GPUs"
        raise SpeedrunError(f"GPU preflight: expected {count} {gpus_word} on this node (one per process), "
                            f"found {found}")
    if any(requirement.model.lower() not in g.name.lower() for g in gpus):
        raise SpeedrunError(f"GPU preflight: expected GPUs whose name contains {requirement.model!r} "
                            f"(config.yaml cluster.gpu_model), found {found}")
    if any(g.memory_bytes < requirement.memory_gib * GIB for g in gpus):
        raise SpeedrunError(f"GPU preflight: expected at least {requirement.memory_gib:g} GiB per GPU "
                            f"(config.yaml cluster.gpu_memory_gib), found {found}")


def preflight(device: str, requirement: GpuRequirement, env: Mapping[str, str], world_size: int) -> None:
    """The check a training process runs before building its model: for ``device`` cuda (or auto on a machine
    with CUDA), this node must show one GPU per local process (:func:`local_process_count`) that meets
    ``requirement``; nothing for cpu. Raises :class:`SpeedrunError`."""
    if device == "cpu":
        return
    gpus = visible_gpus()
    if device == "auto" and not gpus:
        return
    check_gpus(requirement, local_process_count(env, world_size), gpus)


def visible_gpus() -> list[GpuInfo]:
    """The CUDA devices this process sees (after CUDA_VISIBLE_DEVICES), [] without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [GpuInfo(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory)
            for i in range(torch.cuda.device_count())]
