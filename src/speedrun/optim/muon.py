"""Muon: momentum orthogonalized by a Newton–Schulz-type iteration (Keller Jordan 2024, "Muon: An optimizer
for hidden layers in neural networks"; records #3 and #4 of the public speedrun, Polar Express record #38),
optionally with NorMuon's variance normalization (records #41, #42, #48), cautious weight decay (#43) and
annealed Langevin noise (record 2026-06-11, :mod:`speedrun.optim.langevin`).

For each 2-D parameter W (rows, cols) with gradient G, at momentum β, learning rate η, lr multiplier
μ = max(1, rows/cols)^0.5, weight decay λ and noise scale σ_t:

    buf <- β·buf + (1-β)·G                       (momentum as an EMA)
    u   <- (1-β)·G + β·buf   (Nesterov)  or  buf
    u   <- orthogonalize(u)
    u   <- normalize(u)      (NorMuon, with beta2; see :func:`variance_normalize`)
    u   <- u + σ_t·rms(u)·ξ  (Langevin noise, when σ_t > 0)
    W   <- W·(1 - η·λ) - η·μ·u                   (decoupled decay, the default)
    W   <- W - η·λ·η·μ·W·[u·W >= 0] - η·μ·u       (cautious decay, record #43: ∝ η², and only where
                                                  the update also shrinks W)

The EMA form and the shape multiplier follow speedrun-spec.md 3.2 (the record: lr 0.023, beta2 0.9,
weight decay 1.2, cautious). A group with ``block_rows`` b updates each matrix as rows/b independent blocks
(b, cols) from the orthogonalization on (the normalization, the noise, the shape multiplier and the decay per
block; the momentum is elementwise either way): records #80-#89 and HEAD update Q and K in blocks of one head
pair, 256 of their 768 rows (their ``qk_bank``, speedrun-spec.md 3.2 "Groups").

The helpers below take one matrix (rows, cols) or a stack (..., rows, cols):
:class:`Muon` updates its parameters bank by bank (:mod:`speedrun.optim.banks`), sharded over ranks when
torch.distributed runs with world size > 1 (:mod:`speedrun.optim.sharding`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import torch

from speedrun.kernels import optional_kernel
from speedrun.optim.banks import Bank, BankState, bind_bank_state, make_banks, stack_padded, write_back
from speedrun.optim.langevin import add_langevin_noise, matrix_seed, standard_normal
from speedrun.optim.orthogonalize import ORTHOGONALIZERS, Orthogonalizer, orthogonalize
from speedrun.optim.precision import join_bf16, split_fp32_
from speedrun.optim.sharding import Communicator, Pending, distributed_world, shard_bounds

NORMUON_EPS = 1e-10
_FUSED_UPDATE = optional_kernel("muon_update", "muon_update_")       # None without the triton package


def muon_lr_multiplier(shape: torch.Size | tuple[int, ...]) -> float:
    """``max(1, rows/cols) ** 0.5`` for a (..., rows, cols) matrix: 1 for square and wide matrices, 2 for a
    (4C, C) MLP input matrix."""
    rows, cols = shape[-2:]
    return max(1.0, rows / cols) ** 0.5


def nesterov_momentum(grad: torch.Tensor, buf: torch.Tensor, momentum: float, nesterov: bool = True
                      ) -> torch.Tensor:
    """Update ``buf`` in place to ``momentum·buf + (1-momentum)·grad``; return the update direction:
    ``(1-momentum)·grad + momentum·buf`` with Nesterov, else ``buf`` itself (a new tensor either way).
    Elementwise: any shape, e.g. a bank (N, rows, cols)."""
    buf.lerp_(grad, 1.0 - momentum)
    return grad.lerp(buf, momentum) if nesterov else buf.clone()


def sgd_momentum(grad: torch.Tensor, buf: torch.Tensor, momentum: float, nesterov: bool = True) -> torch.Tensor:
    """The SGD form of :func:`nesterov_momentum` (record #12, 2024-11-19 FlexAttention, and Muon's first
    records): ``buf`` in place to ``momentum·buf + grad``; the direction ``grad + momentum·buf`` with
    Nesterov, else ``buf`` (a new tensor either way). Elementwise: any shape."""
    buf.mul_(momentum).add_(grad)
    return grad.add(buf, alpha=momentum) if nesterov else buf.clone()


MOMENTUM_UPDATES = {"ema": nesterov_momentum, "sgd": sgd_momentum}


def second_moment_shape(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """Shape of NorMuon's reduced second-moment buffer for a (rows, cols) update: (rows, 1) when
    rows >= cols (one value per row of the longer side), else (1, cols)."""
    rows, cols = shape[-2:]
    return (rows, 1) if rows >= cols else (1, cols)


def row_blocks(matrices: torch.Tensor, block_rows: int) -> torch.Tensor:
    """The view (k·rows/block_rows, block_rows, cols) of a contiguous stack ``matrices`` (k, rows, cols):
    matrix i's rows [j·block_rows, (j+1)·block_rows) are block i·rows/block_rows + j. Writing to the view writes
    to ``matrices``."""
    return matrices.view(-1, block_rows, matrices.size(-1))


def variance_normalize(update: torch.Tensor, second_moment: torch.Tensor, beta2: float,
                       eps: float = NORMUON_EPS) -> torch.Tensor:
    """NorMuon's normalization (records #41, #42, #48; speedrun-spec.md 3.2) of an orthogonalized update
    (..., rows, cols): bf16 on CUDA (the orthogonalization's output, as the records keep it), fp32 or fp64.

    The mean of squares along the longer side (per row if rows >= cols, else per column), in fp32 at least, is
    averaged into ``second_moment`` ((..., rows, 1) or (..., 1, cols), :func:`second_moment_shape`; updated in
    place: ``m <- beta2·m + (1-beta2)·v``); each row (column) is divided by ``sqrt(max(m, eps))``, and each matrix
    is rescaled to its Frobenius norm before the normalization. Both norms come from the means of squares
    (record #88's ``_apply_normuon_variance_reduction``): one pass over the update to read it and one to scale
    it. Returns a new tensor of ``update``'s dtype; a zero update stays zero.
    """
    reduce_dim = -1 if update.size(-2) >= update.size(-1) else -2
    size = update.size(reduce_dim)
    stats = torch.promote_types(update.dtype, torch.float32)
    mean_sq = update.to(stats).square().mean(dim=reduce_dim, keepdim=True)           # (..., rows, 1) or (..., 1, cols)
    norm = mean_sq.sum(dim=(-2, -1), keepdim=True).mul(size).sqrt()                    # ‖u‖_F, (..., 1, 1)
    second_moment.lerp_(mean_sq.to(second_moment.dtype), 1.0 - beta2)
    step = second_moment.clamp_min(eps).rsqrt().to(stats)
    new_norm = (mean_sq * step.square()).sum(dim=(-2, -1), keepdim=True).mul(size).sqrt()  # ‖u·step‖_F
    return update * (step * (norm / new_norm.clamp_min(eps))).to(update.dtype)


def working_dtype(param_dtype: torch.dtype) -> torch.dtype:
    """The dtype of Muon's gradients, state and update for parameters of ``param_dtype``: float32, or
    float64 for float64 parameters (exact tests on CPU). The orthogonalization itself runs in bf16 on CUDA
    (:func:`speedrun.optim.orthogonalize.orthogonalize`)."""
    return torch.promote_types(param_dtype, torch.float32)


def cautious_mask(update: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Bool tensor, True where ``update·param >= 0``: there the step ``param -= lr·update`` moves the
    weight towards zero, and cautious weight decay (record #43) applies."""
    return (update * param) >= 0


def step_factors(shape: torch.Size | tuple[int, ...], lr: float, weight_decay: float, cautious: bool,
                 decay_lr: float | None = None) -> tuple[float, float, float]:
    """``(lr_eff, decay, shrink)`` of :func:`apply_update` for a (..., rows, cols) parameter: the step's
    ``lr·μ`` (μ from :func:`muon_lr_multiplier`), the cautious decay's factor ``decay_lr·λ·lr·μ`` (0 without
    cautious decay) and the decoupled decay's ``1 - lr·λ`` (1 without it)."""
    lr_eff = lr * muon_lr_multiplier(shape)
    decay = (lr if decay_lr is None else decay_lr) * weight_decay * lr_eff if weight_decay and cautious else 0.0
    shrink = 1.0 - lr * weight_decay if weight_decay and not cautious else 1.0
    return lr_eff, decay, shrink


def step_settings(group: dict) -> tuple[float, float, bool, float]:
    """``(lr, weight_decay, cautious, decay_lr)`` of a Muon parameter group, as :func:`apply_update` and
    :func:`step_factors` take them; the decay's lr is the group's lr without its ``lr_mul`` (the records scale
    the cautious decay by the step's lr, multiplier included, and once more by the base lr)."""
    return group["lr"], group["weight_decay"], group["cautious_weight_decay"], group["lr"] / group.get("lr_mul", 1.0)


def apply_update(param: torch.Tensor, update: torch.Tensor, lr: float, weight_decay: float,
                 cautious: bool, decay_lr: float | None = None) -> None:
    """In place on ``param`` (..., rows, cols), any float dtype, with the ``update`` of its shape in the
    working dtype (:func:`working_dtype`) or bf16 (the records' update on CUDA; the mask and the step are then
    computed in ``param``'s dtype):
    weight decay (cautious, record #43, or decoupled) and the step ``-lr·μ·update``, μ from
    :func:`muon_lr_multiplier`. The cautious decay is ``decay_lr·λ·lr·μ`` times the masked weight, with
    ``decay_lr`` the scheduled lr without the group's lr factor (records #43-#89: their ``eff_wd = wd·lr``
    against the step's ``lr_mul·per_matrix_lr_mul·lr``; record #88 L892-895); None: ``lr``
    (:func:`step_factors`). On CUDA, bf16 weights with their mantissa take the same step in one kernel
    (:func:`speedrun.kernels.muon_update.muon_update_`)."""
    lr_eff, decay, shrink = step_factors(param.shape, lr, weight_decay, cautious, decay_lr)
    if decay:
        param.sub_((param * cautious_mask(update, param)).mul_(decay))
    elif shrink != 1.0:
        param.mul_(shrink)
    param.add_(update.to(param.dtype), alpha=-lr_eff)


def bank_direction(grad: torch.Tensor, momentum_buf: torch.Tensor, second_moment: torch.Tensor | None,
                   momentum: float | torch.Tensor, nesterov: bool, momentum_form: str, block_rows: int,
                   orthogonalizer: Orthogonalizer, beta2: float | None) -> torch.Tensor:
    """The update direction of a bank before noise and the weight step: the momentum (:data:`MOMENTUM_UPDATES`,
    in place on ``momentum_buf``), the orthogonalization of each matrix's ``block_rows``-row blocks and, with
    ``beta2``, NorMuon's normalization (in place on ``second_moment``).

    grad, momentum_buf: (k, rows, cols) in the working dtype; second_moment: (k, [rows/b,] r, c) as
    :class:`speedrun.optim.banks.BankState` holds it, or None without NorMuon; momentum: β as a float, or as a
    0-d CPU fp32 tensor under :class:`Muon`'s ``compile`` (a changing value then changes no graph, as record
    #88's ``momentum_t``). Returns (k·rows/b, b, cols) in the orthogonalization's dtype (bf16 on CUDA)."""
    if isinstance(momentum, torch.Tensor):
        momentum = momentum.to(grad.dtype)                         # a 0-d CPU tensor: lerp's weight dtype
    direction = MOMENTUM_UPDATES[momentum_form](grad, momentum_buf, momentum, nesterov)
    update = orthogonalize(row_blocks(direction, block_rows), orthogonalizer)
    if beta2 is not None:                                          # (k·blocks, b, cols) from here on
        update = variance_normalize(update, second_moment.view(-1, *second_moment.shape[-2:]), beta2)
    return update


class Muon(torch.optim.Optimizer):
    """Muon over 2-D parameters (``torch.optim.Optimizer`` interface), updated in banks of equal-shape
    matrices (records #48, #56, #61) and, with torch.distributed initialized at world size W > 1 and
    ``shard``, sharded over the ranks (speedrun-spec.md 3.4): each rank reduce-scatters the banks'
    gradients itself (averaging them), updates its 1/W of every bank and all-gathers the results. The
    caller must then not need to average these gradients (:meth:`self_reduced_parameters`; averaging them
    again first does no harm but costs the traffic). Every rank must hold gradients for the same parameters.

    Args:
        params: parameters or parameter groups; every parameter must be 2-D.
        lr: learning rate η (per group; schedules rescale ``group["lr"]``).
        momentum: β in [0, 1) (scheduled through ``group["momentum"]``).
        nesterov: Nesterov-style update direction (default True).
        momentum_form: ``"ema"`` (default, :func:`nesterov_momentum`) or ``"sgd"`` (record #12,
            :func:`sgd_momentum`).
        weight_decay: weight decay λ.
        orthogonalizer: ``"polar_express"`` (default, record #38) or ``"newton_schulz"`` (records #3-#37).
        normuon_beta2: None (plain Muon) or the beta2 in [0, 1) of NorMuon's variance normalization
            (record: 0.9).
        cautious_weight_decay: decay ∝ η² only where update and weight agree in sign (record #43); else
            decoupled decay W·(1 - η·λ).
        langevin_noise: σ >= 0 of the Langevin noise (:mod:`speedrun.optim.langevin`); 0 is off. The
            current σ_t is ``group["langevin_sigma"]`` (set by the schedule; σ until then).
        langevin_seed: the run's noise seed (:func:`speedrun.optim.langevin.matrix_seed`).
        shard: shard the update when torch.distributed runs with world size > 1 (else every rank updates
            every matrix from gradients it must have averaged).
        block_rows: None (whole matrices) or the rows b of the blocks each matrix is updated in (per group;
            every matrix of the group must have a multiple of b rows): see the module docstring.
        process_group: the group to shard over (None: the default group).
        compile: compute each bank's direction (:func:`bank_direction`: momentum, orthogonalization, NorMuon)
            under ``torch.compile`` (Inductor fuses its elementwise passes, as the records compile theirs:
            record #88's ``polar_express`` and ``_apply_normuon_variance_reduction``), a graph per bank shape,
            the momentum β a graph input; the ``"sgd"`` momentum form stays eager. Call :meth:`warm_up` before
            timing: it compiles them without changing anything.

    State per parameter (in :func:`working_dtype`, views into the bank buffers): ``momentum_buffer`` (rows,
    cols) and, with NorMuon, ``second_moment`` ((rows, 1) or (1, cols); with ``block_rows`` b, (rows/b, b, 1)
    or (rows/b, 1, cols)); for bf16 parameters ``mantissa`` (rows, cols) int16, the lower 16 bits of the fp32
    weight that the update applies to, whose upper half (truncated towards zero) the parameter holds (records
    #57-#89, :mod:`speedrun.optim.precision`); sharded, only for the parameters of this rank's slices.
    Each group counts its updates in ``group["update_count"]`` (the noise seeds use it). Raises
    ``ValueError`` on a parameter that is not 2-D or an invalid hyperparameter.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.05, momentum: float = 0.95,
                 nesterov: bool = True, weight_decay: float = 0.0,
                 orthogonalizer: Orthogonalizer = "polar_express", normuon_beta2: float | None = None,
                 cautious_weight_decay: bool = False, langevin_noise: float = 0.0, langevin_seed: int = 0,
                 shard: bool = True, process_group: object | None = None, momentum_form: str = "ema",
                 block_rows: int | None = None, compile: bool = False):
        if lr < 0 or not 0.0 <= momentum < 1.0 or weight_decay < 0 or langevin_noise < 0:
            raise ValueError(f"Muon needs lr >= 0, 0 <= momentum < 1, weight_decay >= 0, langevin_noise >= 0; "
                             f"got lr={lr}, momentum={momentum}, weight_decay={weight_decay}, "
                             f"langevin_noise={langevin_noise}")
        if normuon_beta2 is not None and not 0.0 <= normuon_beta2 < 1.0:
            raise ValueError(f"normuon_beta2 must be None or in [0, 1), got {normuon_beta2}")
        if momentum_form not in MOMENTUM_UPDATES:
            raise ValueError(f"unknown momentum_form {momentum_form!r}; expected one of {', '.join(MOMENTUM_UPDATES)}")
        if orthogonalizer not in ORTHOGONALIZERS:
            raise ValueError(f"unknown orthogonalizer {orthogonalizer!r}; expected {ORTHOGONALIZERS}")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        orthogonalizer=orthogonalizer, normuon_beta2=normuon_beta2,
                        cautious_weight_decay=cautious_weight_decay, langevin_noise=langevin_noise,
                        langevin_sigma=langevin_noise, langevin_seed=langevin_seed, update_count=0,
                        momentum_form=momentum_form, block_rows=block_rows)
        super().__init__(params, defaults)
        for group in self.param_groups:
            blocks = group["block_rows"]
            if blocks is not None and (not isinstance(blocks, int) or blocks < 1):
                raise ValueError(f"Muon block_rows must be None or an integer >= 1, got {blocks!r}")
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon updates 2-D matrices only, got a parameter of shape "
                                     f"{tuple(p.shape)}")
                if blocks is not None and p.size(0) % blocks:
                    raise ValueError(f"Muon block_rows {blocks} does not divide the rows of a parameter of shape "
                                     f"{tuple(p.shape)}")
        self.shard, self.process_group = shard, process_group
        self._communicator: Communicator | None = None
        self._bank_states: dict[tuple, BankState] = {}
        self._compiled = torch.compile(bank_direction, dynamic=False, fullgraph=True) if compile else None
        self._momentum_t = torch.zeros((), dtype=torch.float32)        # β of the step for the compiled direction

    def communicator(self) -> Communicator | None:
        """The collectives of a sharded update, or None when the update is not sharded (``shard`` off,
        torch.distributed not initialized, or world size 1)."""
        if not self.shard or distributed_world(self.process_group)[1] < 2:
            return None
        if self._communicator is None:
            self._communicator = Communicator(self.process_group)
        return self._communicator

    def self_reduced_parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients this optimizer averages over ranks itself in :meth:`step` (all of
        them when sharded, none otherwise): the caller leaves them out of its own gradient all-reduce."""
        if self.communicator() is None:
            return []
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter that has a gradient, bank by bank. Sharded: every bank's
        reduce-scatter is launched first, then each bank is updated and its all-gather launched in turn,
        and the gathered values are written back last. Returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        banks = make_banks(self.param_groups)
        comm = self.communicator()
        rank, world = (comm.rank, comm.world_size) if comm is not None else (0, 1)
        gradients = [self._reduce(bank, comm, world, rank) for bank in banks]
        gathers = []
        for bank, gradient in zip(banks, gradients):
            updated = self._update_bank(bank, gradient.wait(), world, rank)
            gathers.append(comm.all_gather(updated) if comm is not None else Pending(None, updated))
        for bank, gather in zip(banks, gathers):
            write_back(bank.params, gather.wait())
        for index in sorted({bank.group_index for bank in banks}):
            self.param_groups[index]["update_count"] = self.param_groups[index].get("update_count", 0) + 1
        return loss

    def _reduce(self, bank: Bank, comm: Communicator | None, world: int, rank: int) -> Pending:
        """The bank's gradients in the working dtype, stacked and padded; sharded: the launched
        reduce-scatter of them, in the gradients' own dtype (bf16 for bf16 weights, as the records' reduce:
        half the traffic of fp32), cast to the working dtype once received."""
        padded, _, _ = shard_bounds(len(bank.params), world, rank)
        first = bank.params[0]
        dtype = working_dtype(first.dtype)
        grads = [p.grad for p in bank.params]
        if comm is None:
            return Pending(None, stack_padded(grads, padded, bank.shape, dtype, first.device))
        pending = comm.reduce_scatter_mean(stack_padded(grads, padded, bank.shape, grads[0].dtype, first.device))
        received = pending.finish
        return dataclasses.replace(pending, finish=lambda t: received(t).to(dtype))

    def _update_bank(self, bank: Bank, grad: torch.Tensor, world: int, rank: int) -> torch.Tensor:
        """The new values (k, rows, cols), in the parameters' dtype, of this rank's slice of ``bank`` given
        its averaged gradient ``grad`` (k, rows, cols) in the working dtype. With the group's ``block_rows``
        b, everything after the momentum runs on the (k·rows/b, b, cols) blocks (:func:`row_blocks`)."""
        group = self.param_groups[bank.group_index]
        _, start, slots = shard_bounds(len(bank.params), world, rank)
        owned = bank.params[start:start + slots]
        block_rows = group.get("block_rows") or bank.shape[0]
        state = self._bank_state(bank, owned, start, slots, group["normuon_beta2"] is not None, block_rows)
        first = bank.params[0]
        params = stack_padded(owned, slots, bank.shape, first.dtype, first.device)
        # bf16 on CUDA from here on, as the records' update (the weight step itself in the working dtype)
        update = self._direction(group, grad, state, block_rows)  # (k·blocks, b, cols)
        if group["langevin_sigma"] > 0:
            seeds = [matrix_seed(group["langevin_seed"], group.get("update_count", 0), bank.group_index,
                                 bank.param_indices[start + j]) if start + j < len(bank.params) else None
                     for j in range(slots)]
            noise = standard_normal(bank.shape, seeds, update.dtype, first.device)
            update = add_langevin_noise(update, group["langevin_sigma"], row_blocks(noise, block_rows))
        settings = step_settings(group)
        if state.mantissa is None:
            apply_update(row_blocks(params, block_rows), update, *settings)
            return params
        if _FUSED_UPDATE is not None and params.is_cuda:           # one pass, as the records' compiled step
            factors = step_factors(row_blocks(params, block_rows).shape, *settings)
            _FUSED_UPDATE(params, state.mantissa, update.contiguous().view(params.shape), *factors)
            return params
        precise = join_bf16(params, state.mantissa)              # bf16 weights: updated as fp32 (record #57)
        apply_update(row_blocks(precise, block_rows), update, *settings)
        split_fp32_(precise, params, state.mantissa)             # forward weight: truncated to bf16
        return params

    def _direction(self, group: dict, grad: torch.Tensor, state: BankState, block_rows: int) -> torch.Tensor:
        """:func:`bank_direction` of ``grad`` with the bank's state and the group's settings: compiled when
        ``compile`` is on (and the momentum form is ``"ema"``), else eager."""
        form = group.get("momentum_form", "ema")
        settings = (group["nesterov"], form, block_rows, group["orthogonalizer"], group["normuon_beta2"])
        if self._compiled is None or form != "ema":
            return bank_direction(grad, state.momentum, state.second_moment, group["momentum"], *settings)
        self._momentum_t.fill_(group["momentum"])
        return self._compiled(grad, state.momentum, state.second_moment, self._momentum_t, *settings)

    @torch.no_grad()
    def warm_up(self) -> None:
        """Compile the bank directions that :meth:`step` will run (with ``compile``), on zero tensors of each
        bank's shapes as this rank sees them, every parameter counted as having a gradient, and the weight step's
        CUDA kernel for bf16 weights (on scratch tensors): no parameter, state or setting changes. The first
        training step then compiles nothing (its time counts)."""
        self._warm_up_update_kernel()
        if self._compiled is None:
            return
        comm = self.communicator()
        rank, world = (comm.rank, comm.world_size) if comm is not None else (0, 1)
        for bank in make_banks(self.param_groups, every=True):
            group = self.param_groups[bank.group_index]
            _, _, slots = shard_bounds(len(bank.params), world, rank)
            first = bank.params[0]
            block_rows = group.get("block_rows") or bank.shape[0]
            scratch = bind_bank_state({}, (), slots, bank.shape, self._second_moment_shape(bank, block_rows)
                                      if group["normuon_beta2"] is not None else None,
                                      working_dtype(first.dtype), first.device)
            self._direction(group, torch.zeros_like(scratch.momentum), scratch, block_rows)

    def _warm_up_update_kernel(self) -> None:
        """Compile (or load) the one-pass weight step of bf16 weights (:func:`speedrun.kernels.muon_update.muon_update_`)
        on 16 scratch elements, with the update in bf16 as the CUDA orthogonalization gives it, when a parameter
        is a CUDA bf16 weight (Triton specializes on dtypes and on sizes divisible by 16, as the weights are)."""
        weights = [p for g in self.param_groups for p in g["params"] if p.is_cuda and p.dtype == torch.bfloat16]
        if _FUSED_UPDATE is None or not weights:
            return
        p = torch.zeros(16, dtype=torch.bfloat16, device=weights[0].device)
        _FUSED_UPDATE(p, torch.zeros(16, dtype=torch.int16, device=p.device), torch.zeros_like(p), 0.0, 0.0)

    @staticmethod
    def _second_moment_shape(bank: Bank, block_rows: int) -> tuple[int, ...]:
        """NorMuon's second-moment shape per matrix of ``bank`` updated in ``block_rows``-row blocks: (r, c), or
        (rows/b, r, c) with blocks (:func:`second_moment_shape` of one block)."""
        rows, cols = bank.shape
        reduced = second_moment_shape((block_rows, cols))
        return (rows // block_rows, *reduced) if block_rows < rows else reduced

    def _bank_state(self, bank: Bank, owned: tuple[torch.Tensor, ...], start: int, slots: int,
                    normuon: bool, block_rows: int) -> BankState:
        """The state buffers of this rank's slice of ``bank``: the cached ones while the owned parameters'
        state entries are still their views, else fresh ones built from those entries (dropping the cached
        buffers of any other bank that shares a parameter)."""
        key = (bank.key, start, slots)
        cached = self._bank_states.get(key)
        if cached is None or not cached.is_bound(self.state, owned, normuon):
            first = bank.params[0]
            reduced = self._second_moment_shape(bank, block_rows)     # (blocks, b, 1) or (blocks, 1, cols)
            cached = bind_bank_state(self.state, owned, slots, bank.shape, reduced if normuon else None,
                                     working_dtype(first.dtype), first.device,
                                     mantissa=first.dtype == torch.bfloat16)
            members = {id(p) for p in bank.params}
            self._bank_states = {k: v for k, v in self._bank_states.items()
                                 if not members & set(k[0][1:])}
            self._bank_states[key] = cached
        return cached
