"""One (variant, seed) training run of the speedrun GPT, with its training log: :func:`run_training`.

Runs standalone (world size 1) or under ``torchrun --standalone --nproc_per_node=N --no-python speedrun
train ...`` (RANK, WORLD_SIZE and LOCAL_RANK from the environment; gloo on CPU, NCCL on CUDA). Each optimizer
step takes ``tokens_per_step`` tokens in ``micro_batches`` micro-batches from the BOS-aligned loader; rank r
runs ``micro_batches / world_size`` of them with gradient accumulation and the gradients are averaged over
ranks, so a step sees the same tokens whatever the world size (speedrun-spec.md 1.3). The seed sets the
initialization only: the token stream is the same for every seed, as in the public speedrun.

The loop validates at step 0, every ``val_every`` steps and at the last step with the clock stopped (the
speedrun's timing rule, speedrun-spec.md 1.4); ``train_time`` counts training wall time only. A diverged run
(a non-finite loss, a val_loss above its step-0 value or a smoothed train loss above its first value:
:mod:`speedrun.support.divergence`) stops as soon as the loss is read (a train loss one step later: the loop
queues a step before it reads the previous one's loss, :class:`StepLoss`) and the log ends with ``run diverged:
<why>`` (exit status 0:
the run is reported as ``diverged``, never counted, never dropped); an exception writes ``run failed: <type>: <message>`` and propagates. The log
(docs/formats.md "Training log", :mod:`speedrun.training.runlog`) is renamed to its path only at the end, a
failed run's too (so that the failure is reported, as ``failed`` by the log parser).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from speedrun.support.stopping import RunStopped  # first: before torch's import
from speedrun.support.divergence import DivergenceWatch
from speedrun.support.cpu_math import resolve_cpu_math_dispatch
from speedrun.support.phases import RunPhases

import numpy as np
import torch
import torch.distributed as dist

from speedrun import __version__
from speedrun.data.loader import padded_cu_seqlens, to_torch, train_batches, validation_batches
from speedrun.data.prefetch import StepPrefetcher
from speedrun.data.shards import sha256_text
from speedrun.errors import SpeedrunError
from speedrun.model.gpt import GPT
from speedrun.optim.adam import set_adam_eps
from speedrun.optim.groups import Optimizers, build_optimizers
from speedrun.training.compile_cache import allow_training_graph_cache
from speedrun.training.config import TrainConfig, resolve_dtype
from speedrun.training.data import TrainingData, check_data_feeds, load_training_data
from speedrun.training.launch import Launch, process_group, resolve_device
from speedrun.training.preflight import GpuRequirement, preflight
from speedrun.training.runlog import (SEPARATOR, RunLog, code_version, device_description, environment_lines,
                                      header_lines, peak_memory_line, peak_memory_mib, train_line,
                                      val_line)

RunStatus = Literal["complete", "diverged"]
LossKind = Literal["train", "val"]
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class RunResult:
    """What a run ended with: ``status``, every logged loss at full precision as ``(step, "train" | "val",
    loss)`` in log order, and for a diverged run why (``reason``, the text of its ``run diverged:`` line)."""

    status: RunStatus = "complete"
    losses: list[tuple[int, LossKind, float]] = field(default_factory=list)
    reason: str | None = None


class TrainClock:
    """Cumulative training wall time (``time.perf_counter``), paused around validation; synchronizes the GPU
    before every reading (start, stop, :meth:`elapsed_ms`), except :meth:`elapsed_ms_at`, which reads a step's
    end from its CUDA timing event instead."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._sync = torch.cuda.synchronize if self._cuda else (lambda: None)
        self._start_event: torch.cuda.Event | None = None
        self._total = 0.0
        self._since: float | None = None

    def sync(self) -> None:
        """Wait for the GPU's queued work (nothing on a CPU)."""
        self._sync()

    def start(self) -> None:
        self._sync()
        self._since = _now()
        self._start_event = _timing_event() if self._cuda else None

    def elapsed_ms_at(self, event: torch.cuda.Event) -> float:
        """Training time in ms when the GPU reached ``event`` (a completed timing event recorded while the clock
        ran, :class:`StepLoss`): the intervals before plus the GPU's time from this interval's start to the
        event. No host sync: the time of a step's end, read after the next step is queued. A clock that is not
        running (never started: a step run outside the loop, as benchmarks/gpu_speedrun.py's profile does)
        gives the intervals before alone."""
        if self._since is None or self._start_event is None:
            return 1000.0 * self._total
        return 1000.0 * self._total + self._start_event.elapsed_time(event)

    def stop(self) -> None:
        self._sync()
        if self._since is not None:
            self._total += _now() - self._since
        self._since = None

    def elapsed_ms(self) -> float:
        """Training time so far in ms, including the running interval (synchronizes the GPU)."""
        self._sync()
        running = _now() - self._since if self._since is not None else 0.0
        return 1000.0 * (self._total + running)


