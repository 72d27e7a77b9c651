"""``speedrun train``: one (variant, seed) training run of the speedrun GPT, with its training log.

Runs standalone (world size 1) or under ``torchrun --standalone --nproc_per_node=N --no-python speedrun
train ...`` (RANK, WORLD_SIZE and LOCAL_RANK from the environment; gloo on CPU, NCCL on CUDA). Each optimizer
step takes ``tokens_per_step`` tokens in ``micro_batches`` micro-batches from the BOS-aligned loader; rank r
runs ``micro_batches / world_size`` of them with gradient accumulation and the gradients are averaged over
ranks, so a step sees the same tokens whatever the world size (speedrun-spec.md 1.3). The seed sets the
initialization only: the token stream is the same for every seed, as in the public speedrun.

The loop validates at step 0, every ``val_every`` steps and at the last step with the clock stopped (the
speedrun's timing rule, speedrun-spec.md 1.4); ``train_time`` counts training wall time only. A non-finite
train or val loss stops the run at once and the log ends with ``run diverged: ...`` (exit status 0: the run
is reported, never dropped); an exception writes ``run failed: ...`` and propagates. The log
(docs/formats.md "Training log", :mod:`speedrun.runlog`) is renamed to ``--log`` only at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, MutableMapping, get_args

import numpy as np
import torch
import torch.distributed as dist

from speedrun import __version__
from speedrun.data.loader import (BosAlignedBatches, MicroBatch, padded_cu_seqlens, steps_available,
                                  to_torch, validation_batches)
from speedrun.data.shards import load_shard, sha256_file
from speedrun.errors import SpeedrunError
from speedrun.model.config import GPTConfig, build_model_config
from speedrun.model.gpt import GPT
from speedrun.optim.groups import OptimConfig, Optimizers, ScheduleConfig, build_optimizers
from speedrun.optim.orthogonalize import ORTHOGONALIZERS
from speedrun.preflight import GpuRequirement, preflight
from speedrun.optim.schedules import batch_stages, stage_starts, window_blocks
from speedrun.runlog import (SEPARATOR, RunLog, code_version, device_description, environment_lines,
                             header_lines, peak_memory_line, peak_memory_mib, sha256_text, train_line,
                             val_line)

RunStatus = Literal["complete", "diverged"]
LossKind = Literal["train", "val"]
DeviceChoice = Literal["cpu", "cuda", "auto"]
ComputeDtype = Literal["float32", "bfloat16"]
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class TrainConfig:
    """The training settings of one variant (config.yaml ``train`` with the variant's overrides).

    Sizes: ``steps`` optimizer steps of ``tokens_per_step`` tokens in ``micro_batches`` forward passes over
    all ranks; documents cut at ``max_seq_len`` tokens; ``val_tokens`` validation tokens in chunks of
    ``val_batch_tokens`` per rank, every ``val_every`` steps (0: only at step 0 and the last). Model:
    ``preset`` with ``model`` overrides (:class:`speedrun.model.config.GPTConfig` fields). Optimizers
    (:class:`speedrun.optim.groups.OptimConfig`): AdamW ``embed_lr``, ``head_lr``, ``scalar_lr``,
    ``adam_betas``; Muon ``muon_lr``, ``muon_momentum`` (reached after ``momentum_warmup_steps`` from 0.85),
    ``orthogonalizer``, ``normuon_beta2`` (null: plain Muon; records #41-#48 use NorMuon with 0.9);
    ``weight_decay`` (Muon's; the record 1.2) and ``adam_weight_decay`` (Adam's; the record 0.005), decoupled
    or, with ``cautious_weight_decay``, cautious (records #43, #50); ``langevin_noise``: the initial scale of
    NorMuon's annealed Langevin noise (2026-06-11 record; 0: off, :mod:`speedrun.optim.langevin`), seeded by
    the run's seed; ``shard_muon``: on several ranks, each rank updates a slice of every bank of matrices
    (reduce-scatter, update, all-gather; speedrun-spec.md 3.4).
    LR schedule: constant, then linear over the last ``cooldown_frac`` of the steps down to ``lr_floor``
    times the base. Attention windows (:func:`speedrun.optim.schedules.window_blocks`, records #13, #31,
    #33): ``window_schedule``, a list of ``[short, long]`` windows in blocks, one per equal stage of the
    steps (empty: the model's fixed windows), and ``final_window_long_blocks``, the long window at the final
    validation (null: unchanged); both need the model's ``window_pattern``. ``untie_step``: with the model's
    ``tie_embed_head``, the step at which the embedding is untied from the head and inherits its Adam state
    (record #53: 2/3 of the steps; null: tied throughout). ``dtype``: autocast dtype of the matrix products
    (``float32`` disables autocast). ``compile``: ``torch.compile`` the model (one static-shape graph per
    batch shape, window setting and tie state, all compiled in the untimed warm-up). ``batch_schedule``:
    the batch-size schedule (records #46, #72), one ``[tokens_per_step, max_seq_len]`` pair per equal stage
    of the steps; when set it replaces ``tokens_per_step`` and ``max_seq_len`` (empty: constant).

    Raises :class:`SpeedrunError` naming the setting on a wrong type or value, and on a batch that does not
    divide: micro_batches % world_size, tokens_per_step % micro_batches, val_tokens % (val_batch_tokens *
    world_size).
    """

    preset: str = "tiny"
    model: Mapping[str, Any] = field(default_factory=dict)
    steps: int = 60
    tokens_per_step: int = 4096
    micro_batches: int = 4
    max_seq_len: int = 1024
    val_tokens: int = 32768
    val_batch_tokens: int = 1024
    val_every: int = 20
    world_size: int = 1
    device: DeviceChoice = "cpu"
    compile: bool = False
    dtype: ComputeDtype = "bfloat16"
    embed_lr: float = 0.6
    head_lr: float = 0.008
    scalar_lr: float = 0.04
    adam_betas: tuple[float, float] = (0.8, 0.95)
    muon_lr: float = 0.05
    muon_momentum: float = 0.95
    momentum_warmup_steps: int = 300
    weight_decay: float = 0.0
    adam_weight_decay: float = 0.0
    langevin_noise: float = 0.0
    shard_muon: bool = True
    cooldown_frac: float = 0.4
    lr_floor: float = 0.0
    orthogonalizer: str = "polar_express"
    normuon_beta2: float | None = None
    cautious_weight_decay: bool = False
    window_schedule: tuple[tuple[int, int], ...] = ()
    final_window_long_blocks: int | None = None
    untie_step: int | None = None
    batch_schedule: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("steps", "tokens_per_step", "micro_batches", "max_seq_len", "val_tokens",
                     "val_batch_tokens", "world_size"):
            _check_int(name, getattr(self, name), 1)
        _check_int("val_every", self.val_every, 0)
        _check_int("momentum_warmup_steps", self.momentum_warmup_steps, 0)
        for name in ("embed_lr", "head_lr", "scalar_lr", "muon_lr", "weight_decay", "adam_weight_decay",
                     "langevin_noise"):
            _check_number(name, getattr(self, name), 0.0, math.inf)
        for name in ("cooldown_frac", "lr_floor"):
            _check_number(name, getattr(self, name), 0.0, 1.0)
        _check_number("muon_momentum", self.muon_momentum, 0.0, 1.0, open_high=True)
        if not isinstance(self.adam_betas, tuple) or len(self.adam_betas) != 2:
            raise SpeedrunError(f"train.adam_betas must be a pair [beta1, beta2], got {self.adam_betas!r}")
        for beta in self.adam_betas:
            _check_number("adam_betas", beta, 0.0, 1.0, open_high=True)
        for name in ("compile", "cautious_weight_decay", "shard_muon"):
            if not isinstance(getattr(self, name), bool):
                raise SpeedrunError(f"train.{name} must be true or false, got {getattr(self, name)!r}")
        if self.normuon_beta2 is not None:
            _check_number("normuon_beta2", self.normuon_beta2, 0.0, 1.0, open_high=True)
        _check_choice("device", self.device, get_args(DeviceChoice))
        _check_choice("dtype", self.dtype, get_args(ComputeDtype))
        _check_choice("orthogonalizer", self.orthogonalizer, ORTHOGONALIZERS)
        if not isinstance(self.model, Mapping):
            raise SpeedrunError(f"train.model must be a mapping of model settings, got {self.model!r}")
        self.model_config()
        self._check_schedules()
        self._check_divisions()

    def _check_schedules(self) -> None:
        schedule = self.window_schedule
        if not isinstance(schedule, tuple) or not all(
                isinstance(pair, tuple) and len(pair) == 2 and all(
                    isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in pair) for pair in schedule):
            raise SpeedrunError(f"train.window_schedule must be a list of [short, long] block counts >= 1, "
                                f"got {schedule!r}")
        if self.final_window_long_blocks is not None:
            _check_int("final_window_long_blocks", self.final_window_long_blocks, 1)
        if self.untie_step is not None:
            _check_int("untie_step", self.untie_step, 0)
            if not self.model_config().tie_embed_head:
                raise SpeedrunError("train.untie_step needs a model with tie_embed_head: true")
        batches = self.batch_schedule
        if not isinstance(batches, tuple) or not all(
                isinstance(pair, tuple) and len(pair) == 2 and all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in pair) for pair in batches):
            raise SpeedrunError(f"train.batch_schedule must be a list of [tokens_per_step, max_seq_len] pairs of "
                                f"positive integers, got {batches!r}")
        if (schedule or self.final_window_long_blocks is not None) and not self.model_config().window_pattern:
            raise SpeedrunError("train.window_schedule and train.final_window_long_blocks need a model "
                                "window_pattern (which layers take the short and the long window)")

    def _check_divisions(self) -> None:
        if self.micro_batches % self.world_size:
            raise SpeedrunError(f"train.micro_batches {self.micro_batches} is not a multiple of "
                                f"train.world_size {self.world_size}")
        for _, tokens, _ in self.batch_stages():
            if tokens % self.micro_batches:
                raise SpeedrunError(f"train.tokens_per_step {tokens} is not a multiple of "
                                    f"train.micro_batches {self.micro_batches}")
        if self.val_tokens % (self.val_batch_tokens * self.world_size):
            raise SpeedrunError(f"train.val_tokens {self.val_tokens} is not a multiple of val_batch_tokens x "
                                f"world_size = {self.val_batch_tokens * self.world_size}")

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> "TrainConfig":
        """Build from a mapping of settings (missing ones take the defaults). Raises :class:`SpeedrunError`
        naming an unknown key, with the valid keys."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in settings:
            if key not in names:
                raise SpeedrunError(f"unknown training setting {key!r}; expected one of {', '.join(names)}")
        values = dict(settings)
        if isinstance(values.get("adam_betas"), list):
            values["adam_betas"] = tuple(values["adam_betas"])
        for key in ("window_schedule", "batch_schedule"):
            if isinstance(values.get(key), list):
                values[key] = tuple(tuple(p) if isinstance(p, list) else p for p in values[key])
        return cls(**values)

    @property
    def micro_batch_tokens(self) -> int:
        """Tokens per forward pass of the first stage: tokens_per_step / micro_batches."""
        return self.batch_stages()[0][1] // self.micro_batches

    def batch_stages(self) -> list[tuple[int, int, int]]:
        """``(first_step, tokens_per_step, max_seq_len)`` per stage of the batch-size schedule
        (:func:`speedrun.optim.schedules.batch_stages`; one stage without a schedule)."""
        return batch_stages(self.steps, self.batch_schedule, self.tokens_per_step, self.max_seq_len)

    def batch_at(self, step: int) -> tuple[int, int]:
        """``(tokens_per_step, max_seq_len)`` of ``step``."""
        return next((tokens, seq_len) for first, tokens, seq_len in reversed(self.batch_stages())
                    if first <= step)

    def train_tokens(self) -> int:
        """Tokens of the whole run: the sum over steps of their tokens per step."""
        bounds = [first for first, _, _ in self.batch_stages()] + [self.steps]
        return sum((bounds[i + 1] - bounds[i]) * tokens for i, (_, tokens, _) in enumerate(self.batch_stages()))

    def model_config(self) -> GPTConfig:
        return build_model_config(self.preset, self.model)

    def window_blocks_at(self, step: int) -> tuple[int, int] | None:
        """The (short, long) windows in blocks for ``step`` (``steps``: the final validation), or None when
        the model keeps its windows."""
        if self.window_schedule:
            return window_blocks(step, self.steps, self.window_schedule, self.final_window_long_blocks)
        if step == self.steps and self.final_window_long_blocks is not None:
            model = self.model_config()
            return model.window_short_blocks, self.final_window_long_blocks
        return None

    def optim_config(self) -> OptimConfig:
        return OptimConfig(embed_lr=self.embed_lr, head_lr=self.head_lr, scalar_lr=self.scalar_lr,
                           adam_betas=self.adam_betas, muon_lr=self.muon_lr, muon_momentum=self.muon_momentum,
                           weight_decay=self.weight_decay, adam_weight_decay=self.adam_weight_decay,
                           orthogonalizer=self.orthogonalizer, normuon_beta2=self.normuon_beta2,
                           cautious_weight_decay=self.cautious_weight_decay, langevin_noise=self.langevin_noise,
                           shard_muon=self.shard_muon)

    def schedule_config(self) -> ScheduleConfig:
        return ScheduleConfig(steps=self.steps, cooldown_frac=self.cooldown_frac, lr_floor=self.lr_floor,
                              momentum_warmup_steps=self.momentum_warmup_steps,
                              momentum_end=self.muon_momentum)

    def to_json(self) -> str:
        """One line of JSON: every setting, with ``model`` resolved to the full model config."""
        settings = dataclasses.asdict(self)
        settings["model"] = dataclasses.asdict(self.model_config())
        return json.dumps(settings, sort_keys=True, separators=(",", ":"))


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SpeedrunError(f"train.{name} must be an integer >= {minimum}, got {value!r}")


def _check_number(name: str, value: Any, low: float, high: float, open_high: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high
    if not ok or (open_high and value >= high):
        bracket = ")" if open_high else "]"
        raise SpeedrunError(f"train.{name} must be a number in [{low}, {high}{bracket}, got {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpeedrunError(f"train.{name} must be one of {', '.join(choices)}; got {value!r}")


@dataclass
class RunResult:
    """What a run ended with: ``status``, and every logged loss at full precision as
    ``(step, "train" | "val", loss)`` in log order."""

    status: RunStatus = "complete"
    losses: list[tuple[int, LossKind, float]] = field(default_factory=list)


@dataclass(frozen=True)
class TrainingData:
    """The validation shard and the train shards (uint16 memory maps) with their BOS indices (int64);
    ``train_sha256``: sha256 of the train shards' manifest entries (file, tokens, sha256) as canonical JSON,
    which identifies the training token stream; ``val_sha256``: sha256 of the validation shard file."""

    val_tokens: np.ndarray
    val_bos: np.ndarray
    train_shards: list[np.ndarray]
    train_bos: list[np.ndarray]
    train_sha256: str = ""
    val_sha256: str = ""


def _read_json(path: Path, stage: str) -> dict[str, Any]:
    if not path.is_file():
        raise SpeedrunError(f"{path}: not found (run the {stage} stage first)")
    return json.loads(path.read_text(encoding="utf-8"))


def load_training_data(shards_dir: str | os.PathLike[str], bos_dir: str | os.PathLike[str]) -> TrainingData:
    """Shards listed in ``shards_dir/manifest.json`` (one ``val``, then the ``train`` ones in order) and
    ``bos_dir/<stem>.npy``. Raises :class:`SpeedrunError` on a missing file, a shard whose length differs
    from the manifest, or a BOS index made from another version of a shard (its sha256 differs)."""
    shards_dir, bos_dir = Path(shards_dir), Path(bos_dir)
    entries = _read_json(shards_dir / "manifest.json", "tokenize")["shards"]
    bos_of = {e["shard"]: e for e in _read_json(bos_dir / "manifest.json", "bos_index")["shards"]}
    val = [e for e in entries if e["split"] == "val"]
    train = [e for e in entries if e["split"] == "train"]
    if len(val) != 1 or not train:
        raise SpeedrunError(f"{shards_dir}/manifest.json must list one val shard and at least one train "
                            f"shard, found {len(val)} and {len(train)}")
    arrays = []
    for entry in val + train:
        tokens = load_shard(shards_dir / entry["file"])
        index = bos_of.get(entry["file"])
        if len(tokens) != entry["tokens"] or index is None or index["shard_sha256"] != entry["sha256"]:
            raise SpeedrunError(f"{shards_dir / entry['file']}: {len(tokens)} tokens (manifest: "
                                f"{entry['tokens']}) or its BOS index in {bos_dir} is missing or stale")
        arrays.append((tokens, np.load(bos_dir / index["file"]).astype(np.int64)))
    stream = [{"file": e["file"], "tokens": e["tokens"], "sha256": e["sha256"]} for e in train]
    return TrainingData(val_tokens=arrays[0][0], val_bos=arrays[0][1],
                        train_shards=[a[0] for a in arrays[1:]], train_bos=[a[1] for a in arrays[1:]],
                        train_sha256=sha256_text(json.dumps(stream, sort_keys=True, separators=(",", ":"))),
                        val_sha256=sha256_file(shards_dir / val[0]["file"]))


def check_data_feeds(config: TrainConfig, data: TrainingData) -> None:
    """Raise :class:`SpeedrunError` unless the train shards feed all ``steps`` and the validation shard
    holds ``val_tokens + 1`` tokens (planning only, no token is read)."""
    stages = [(first, tokens // config.micro_batches, seq_len) for first, tokens, seq_len in config.batch_stages()]
    fed = steps_available([len(s) for s in data.train_shards], data.train_bos, stages[0][1], stages[0][2],
                          config.micro_batches, config.steps, stages)
    if fed < config.steps:
        raise SpeedrunError(f"the train shards feed {fed} steps of {config.tokens_per_step} tokens, fewer "
                            f"than train.steps = {config.steps}; add shards or lower steps")
    if len(data.val_tokens) < config.val_tokens + 1:
        raise SpeedrunError(f"the validation shard holds {len(data.val_tokens)} tokens, fewer than "
                            f"train.val_tokens + 1 = {config.val_tokens + 1}")


def load_config_argument(value: str) -> dict[str, Any]:
    """The ``--config`` value as a dict: a JSON object, or the path of a JSON (``.json``) or YAML file
    holding one. JSON is parsed as JSON (YAML 1.1 would read ``1e-05`` as a string).

    Raises :class:`SpeedrunError` for unreadable text or a value that is not a mapping.
    """
    is_json = value.lstrip().startswith("{")
    text = value
    if not is_json:
        path = Path(value)
        if not path.is_file():
            raise SpeedrunError(f"--config {value!r} is neither a JSON object nor an existing file")
        text, is_json = path.read_text(encoding="utf-8"), path.suffix == ".json"
    try:
        loaded = json.loads(text) if is_json else _load_yaml(text)
    except ValueError as e:
        raise SpeedrunError(f"--config: cannot parse {value[:80]!r}: {e}") from None
    if not isinstance(loaded, dict):
        raise SpeedrunError(f"--config must hold a mapping of training settings, got {type(loaded).__name__}")
    return loaded


def _load_yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(str(e)) from None


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


class TrainClock:
    """Cumulative training wall time (``time.perf_counter``), paused around validation; synchronizes the GPU
    before every reading."""

    def __init__(self, device: torch.device):
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self._total = 0.0
        self._since: float | None = None

    def sync(self) -> None:
        """Wait for the GPU's queued work (nothing on a CPU)."""
        self._sync()

    def start(self) -> None:
        self._sync()
        self._since = _now()

    def stop(self) -> None:
        self._sync()
        if self._since is not None:
            self._total += _now() - self._since
        self._since = None

    def elapsed_ms(self) -> float:
        """Training time so far in ms, including the running interval."""
        self._sync()
        running = _now() - self._since if self._since is not None else 0.0
        return 1000.0 * (self._total + running)


def _now() -> float:
    return time.perf_counter()


def _all_reduce_mean(tensors: list[torch.Tensor], world_size: int) -> None:
    """Average ``tensors`` in place over all ranks, in one flat all-reduce."""
    if world_size == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1).float() for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def train_step(forward: Callable[..., torch.Tensor], model: GPT, micro_batches: list[MicroBatch],
               device: torch.device, autocast: Callable[[], Any], world_size: int, max_seq_len: int,
               self_reduced: frozenset[int] = frozenset()) -> float:
    """Forward and backward over this rank's ``micro_batches`` (gradients accumulate, each loss divided by
    their number; documents at most ``max_seq_len`` tokens), then gradients and loss averaged over ranks,
    except the gradients of the parameters in ``self_reduced`` (ids; the sharded Muon reduce-scatters
    those itself). Returns the step's mean train loss."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    for mb in micro_batches:
        inputs, targets, cu_seqlens = to_torch(mb, device)
        with autocast():
            loss = forward(inputs, targets, cu_seqlens, max_seq_len)
        (loss / len(micro_batches)).backward()
        total += loss.detach().float()
    mean = (total / len(micro_batches)).reshape(1)
    grads = [p.grad for p in model.parameters() if p.grad is not None and id(p) not in self_reduced]
    _all_reduce_mean(grads + [mean], world_size)
    return float(mean.item())


@torch.no_grad()
def evaluate(forward: Callable[..., torch.Tensor], batches: list[Batch], autocast: Callable[[], Any],
             world_size: int) -> float:
    """Mean validation loss (nats/token) over this rank's chunks, averaged over ranks (every rank holds the
    same number of equal-sized chunks, so this is the mean over all val_tokens)."""
    total = torch.zeros((), dtype=torch.float32, device=batches[0][0].device)
    for inputs, targets, cu_seqlens in batches:
        with autocast():
            total += forward(inputs, targets, cu_seqlens, inputs.size(0)).float()
    mean = (total / len(batches)).reshape(1)
    _all_reduce_mean([mean], world_size)
    return float(mean.item())


def _dummy_batch(tokens: int, device: torch.device) -> Batch:
    """A micro-batch of ``tokens`` zeros in one document, with ``cu_seqlens`` padded like the loader's: the
    shapes of a real micro-batch of that size, for compiling."""
    cu_seqlens = torch.from_numpy(padded_cu_seqlens(np.array([0, tokens], dtype=np.int32))).to(device)
    return (torch.zeros(tokens, dtype=torch.int32, device=device),
            torch.zeros(tokens, dtype=torch.int64, device=device), cu_seqlens)


def warm_up_steps(config: TrainConfig) -> list[int]:
    """The steps whose graphs an untimed warm-up compiles: 0, each batch-size and window stage start, the
    untie step (records since #21 warm up on the steps where a shape or a schedule changes)."""
    steps = {0} | {first for first, _, _ in config.batch_stages()}
    if config.window_schedule:
        steps |= set(stage_starts(config.steps, len(config.window_schedule)))
    if config.untie_step is not None and config.untie_step < config.steps:
        steps.add(config.untie_step)
    return sorted(s for s in steps if s < config.steps)

class _Run:
    """The state of one run on this rank: model, optimizers, data, clock and log."""

    def __init__(self, config: TrainConfig, seed: int, data: TrainingData, device: torch.device,
                 launch: Launch, log: RunLog):
        self.config, self.device, self.launch, self.log = config, device, launch, log
        torch.manual_seed(seed)
        self.model = GPT(config.model_config()).to(device)
        if launch.world_size > 1:
            for p in self.model.parameters():
                dist.broadcast(p.data, src=0)
        self.optimizers: Optimizers = build_optimizers(
            self.model, self.model.parameter_kinds(), dataclasses.replace(config.optim_config(), langevin_seed=seed))
        self.forward = self._compiled() if config.compile else self.model
        self.batches = BosAlignedBatches(data.train_shards, data.train_bos, config.micro_batch_tokens,
                                         config.batch_at(0)[1])
        self.val = [to_torch(mb, device) for mb in validation_batches(
            data.val_tokens, data.val_bos, config.val_tokens, config.val_batch_tokens, launch.rank,
            launch.world_size)]
        enabled = config.dtype == "bfloat16"
        self.autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)
        self.clock = TrainClock(device)
        self.result = RunResult()

    def _compiled(self) -> Callable[..., torch.Tensor]:
        """The model under ``torch.compile`` with static shapes (the record compiles the same way). Every
        batch shape, window setting and tie state is one graph; the recompile limit leaves room for them."""
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        return torch.compile(self.model, dynamic=False)

    def evaluate(self, batches: list[Batch], world_size: int) -> float:
        """:func:`evaluate` with the model in evaluation mode (no FP8), back in training mode after."""
        self.model.eval()
        try:
            return evaluate(self.forward, batches, self.autocast, world_size)
        finally:
            self.model.train()

    def set_windows(self, step: int) -> None:
        """Give the model the attention windows of ``step`` (YaRN rescales on growth, in the model)."""
        blocks = self.config.window_blocks_at(step)
        if blocks is not None:
            self.model.set_window_blocks(*blocks)

    def validate(self, step: int) -> bool:
        """Validate with the clock stopped and log the line; False when the loss is not finite."""
        self.clock.stop()
        self.set_windows(step)
        val_loss = self.evaluate(self.val, self.launch.world_size)
        self.log.write(val_line(step, self.config.steps, val_loss, self.clock.elapsed_ms()))
        self.result.losses.append((step, "val", val_loss))
        self.clock.start()
        return math.isfinite(val_loss)

    def train(self, step: int) -> bool:
        """Optimizer step ``step`` (0-based) and its log line; False (and no update) on a non-finite loss."""
        cfg = self.config
        self.optimizers.apply_schedule(step, cfg.schedule_config())
        self.set_windows(step)
        if step == cfg.untie_step and self.model.tied:
            self.model.untie_embed_head()
            self.optimizers.copy_state(self.model.lm_head.weight, self.model.embed.weight)
        tokens, max_seq_len = cfg.batch_at(step)
        if (tokens // cfg.micro_batches, max_seq_len) != (self.batches.micro_batch_tokens, self.batches.max_seq_len):
            self.batches.set_batch(tokens // cfg.micro_batches, max_seq_len)
        mine = self.batches.next_step(cfg.micro_batches, self.launch.rank, self.launch.world_size)
        loss = train_step(self.forward, self.model, mine, self.device, self.autocast, self.launch.world_size,
                          max_seq_len, self.optimizers.self_reduced_parameters())
        if math.isfinite(loss):
            self.optimizers.step()
        self.optimizers.zero_grad()
        self.log.write(train_line(step + 1, cfg.steps, loss, self.clock.elapsed_ms()))
        self.result.losses.append((step + 1, "train", loss))
        return math.isfinite(loss)

    def warm_up(self) -> float:
        """Compile and warm up (only with ``compile``); returns the seconds it took, outside train_time.

        Runs a forward and backward on dummy micro-batches for each of :func:`warm_up_steps` (with that
        step's batch shape, windows and tie state) and the validation forward with the final windows, so
        that no graph is compiled inside the timed region; then puts back the schedule state (windows,
        YaRN frequencies and scale, tie) and clears the gradients. No parameter changes."""
        start = _now()
        if not self.config.compile:
            return 0.0
        model, cfg = self.model, self.config
        saved = (model.window_blocks, model.rotary_frequencies.clone(), model.attention_scale, model.tied)
        for step in warm_up_steps(cfg):
            self.set_windows(step)
            model.tied = saved[3] and (cfg.untie_step is None or step < cfg.untie_step)
            tokens, max_seq_len = cfg.batch_at(step)
            inputs, targets, cu_seqlens = _dummy_batch(tokens // cfg.micro_batches, self.device)
            with self.autocast():
                self.forward(inputs, targets, cu_seqlens, max_seq_len).backward()
        for step in sorted({0, cfg.steps}):
            self.set_windows(step)
            self.evaluate(self.val[:1], world_size=1)
        model.window_blocks, model.attention_scale, model.tied = saved[0], saved[2], saved[3]
        model.rotary_frequencies.copy_(saved[1])
        model.zero_grad(set_to_none=True)
        self.clock.sync()
        return _now() - start

    def run(self) -> RunResult:
        """The training loop; the result's status is ``complete`` or ``diverged`` (after logging why)."""
        cfg = self.config
        self.clock.start()
        for step in range(cfg.steps + 1):
            if step == cfg.steps or step == 0 or (cfg.val_every and step % cfg.val_every == 0):
                if not self.validate(step):
                    return self._diverged("val_loss", step)
            if step == cfg.steps:
                break
            if not self.train(step):
                return self._diverged("train_loss", step + 1)
        self.log.write(peak_memory_line(*peak_memory_mib(self.device)))
        return self.result

    def _diverged(self, what: str, step: int) -> RunResult:
        self.log.write(peak_memory_line(*peak_memory_mib(self.device)))
        self.log.write(f"run diverged: non-finite {what} at step {step}")
        self.result.status = "diverged"
        return self.result


def run_training(config: TrainConfig, *, variant: str, seed: int, shards_dir: str | os.PathLike[str],
                 bos_dir: str | os.PathLike[str], log_path: str | os.PathLike[str],
                 env: Mapping[str, str] | None = None, gpus: GpuRequirement = GpuRequirement()) -> RunResult:
    """Train one run and write its log to ``log_path`` (rank 0). Returns its :class:`RunResult` (status
    ``complete`` or ``diverged``, and the losses).

    ``env``: the launch variables (default ``os.environ``). ``gpus``: what a GPU run's GPUs must be; this
    node must show one per local process (:func:`speedrun.preflight.preflight`). Raises
    :class:`SpeedrunError` before anything is written when the world size, GPUs, device or data do not fit
    the config; any error during training is logged as ``run failed: ...`` and re-raised.
    """
    env = os.environ if env is None else env
    launch = Launch(env)
    launch.check(config)
    preflight(config.device, gpus, env, config.world_size)
    device = resolve_device(config.device, launch.local_rank)
    data = load_training_data(shards_dir, bos_dir)
    check_data_feeds(config, data)
    header = _header(config, variant, seed, launch, device, data)
    with _process_group(launch, device):
        log = RunLog(log_path if launch.rank == 0 else None)
        written = False
        try:
            run = _Run(config, seed, data, device, launch, log)
            header["compile_s"] = f"{run.warm_up():.1f}"
            _write_header(log, header)
            written = True
            result = run.run()
        except BaseException as e:
            if not written:
                _write_header(log, header)
            log.write(peak_memory_line(*peak_memory_mib(device)))
            log.write(f"run failed: {type(e).__name__}: {' '.join(str(e).split())}")
            log.finish()
            raise
        log.finish()
    return result


def _header(config: TrainConfig, variant: str, seed: int, launch: Launch, device: torch.device,
            data: TrainingData) -> dict[str, Any]:
    """The header fields (docs/formats.md "Training log"; the provenance keys the log parser reads)."""
    settings = config.to_json()
    return {"speedrun": __version__, "variant": variant, "seed": seed, "config": settings,
            "config_sha256": sha256_text(settings), **code_version(),
            "world_size": launch.world_size, "tokens_per_step": config.tokens_per_step,
            "val_tokens": config.val_tokens, "train_data_sha256": data.train_sha256,
            "val_data_sha256": data.val_sha256, "device": device_description(device, launch.world_size)}


def _write_header(log: RunLog, header: Mapping[str, Any]) -> None:
    for line in header_lines(header) + environment_lines():
        log.write(line)
    log.write(SEPARATOR)


@contextlib.contextmanager
def _process_group(launch: Launch, device: torch.device):
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True,
                        help="training settings: a JSON object, or a JSON/YAML file holding one")
    parser.add_argument("--variant", required=True, help="variant name (written to the log header)")
    parser.add_argument("--seed", required=True, type=int, help="seed of the initialization")
    parser.add_argument("--shards-dir", required=True, help="the tokenize stage's folder (manifest.json)")
    parser.add_argument("--bos-dir", required=True, help="the bos_index stage's folder (one .npy per shard)")
    parser.add_argument("--out", dest="log", required=True,
                        help="the training log to write (written under a temporary name, renamed at the end)")
    parser.add_argument("--gpu-model", default="",
                        help="text every GPU's name must contain (config.yaml cluster.gpu_model; default: any)")
    parser.add_argument("--gpu-memory-gib", type=float, default=0.0,
                        help="least memory per GPU in GiB (config.yaml cluster.gpu_memory_gib; default: any)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads per process (default: torch's, i.e. OMP_NUM_THREADS)")
    parser.add_argument("--compile-cache", type=Path, default=None,
                        help="folder of the persistent Inductor and Triton caches shared by every run (a run "
                             "that compiles the same graphs with the same code and versions reuses them)")


def use_compile_cache(folder: Path, env: MutableMapping[str, str]) -> None:
    """Point Inductor's and Triton's on-disk caches into ``folder`` (``inductor/``, ``triton/``), unless the
    user set TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR already. Their entries are keyed by the graph, the
    code and the torch/Triton/CUDA versions, so runs of one model shape share them: the second seed of a
    variant skips the compilation (modded-nanogpt #19 reports about 7 minutes of cold compile)."""
    folder = folder.resolve()
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(folder / "triton"))


def main(args: argparse.Namespace) -> int:
    config = TrainConfig.from_dict(load_config_argument(args.config))
    if args.threads is not None:
        if args.threads < 1:
            raise SpeedrunError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.compile_cache is not None:
        use_compile_cache(args.compile_cache, os.environ)
    run_training(config, variant=args.variant, seed=args.seed, shards_dir=args.shards_dir,
                 bos_dir=args.bos_dir, log_path=args.log,
                 gpus=GpuRequirement(args.gpu_model, args.gpu_memory_gib))
    return 0
