"""Parameter roles: what a parameter is for, declared by the module that owns it.

A few parameters are treated apart from the others of their kind, and are found by role, never by parameter
name. The optimizers (:mod:`speedrun.optim.groups`): the MLP input and output matrices take their own Muon lr
(``mlp_fc_lr_mul``, ``mlp_proj_lr_mul``), the attention output gates may train with Muon
(``muon_attention_gates``) and the q and k matrices may be updated in blocks of heads (``muon_qk_block_heads``).
The initialization (:meth:`speedrun.model.gpt.GPT`, ``linear_init: torch``, record #12): the matrices that read
the residual stream, the attention's q, k, v and the MLP's fc, are drawn again as ``nn.Linear`` draws them.
A module that holds such a parameter declares it with the method

    def own_parameter_roles(self) -> dict[ParamRole, list[nn.Parameter]]

over parameters of its own (its ``parameters()``): :class:`speedrun.model.mlp.MLP` its ``fc`` and ``proj``
weights, :class:`speedrun.model.block.CausalSelfAttention` its q, k, v weights and its output gate's weight.
:func:`declared_roles` collects them over a model, and :meth:`speedrun.model.gpt.GPT.role_parameters` counts
them against the model's config with :func:`check_role_layers` (style.md, "choose parameter groups by the
module that owns them, and check the count", after nanochat's gpt.py L423-430).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Literal, Mapping, Sequence, get_args

if TYPE_CHECKING:
    from torch import nn

ParamRole = Literal["mlp_fc", "mlp_proj", "attention_gate", "attention_qk", "attention_value"]
"""``mlp_fc``: an MLP's input matrix (F, C); ``mlp_proj``: its output matrix (C, F); ``attention_gate``: an
attention output gate's weight (H, 12) (:class:`speedrun.model.gates.AttentionGate`); ``attention_qk``: an
attention's q or k matrix (H·Dh, C), two per attention (Muon may update them in blocks of heads,
``OptimConfig.muon_qk_block_heads``); ``attention_value``: its v matrix (H·Dh, C), one per attention."""
PARAM_ROLES: tuple[str, ...] = get_args(ParamRole)
ROLE_METHOD = "own_parameter_roles"


def declared_roles(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Role -> parameters (every role of :data:`PARAM_ROLES`, possibly empty), as the ``own_parameter_roles``
    methods of ``model`` and its submodules declare them, in the order of ``model.named_parameters()``.

    Raises ``ValueError`` naming the module and the parameter when a module declares an unknown role or a
    parameter that is not its own, or when two declarations give one parameter two roles (or one twice)."""
    names = {id(p): name for name, p in model.named_parameters()}
    role_of: dict[int, str] = {}
    for path, module in model.named_modules():
        declare = getattr(module, ROLE_METHOD, None)
        if declare is None:
            continue
        own = {id(p) for p in module.parameters()}
        where = f"{type(module).__name__} {path or '(the model)'}"
        for role, params in declare().items():
            if role not in PARAM_ROLES:
                raise ValueError(f"{where} declares the unknown parameter role {role!r}; the roles are "
                                 f"{', '.join(PARAM_ROLES)}")
            for p in params:
                if id(p) not in own:
                    raise ValueError(f"{where} declares the role {role!r} for a parameter that is not its own")
                if id(p) in role_of:
                    raise ValueError(f"parameter {names[id(p)]!r} is declared twice, as {role_of[id(p)]!r} and "
                                     f"{role!r}")
                role_of[id(p)] = role
    out: dict[str, list[nn.Parameter]] = {role: [] for role in PARAM_ROLES}
    for _, p in model.named_parameters():
        if id(p) in role_of:
            out[role_of[id(p)]].append(p)
    return out


def check_role_layers(found: Mapping[str, Sequence[int | None]], expected: Mapping[str, Sequence[int]],
                      names: Mapping[str, Sequence[str]]) -> None:
    """Check that each role has on each layer as many parameters as ``expected[role]`` lists that layer (once
    per parameter: ``[0, 1]`` one on each of layers 0 and 1, ``[0, 0, 0]`` three on layer 0), and none elsewhere.

    ``found[role]``: the layer of each declared parameter of the role (None for one outside the blocks), in
    the order of ``names[role]``, their names. Raises ``ValueError`` naming the role, the expected and found
    counts, the layers with too few, the layers with too many and the parameters outside the blocks."""
    for role in PARAM_ROLES:
        layers, want = list(found.get(role, ())), Counter(expected.get(role, ()))
        inside = Counter(layer for layer in layers if layer is not None)
        if inside == want and inside.total() == len(layers):
            continue
        missing = sorted(layer for layer in want if inside[layer] < want[layer])
        extra = sorted(layer for layer in inside if inside[layer] > want[layer])
        outside = [name for name, layer in zip(names.get(role, ()), layers) if layer is None]
        each = set(want.values())
        gives = (f"{'one' if each == {1} else each.pop()} on each of layers {sorted(want)}" if len(each) <= 1
                 else f"per layer {dict(sorted(want.items()))}")
        raise ValueError(f"parameter role {role!r}: the model config gives {gives} ({want.total()}), the modules "
                         f"declare {len(layers)}: missing on layers {missing}, extra on layers {extra}, outside the "
                         f"blocks {outside}")
