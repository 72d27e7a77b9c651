"""The record rules that make a candidate comparable with its baseline, checked from the runs' provenance.

The public speedrun's rules (modded-nanogpt README "Rules", L207-226; ../shared/docs/user-needs.md item 14):
the candidate trains on the same token streams as the baseline and is validated on the same 10,485,760
validation tokens of the same shard, timed on the same hardware, without new compile flags. Each rule becomes
one :class:`RuleCheck` with a status:

* ``ok``: every counted run on both sides records the fact, and the values agree;
* ``violation``: the values differ (between the sides, or within a side); a visible warning;
* ``note``: informational (``val_tokens`` is not 10,485,760 and the target is not the public 3.28, or not
  given, so the public metric is not claimed);
* ``unknown``: some counted run does not record the fact (the public logs have no data hashes).

Rules, over the counted runs (:attr:`speedrun.analysis.groups.Group.counted`):

1. ``train data``: one ``train_data_sha256`` on both sides (the train shards' manifest);
2. ``validation data``: one ``val_data_sha256`` on both sides (the validation shard);
3. ``validation tokens``: one ``val_tokens`` on both sides, and equal to 10,485,760, which is a violation
   only when the target is 3.28 (the public metric) and a note otherwise;
4. ``world size``: one ``world_size`` on both sides (public logs: not recorded, see rule 5);
5. ``GPUs``: one GPU model and count (``gpu``, ``gpu_count``; 0 for CPU runs) on both sides;
6. ``compile flags``: one set of compile settings on both sides
   (:func:`speedrun.analysis.provenance.code_compile_flags`, our ``config`` keys on compilation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from speedrun.analysis.groups import Group
from speedrun.analysis.logs import RunRecord

RuleStatus = Literal["ok", "violation", "note", "unknown"]
PUBLIC_VAL_TOKENS = 10_485_760
PUBLIC_TARGET = 3.28


@dataclass(frozen=True)
class RuleCheck:
    """One rule between a baseline and a candidate: its name, status and a sentence saying what was found."""

    rule: str
    status: RuleStatus
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "status": self.status, "detail": self.detail}


def _values(runs: Sequence[RunRecord], get: Callable[[RunRecord], Any]) -> tuple[list[Any], int]:
    """Distinct known values (in order of appearance) and the number of runs that do not record one."""
    values, missing = [], 0
    for run in runs:
        value = get(run)
        if value is None:
            missing += 1
        elif value not in values:
            values.append(value)
    return values, missing


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "{" + ", ".join(value) + "}" if value else "{} (none)"
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def _same(rule: str, what: str, baseline: Group, candidate: Group, get: Callable[[RunRecord], Any]) -> RuleCheck:
    """ok when every counted run records ``get`` and all values are one; violation when they differ."""
    sides = {"baseline": _values(baseline.counted, get), "candidate": _values(candidate.counted, get)}
    for side, (values, _) in sides.items():
        if len(values) > 1:
            return RuleCheck(rule, "violation", f"the {side}'s runs differ in {what}: "
                             + ", ".join(_show(v) for v in values))
    (b, b_missing), (c, c_missing) = sides["baseline"], sides["candidate"]
    if b and c and b[0] != c[0]:
        return RuleCheck(rule, "violation", f"{what} differs: baseline {_show(b[0])}, candidate {_show(c[0])}")
    if b_missing or c_missing or not (b and c):
        return RuleCheck(rule, "unknown", f"{what} is not recorded by {b_missing} baseline and {c_missing} "
                         "candidate run(s)")
    return RuleCheck(rule, "ok", f"{what}: {_show(b[0])} on both sides")


def _val_tokens(baseline: Group, candidate: Group, target: float | None) -> RuleCheck:
    same = _same("validation tokens", "val_tokens", baseline, candidate, lambda r: r.val_tokens)
    if same.status != "ok":
        return same
    (value,), _ = _values(baseline.counted, lambda r: r.val_tokens)
    if value == PUBLIC_VAL_TOKENS:
        return same
    public = target == PUBLIC_TARGET
    return RuleCheck("validation tokens", "violation" if public else "note",
                     f"val_tokens is {value:,} on both sides, not the public metric's {PUBLIC_VAL_TOKENS:,}"
                     + (f" (target {target:g} is the public one)" if public else
                        " (no target given)" if target is None else f" (target {target:g})"))


def _compile_flags(baseline: Group, candidate: Group) -> RuleCheck:
    same = _same("compile flags", "compile settings", baseline, candidate, lambda r: r.compile_flags)
    if same.status != "violation" or "differs:" not in same.detail:
        return same
    (b_flags,), _ = _values(baseline.counted, lambda r: r.compile_flags)
    (c_flags,), _ = _values(candidate.counted, lambda r: r.compile_flags)
    b, c = set(b_flags), set(c_flags)
    parts = [f"candidate adds {_show(tuple(sorted(c - b)))}" if c - b else "",
             f"candidate drops {_show(tuple(sorted(b - c)))}" if b - c else ""]
    return RuleCheck("compile flags", "violation", "compile settings differ: " + "; ".join(p for p in parts if p))


RULES = ("train data", "validation data", "validation tokens", "world size", "GPUs", "compile flags")


def check_rules(baseline: Group, candidate: Group, target: float | None) -> tuple[RuleCheck, ...]:
    """The six rule checks (module docstring) of ``candidate`` against ``baseline`` at ``target`` val_loss;
    all ``unknown`` when a side has no counted run."""
    empty = [side for side, g in (("baseline", baseline), ("candidate", candidate)) if not g.counted]
    if empty:
        return tuple(RuleCheck(rule, "unknown", f"the {' and '.join(empty)} has no counted run") for rule in RULES)
    return (
        _same("train data", "train_data_sha256", baseline, candidate, lambda r: r.train_data_sha256),
        _same("validation data", "val_data_sha256", baseline, candidate, lambda r: r.val_data_sha256),
        _val_tokens(baseline, candidate, target),
        _same("world size", "world_size", baseline, candidate, lambda r: r.world_size),
        _same("GPUs", "GPU model and count", baseline, candidate,
              lambda r: None if r.gpu_count is None else "CPU" if r.gpu_count == 0 else f"{r.gpu} x {r.gpu_count}"),
        _compile_flags(baseline, candidate),
    )


def violations(checks: Sequence[RuleCheck]) -> list[str]:
    """One warning sentence per violated rule."""
    return [f"rule violated: {c.rule}: {c.detail}" for c in checks if c.status == "violation"]