def _now() -> float:
    return time.perf_counter()


def _timing_event() -> torch.cuda.Event:
    """A CUDA event with timing, recorded now on the current stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class StepLoss:
    """A step's mean train loss on its way to the host without a device sync: on CUDA a non-blocking copy into
    pinned memory and a timing ``event`` behind it (the step's end, :meth:`TrainClock.elapsed_ms_at`), so that
    the host can queue the next step before it waits for this one (the records never wait between steps; a wait
    right after the step leaves the GPU idle until the next step's first kernels are queued). Elsewhere the
    value at once and ``event`` None. ``mean``: (1,) fp32 on the device."""

    def __init__(self, mean: torch.Tensor):
        self.event: torch.cuda.Event | None = None
        if mean.is_cuda:
            self._host = torch.empty(1, dtype=torch.float32, pin_memory=True)
            self._host.copy_(mean, non_blocking=True)
            self.event = _timing_event()
        else:
            self._host = mean.detach().float()

    def value(self) -> float:
        """The loss, waiting for the step's work to finish on the device (only up to this step's end)."""
        if self.event is not None:
            self.event.synchronize()
        return float(self._host[0])


def _all_reduce_mean(tensors: list[torch.Tensor], world_size: int) -> None:
    """Average ``tensors`` in place over all ranks: one flat all-reduce per dtype, in that dtype (bf16 for the
    gradients of bf16 weights, as the records reduce theirs; fp32 for the rest)."""
    if world_size == 1 or not tensors:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= world_size
        offset = 0
        for t in group:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def store_weights(model: GPT, weight_dtype: str) -> None:
    """Store ``model``'s weights as ``TrainConfig``'s ``weight_dtype`` says: ``bfloat16``, all but the scalars
    and lambdas (records #57-#89); ``bfloat16_embeddings``, the embedding tables (records #12, #31); ``float32``
    nothing to do (:meth:`speedrun.model.gpt.GPT.store_weights`)."""
    if weight_dtype == "bfloat16":
        model.store_weights(torch.bfloat16)
    elif weight_dtype == "bfloat16_embeddings":
        model.store_weights(torch.bfloat16, kinds=("embed",))


def train_step(forward: Callable[..., torch.Tensor], model: GPT, micro_batches: list[Batch],
               device: torch.device, autocast: Callable[[], Any], world_size: int, max_seq_len: int,
               self_reduced: frozenset[int] = frozenset(),
               loss_weights: Mapping[str, torch.Tensor] | None = None, loss_scale: float = 1.0) -> torch.Tensor:
    """Forward and backward over this rank's ``micro_batches`` ((inputs, targets, cu_seqlens) on ``device``,
    as :func:`speedrun.data.loader.to_torch` gives them; gradients accumulate, each loss times ``loss_scale``
    divided by their number (``TrainConfig.loss_scale_at``: 1, or the records' sum over a micro-batch's tokens);
    documents at most ``max_seq_len`` tokens), then gradients and loss averaged over ranks, except
    the gradients of the parameters in ``self_reduced`` (ids: the sharded Muon reduce-scatters those
    itself, and Adam's, kept between its updates, are averaged at its next one: ``OptimConfig.adam_every``);
    a tied model's embedding gradient is first folded into the head's
    (:meth:`speedrun.model.gpt.GPT.fold_tied_gradients`). Returns the step's mean train loss as a (1,) fp32
    tensor on ``device``, not read back: the caller queues the optimizer step before waiting for it (no host
    sync inside a step, as in the records). ``loss_weights``: keyword tensors of the model's forward
    (``mtp_weights``, ``prefix_weight``: :func:`loss_weight_tensors`); None: the next-token loss."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    for inputs, targets, cu_seqlens in micro_batches:
        with autocast():
            loss = forward(inputs, targets, cu_seqlens, max_seq_len, **(loss_weights or {}))
        accumulate_gradients(loss * loss_scale / len(micro_batches), params)   # x 1.0: bit for bit the mean's
        total += loss.detach().float()
    mean = (total / len(micro_batches)).reshape(1)
    model.fold_tied_gradients()
    grads = [p.grad for p in model.parameters() if p.grad is not None and id(p) not in self_reduced]
    _all_reduce_mean(grads + [mean], world_size)
    return mean


def accumulate_gradients(loss: torch.Tensor, params: list[torch.Tensor]) -> None:
    """``loss.backward()`` into the ``.grad`` of ``params`` (every trainable parameter), with the sums done in one
    multi-tensor add: the new gradients come back from ``torch.autograd.grad``; a parameter without a gradient
    takes its new one as it is (contiguous), the others get theirs added by ``torch._foreach_add_``. Autograd's
    own accumulation launches an add kernel per parameter and micro-batch: 114 parameters x 7 micro-batches a
    step for the record88 preset, where the records, whose parameters are a score of banks, launch about 15 x 7
    (session 37's profile: 660 add kernels a step against 104). The same sums, bit for bit; the micro-batch's
    new gradients are held together until the add (one set of gradients more memory at that moment)."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    held, new = [], []
    for p, g in zip(params, grads):
        if g is None:
            continue
        if p.grad is None:
            p.grad = g if g.is_contiguous() else g.contiguous()
        else:
            held.append(p.grad)
            new.append(g)
    if held:
        torch._foreach_add_(held, new)


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


def prepare_optimizers(config: TrainConfig, optimizers: Optimizers, model: GPT, step: int) -> bool:
    """The optimizer side of training step ``step`` (0-based) before its backward passes: the lr factor and Muon
    momentum of the step (a staged schedule's values, else the plain schedule's), the records' Adam ε of the step
    where its units differ from the loss's, and at the untie step the embedding untied from the head with the
    head's optimizer state copied to it (record #88's split). Returns whether Adam updates after this step
    (record #39: odd steps only; :meth:`Optimizers.adam_updates_after`)."""
    staged = config.schedule.staged_schedule
    if staged is None:
        optimizers.apply_schedule(step, config.schedule_config())
    else:
        optimizers.apply_values(step, staged.lr_factor(step), staged.muon_momentum(step), config.schedule_config())
    if config.optimizer.adam_eps_units != config.optimizer.loss_units:
        set_adam_eps(optimizers.optimizers, config.adam_eps_at(step))                # the records' ε, per stage
    if step == config.untie_step() and model.tied:
        model.untie_embed_head()
        optimizers.copy_state(model.lm_head.weight, model.embed.weight)
    return optimizers.adam_updates_after(step)


def finish_optimizer_step(optimizers: Optimizers, model: GPT, adam: bool) -> None:
    """Queue the updates of a step whose gradients are in place (Adam's only when ``adam``, as
    :func:`prepare_optimizers` returned), clear the gradients they consumed (Adam's are kept until its next
    update), then the model's after-step work (the tied copy, the next step's FP8 weights)."""
    optimizers.step(adam=adam)
    optimizers.zero_grad(adam=adam)
    model.after_optimizer_step()


def loss_weight_tensors(config: TrainConfig, step: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The forward's loss-weight keywords of training step ``step`` under a staged schedule
    (:meth:`TrainConfig.loss_weights_at`): ``mtp_weights`` (K,) fp32 and, with the model's prefix-token loss,
    ``prefix_weight`` 0-d fp32, built on ``device``; empty without a staged schedule. K changes between
    stages (a graph each, :func:`warm_up_plan`). The values change nearly every step; on CUDA they travel through
    pinned memory without a wait (a copy from pageable memory would wait for the queued work)."""
    weights = config.loss_weights_at(step)
    if weights is None:
        return {}
    mtp, prefix = weights
    tensors = {"mtp_weights": _on_device(mtp, device)}
    if prefix is not None:
        tensors["prefix_weight"] = _on_device(prefix, device)
    return tensors


def _on_device(values: float | Sequence[float], device: torch.device) -> torch.Tensor:
    """``values`` as an fp32 tensor on ``device``: on CUDA from pinned memory, non-blocking."""
    host = torch.tensor(values, dtype=torch.float32, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def last_step(config: TrainConfig, stop_step: int | None = None) -> int:
    """The run's last step, validated and not trained: ``config.steps``, or ``stop_step`` for a run stopped
    there (:func:`run_training`)."""
    return config.steps if stop_step is None else stop_step


def validation_steps(config: TrainConfig, stop_step: int | None = None) -> list[int]:
    """The steps validated before their update: 0, every ``val_every`` steps and the last (``steps``, or
    ``stop_step`` for a run stopped there: :func:`run_training`)."""
    last = last_step(config, stop_step)
    every = set(range(0, last, config.evaluation.val_every)) if config.evaluation.val_every else set()
    return sorted({0, last} | every)


def warm_up_plan(config: TrainConfig, stop_step: int | None = None) -> list[tuple[int, LossKind]]:
    """``(step, "val" | "train")`` in the order the run meets them, covering every graph the run compiles:
    the first validation step of each window state, and the training steps of :func:`warm_up_steps`. The
    tie state changes no graph (:class:`speedrun.model.gpt.GPT` reads the embedding's copy either way).
    With the ``flex`` backend the model takes the windows (and YaRN's scale) as graph inputs, so only the
    first step of each (train or val, training batch shape) is kept. Replayed in this order, the windows
    grow (and YaRN rescales) as in the run, so each graph is compiled with the values it will see. A run
    stopped at ``stop_step`` (:func:`run_training`) meets only the steps up to it, so the later stages'
    graphs are left out."""
    windows_are_inputs = config.model_config().schedule_as_graph_inputs
    steps = [(step, "val") for step in validation_steps(config, stop_step)]
    steps += [(step, "train") for step in warm_up_steps(config, stop_step)]
    seen, plan = set(), []
    for step, kind in sorted(steps, key=lambda p: (p[0], p[1] == "train")):    # a step's validation first
        if windows_are_inputs:
            key = (kind, (config.batch_at(step), _mtp_count(config, step)) if kind == "train" else None)
        else:         # every training stage start: the windows and YaRN's scale (a float here) change there
            key = (kind, step) if kind == "train" else (kind, config.window_blocks_at(step))
        if key not in seen:
            seen.add(key)
            plan.append((step, kind))
    return plan


def warm_up_line(config: TrainConfig, index: int, count: int, step: int, kind: LossKind, seconds: float) -> str:
    """One line of the warm-up's progress, printed on rank 0's stderr as each graph of :func:`warm_up_plan` is
    compiled (a cold compile of a record preset takes minutes per graph, so that a long silence reads as work,
    not a hang), e.g. ``warm-up 2/8: train graph of step 0 (131072 tokens per step, max_seq_len 896, windows
    [1, 3] blocks): 96.4 s``. ``seconds``: the graph's compile and first run, in s."""
    blocks = config.window_blocks_at(step)
    windows = "the model's windows" if blocks is None else f"windows {list(blocks)} blocks"
    if kind == "train":
        tokens, max_seq_len = config.batch_at(step)
        what = f"train graph of step {step} ({tokens} tokens per step, max_seq_len {max_seq_len}, {windows})"
    else:
        what = f"validation graph of step {step} ({windows})"
    return f"warm-up {index}/{count}: {what}: {seconds:.1f} s"


def _mtp_count(config: TrainConfig, step: int) -> int:
    """The number of multi-token-prediction weights of ``step`` (1 without a staged schedule): a graph each."""
    weights = config.loss_weights_at(step)
    return 1 if weights is None else len(weights[0])


def warm_up_steps(config: TrainConfig, stop_step: int | None = None) -> list[int]:
    """The training steps where a graph may change: 0, each batch-size and window stage start (records since
    #21 warm up on the steps where a shape or a schedule changes; a staged schedule's stage starts, where the
    number of MTP weights changes too, are its batch stages). :func:`warm_up_plan` replays them, all
    or (windows as graph inputs) one per graph; only those before ``stop_step`` for a run stopped there."""
    steps = {0} | {first for first, _, _ in config.batch_stages()}
    steps |= set(config.window_stage_starts())
    return sorted(s for s in steps if s < last_step(config, stop_step))


class _Run:
    """The state of one run on this rank: model, optimizers, data, clock and log."""

    def __init__(self, config: TrainConfig, seed: int, data: TrainingData, device: torch.device,
                 launch: Launch, log: RunLog, phases: RunPhases, stop_step: int | None = None):
        self.config, self.device, self.launch, self.log, self.phases = config, device, launch, log, phases
        self.last_step = last_step(config, stop_step)                         # validated, then the loop ends
        with phases.timed("model"):
            torch.manual_seed(seed)
            with torch.device(device):                       # initialized where it trains: on a GPU, not ~10 s
                self.model = GPT(config.model_config())      # of host init and copy (record88 preset, issue 21)
            self.model.to(device)                             # (the few tables built on the CPU on purpose)
            store_weights(self.model, config.compute.weight_dtype)
            if launch.world_size > 1:
                for p in self.model.parameters():
                    dist.broadcast(p.data, src=0)
            self.model.use_fp8_weight_cache(True)                # FP8 weights quantized once per step (issue 6;
            self.model.quantize_fp8_weights()                     # no-ops without FP8), before the warm-up compiles
        with phases.timed("optimizer"):
            self.optimizers: Optimizers = build_optimizers(      # on CUDA, Muon compiled as the records'
                self.model, self.model.parameter_kinds(), dataclasses.replace(config.optimizer, langevin_seed=seed),
                compile_muon=config.compute.compile and device.type == "cuda")
        with phases.timed("model"):                              # the torch.compile wrapper (lazy: no compile yet)
            self.forward = self._compiled() if config.compute.compile else self.model
        with phases.timed("data"):
            self.batches = train_batches(config.train_batches, data.train_shards, data.train_bos,
                                         config.micro_batch_tokens, config.batch_at(0)[1])
            self.val = [to_torch(mb, device) for mb in validation_batches(
                data.val_tokens, data.val_bos, config.evaluation.val_tokens, config.evaluation.val_batch_tokens,
                launch.rank, launch.world_size)]
        enabled = resolve_dtype(config.compute.dtype, device.type) == "bfloat16"      # dtype auto: bf16 on CUDA only
        self.autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)
        self.clock = TrainClock(device)
        self.result = RunResult()
        self.watch = DivergenceWatch()
        self.prefetch: StepPrefetcher | None = None
        self.pending: tuple[int, StepLoss] | None = None          # the last queued step's train line, unwritten

    def step_batches(self, step: int) -> list[Batch]:
        """This rank's micro-batches of ``step`` on the device, prepared one step ahead by a
        :class:`speedrun.data.prefetch.StepPrefetcher` (started at the first step asked for)."""
        if self.prefetch is None:
            cfg = self.config

            def shape_at(s: int) -> tuple[int, int]:
                tokens, max_seq_len = cfg.batch_at(s)
                return tokens // cfg.micro_batches, max_seq_len

            self.prefetch = StepPrefetcher(self.batches, cfg.steps, shape_at, cfg.micro_batches,
                                           self.launch.rank, self.launch.world_size, self.device)
            begin = _now()
            first = self.prefetch.get(step)
            self.phases.first_batch = _now() - begin                # inside train_time: not a phase of its own
            return first
        return self.prefetch.get(step)

    def flush_after_failure(self) -> None:
        """Write the pending train line of a run that is failing, if its loss can still be read (a failed device
        may not give it: then the line is left out, the failure itself is logged either way)."""
        try:
            self.flush()
        except Exception:                              # noqa: BLE001 (the run's own error is the one to report)
            self.pending = None

    def close(self) -> None:
        """Stop the prefetching thread, if one runs."""
        if self.prefetch is not None:
            self.prefetch.close()

    def _compiled(self) -> Callable[..., torch.Tensor]:
        """The model under ``torch.compile`` with static shapes (the record compiles the same way). Every
        batch shape is one graph (for training and for validation), and every window setting too unless
        the model takes the windows as graph inputs (FlexAttention; :func:`warm_up_plan`); the recompile
        limit leaves room."""
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        allow_training_graph_cache()
        mode = None if self.config.compute.compile_mode == "default" else self.config.compute.compile_mode
        return torch.compile(self.model, dynamic=False, mode=mode)

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
            self.model.set_window_blocks(*blocks, rescale=self.config.yarn_at_window_change(step))

    def validate(self, step: int) -> str | None:
        """Validate with the clock stopped and log the line (the time from the clock's stop to its restart
        counted as the phase ``validation``), after the pending train line (:meth:`flush`); why the run has
        diverged, or None."""
        why = self.flush()
        if why:
            return why
        self.clock.stop()
        begin = _now()
        self.set_windows(step)
        val_loss = self.evaluate(self.val, self.launch.world_size)
        self.log.write(val_line(step, self.config.steps, val_loss, self.clock.elapsed_ms()))
        self.result.losses.append((step, "val", val_loss))
        self.phases.add("validation", _now() - begin)
        self.phases.validations += 1
        self.clock.start()
        return self.watch.val(step, val_loss)

    def train(self, step: int) -> str | None:
        """Queue optimizer step ``step`` (0-based), then write the previous step's train line (:meth:`flush`):
        the host waits for the previous step only once this one is queued, so the GPU never idles between
        steps (no device sync inside the loop, as the records). Returns why the run has diverged, or None; a
        diverged loss stops the run one step after the step that produced it (that step's update queued, its
        line never written)."""
        cfg = self.config
        self.set_windows(step)
        adam = prepare_optimizers(cfg, self.optimizers, self.model, step)
        max_seq_len = cfg.batch_at(step)[1]
        self.phases.mark_first_step()
        mine = self.step_batches(step)
        mean = train_step(self.forward, self.model, mine, self.device, self.autocast, self.launch.world_size,
                          max_seq_len, self.optimizers.unreduced_parameters(step),
                          loss_weights=loss_weight_tensors(cfg, step, self.device),
                          loss_scale=cfg.loss_scale_at(step))
        finish_optimizer_step(self.optimizers, self.model, adam)
        why = self.flush()
        self.pending = (step + 1, StepLoss(mean))
        if self.pending[1].event is None:            # nothing runs ahead on a CPU: the line at once, at its time
            why = why or self.flush()
        return why

    def flush(self) -> str | None:
        """Write the pending train line (the last queued step's loss, waiting for that step's end) with the
        training time at that step's end (on CUDA the GPU's, from the step's timing event, without a device
        sync); why the run has diverged, or None (also when nothing is pending)."""
        if self.pending is None:
            return None
        (step, loss), self.pending = self.pending, None
        value = loss.value()
        ms = self.clock.elapsed_ms() if loss.event is None else self.clock.elapsed_ms_at(loss.event)
        self.log.write(train_line(step, self.config.steps, value, ms))
        self.result.losses.append((step, "train", value))
        return self.watch.train(step, value)

    def warm_up(self) -> float:
        """Compile and warm up (only with ``compile``); returns the seconds it took, outside train_time.

        Replays :func:`warm_up_plan`: a forward and backward on dummy micro-batches for each training step
        in it (with that step's batch shape and windows) and a validation forward on one chunk for each
        validation step in it, so that no graph is compiled during the run; then puts back the schedule
        state (windows, YaRN frequencies and scale) and clears the gradients, and compiles the optimizers'
        compiled parts (:meth:`speedrun.optim.groups.Optimizers.warm_up`). No parameter or optimizer state
        changes. Its seconds are also the phase ``compile``."""
        start = _now()
        if not self.config.compute.compile:
            return 0.0
        model, cfg = self.model, self.config
        saved = model.schedule_state()
        plan = warm_up_plan(cfg, self.last_step)
        for i, (step, kind) in enumerate(plan, 1):
            begin = _now()
            self.set_windows(step)
            if kind == "val":
                self.evaluate(self.val[:1], world_size=1)
            else:
                tokens, max_seq_len = cfg.batch_at(step)
                inputs, targets, cu_seqlens = _dummy_batch(tokens // cfg.micro_batches, self.device)
                weights = loss_weight_tensors(cfg, step, self.device)     # the stage's number of MTP weights
                with self.autocast():
                    self.forward(inputs, targets, cu_seqlens, max_seq_len, **weights).backward()
            self.clock.sync()
            if self.launch.rank == 0:
                print(warm_up_line(cfg, i, len(plan), step, kind, _now() - begin), file=sys.stderr, flush=True)
        model.restore_schedule_state(saved)
        model.zero_grad(set_to_none=True)
        begin = _now()
        self.optimizers.warm_up()                                 # Muon's compiled bank directions
        self.clock.sync()
        if self.launch.rank == 0:
            print(f"warm-up: the optimizers' compiled parts: {_now() - begin:.1f} s", file=sys.stderr, flush=True)
        seconds = _now() - start
        self.phases.add("compile", seconds)
        return seconds

    def run(self) -> RunResult:
        """The training loop, then the ``peak memory`` line; the result's status is ``complete`` or
        ``diverged`` (with why: the caller writes the ``run diverged:`` line, after the teardown). The
        training time is counted as the phase ``training``, also when the loop raises."""
        try:
            self._loop()
        finally:
            self.clock.stop()
            self.phases.add("training", self.clock.elapsed_ms() / 1000.0)
        self.log.write(peak_memory_line(*peak_memory_mib(self.device)))
        return self.result

    def _loop(self) -> None:
        cfg, last = self.config, self.last_step
        self.clock.start()
        for step in range(last + 1):
            if step == last or step == 0 or (cfg.evaluation.val_every and step % cfg.evaluation.val_every == 0):
                why = self.validate(step)
                if why:
                    return self._diverged(why)
            if step == last:
                break
            why = self.train(step)
            if why:
                return self._diverged(why)

    def _diverged(self, why: str) -> None:
        self.result.status, self.result.reason = "diverged", why


def run_training(config: TrainConfig, *, variant: str, seed: int, shards_dir: str | os.PathLike[str],
                 bos_dir: str | os.PathLike[str], log_path: str | os.PathLike[str],
                 env: Mapping[str, str] | None = None, gpus: GpuRequirement = GpuRequirement(),
                 phases: RunPhases | None = None, stop_step: int | None = None) -> RunResult:
    """Train one run and write its log to ``log_path`` (rank 0). Returns its :class:`RunResult` (status
    ``complete`` or ``diverged``, and the losses).

    ``env``: the launch variables (default ``os.environ``). ``gpus``: what a GPU run's GPUs must be; this
    node must show one per local process (:func:`speedrun.training.preflight.preflight`). ``phases``: where
    the run's phases are counted (default: a :class:`~speedrun.support.phases.RunPhases` from the process's
    start, built now); the log's ``phases:`` line, after ``peak memory ...``, records them. ``stop_step``
    (1 to ``config.steps``; default None: all steps): a partial run for timing the first stages
    (benchmarks/gpu_speedrun.py ``--stop-step``): the schedule is the config's, the run validates at
    ``stop_step`` and ends there, the warm-up compiles only the graphs of the steps before it, and the
    header's ``stop_step`` line says so. Its log ends at ``step:<stop_step>/<steps>``, which the log parser
    reads as a truncated run, never as a result. Raises
    :class:`SpeedrunError` before anything is written when the world size, GPUs, device or data do not fit
    the config or ``stop_step`` is out of range; any error during training (a :class:`RunStopped` included)
    is logged as :func:`failure_line` and re-raised, the log renamed to ``log_path`` all the same, or, for a
    run stopped by a signal (:class:`RunStopped`: Ctrl-C, a scheduler's stop, the launcher's end), to
    :func:`speedrun.training.runlog.stopped_path` of it: a stopped run leaves no file under its output's name, so
    the workflow's next call runs it again.

    The order at the end: the last validation, the ``peak memory`` line, the teardown (the prefetching thread
    stopped, the process group destroyed), then the ``phases:`` line and, for a diverged run, ``run diverged:
    <why>``, and the log's rename. A failed run's log is finished before the process group is destroyed (a
    destroy that hangs after a failure on another rank must not keep the log from its name).
    """
    if stop_step is not None and not 1 <= stop_step <= config.steps:
        raise SpeedrunError(f"stop_step {stop_step}: expected a step from 1 to the run's {config.steps} steps")
    phases = RunPhases() if phases is None else phases
    env = os.environ if env is None else env
    resolve_cpu_math_dispatch()          # a fresh process's first threaded float math may be inexact (torch bug)
    with phases.timed("device"):
        launch = Launch(env)
        launch.check(config)
        preflight(config.compute.device, gpus, env, config.world_size)
        device = resolve_device(config.compute.device, launch.local_rank)
        if device.type == "cuda":
            phases.sync = torch.cuda.synchronize
    config = config.resolved_for(device)                  # dtype auto -> bfloat16 on CUDA, float32 on a CPU
    with phases.timed("data"):
        data = load_training_data(shards_dir, bos_dir)
        check_data_feeds(config, data)
    header = _header(config, variant, seed, launch, device, data)
    if stop_step is not None:
        header["stop_step"] = stop_step
    group = contextlib.ExitStack()
    with phases.timed("process_group"):
        group.enter_context(process_group(launch, device))
    with group:                                           # destroys the process group after a failure
        log = RunLog(log_path if launch.rank == 0 else None)
        written, run = False, None
        try:
            run = _Run(config, seed, data, device, launch, log, phases, stop_step)
            header["compile_s"] = f"{run.warm_up():.1f}"
            _write_header(log, header)
            written = True
            result = run.run()
            with phases.timed("teardown"):
                run.close()
                group.close()                             # destroy_process_group, in the phase
        except BaseException as e:
            if run is not None:
                run.flush_after_failure()
            with phases.timed("teardown"):
                if run is not None:
                    run.close()
            if not written:
                _write_header(log, header)
            log.write(peak_memory_line(*peak_memory_mib(device)))
            log.write(phases.line())
            log.write(failure_line(e))
            log.finish(stopped=isinstance(e, RunStopped))
            raise
        log.write(phases.line())
        if result.status == "diverged":
            log.write(f"run diverged: {result.reason}")
        log.finish()
    return result


def failure_line(error: BaseException) -> str:
    """The log's last line for a run that ``error`` ended: ``run failed: terminated by SIGTERM`` for a
    :class:`RunStopped`, else ``run failed: <type>: <message on one line>``, or ``run failed: <type>`` when the
    message is empty (a bare ``KeyboardInterrupt``)."""
    if isinstance(error, RunStopped):
        return f"run failed: {error}"
    message = " ".join(str(error).split())
    return f"run failed: {type(error).__name__}: {message}" if message else f"run failed: {type(error).__name__}"


def _header(config: TrainConfig, variant: str, seed: int, launch: Launch, device: torch.device,
            data: TrainingData) -> dict[str, Any]:
    """The header fields (docs/formats.md "Training log"; the provenance keys the log parser reads). ``config``
    is the config :meth:`TrainConfig.resolved_for` the device: its ``dtype`` the one the run computes in."""
    settings = config.to_json()
    return {"speedrun": __version__, "variant": variant, "seed": seed, "config": settings,
            "config_sha256": sha256_text(settings), **code_version(),
            "world_size": launch.world_size, "tokens_per_step": config.batch_at(config.steps - 1)[0],
            "val_tokens": config.evaluation.val_tokens, "train_data_sha256": data.train_sha256,
            "val_data_sha256": data.val_sha256, "device": device_description(device, launch.world_size),
            "attention_backend": config.model_config().attention_backend}      # resolved: auto -> what runs


def _write_header(log: RunLog, header: Mapping[str, Any]) -> None:
    for line in header_lines(header) + environment_lines():
        log.write(line)
    log.write(SEPARATOR)
