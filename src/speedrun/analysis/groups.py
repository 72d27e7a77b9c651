"""Group runs for statistics: one group per directory, split when its runs are not comparable.

A path given to ``speedrun stats``/``compare`` is a training log, a parsed-run ``.json`` (written by
``speedrun parse``; read instead of re-parsing the log), or a directory of either. A directory contributes its
own files only (not its subdirectories); files are recognised by content, not by extension (some public logs
have none, and a directory also holds README.md or statistics.md). Files named on the command line are grouped
by their parent directory.

A public record directory can mix runs that must not be pooled (speedrun-spec.md 4.3): different total step
counts (2026-01-26-UntieValueEmbeddings: 1600 and 1575 steps) or GPU counts (single-GPU logs next to 8-GPU ones).
Such a directory is split, the group names get a suffix (``dir [1600 steps]``) and ``split_reason`` says why.
A run whose step or GPU count is unknown (an unfinished llm.c log) joins the only known value, or a group of its
own when there are several. Identical files (same sha256; e.g. 2025-05-09_SkipMLPBlocks is a byte copy of
2025-09-05_SkipMLPBlocks) are counted once, at their first appearance, and flagged.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from speedrun.analysis.logs import RunRecord, record_from_bytes, sniff_format
from speedrun.errors import SpeedrunError

_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Group:
    """Runs that are compared with each other: same directory, same step count, same GPU count.

    ``name`` is the path as given (plus a suffix such as `` [1575 steps]`` when split); ``slug`` a file-name-safe
    unique name (the directory's name, plus the suffix); ``runs`` every run found, complete or not, in file
    order; ``duplicate_of`` (parallel to ``runs``; all ``None`` when not given) names, for a run whose content is identical to an
    earlier run's, that run's file (it is not counted); ``skipped`` lists the directory's files that are not
    runs (README.md...).
    """

    name: str
    path: str
    slug: str
    runs: tuple[RunRecord, ...]
    split_reason: str | None = None
    duplicate_of: tuple[str | None, ...] = ()
    skipped: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.duplicate_of:
            object.__setattr__(self, "duplicate_of", (None,) * len(self.runs))
        if len(self.duplicate_of) != len(self.runs):
            raise ValueError(f"group {self.name}: {len(self.duplicate_of)} duplicate_of entries for "
                             f"{len(self.runs)} runs")

    @property
    def duplicates(self) -> dict[str, str]:
        """file of each duplicate run -> file of the earlier identical run."""
        return {r.file: orig for r, orig in zip(self.runs, self.duplicate_of) if orig is not None}

    @property
    def counted(self) -> tuple[RunRecord, ...]:
        """The runs that count: complete and not duplicates."""
        return tuple(r for r, orig in zip(self.runs, self.duplicate_of) if r.status == "complete" and orig is None)

    @property
    def steps(self) -> int | None:
        """The group's scheduled step count (``None`` when unknown)."""
        return _only_value(r.steps for r in self.runs)

    @property
    def gpu_count(self) -> int | None:
        """The group's GPU count (``None`` when unknown; 0 for CPU runs)."""
        return _only_value(r.gpu_count for r in self.runs)

    def warnings(self) -> list[str]:
        """Signs of non-independent runs among the counted ones: repeated seeds, identical loss curves."""
        out = []
        counted = self.counted
        seeds = Counter(r.seed for r in counted if r.seed is not None)
        out += [f"seed {s} appears in {k} runs" for s, k in seeds.items() if k > 1]
        curves = Counter(r.curve_hash for r in counted if r.curve_hash)
        out += [f"{k} runs have identical loss curves" for c, k in curves.items() if k > 1]
        codes = Counter(r.code_hash for r in counted if r.code_hash and r.format == "modded")
        if len(codes) > 1:
            out.append("runs come from " + str(len(codes)) + " code versions (code_hash " +
                       ", ".join(f"{h[:8]} x{k}" for h, k in codes.most_common()) + ")")
        return out


def _only_value(values: Iterable[int | None]) -> int | None:
    known = {v for v in values if v is not None}
    return known.pop() if len(known) == 1 else None


def load_run(path: str | Path) -> RunRecord | None:
    """The run in the file at ``path``: a training log or a parsed-run JSON; ``None`` if it is neither.

    Raises:
        SpeedrunError: the file cannot be read, or is a parsed-run JSON with missing keys.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpeedrunError(f"{path}: cannot read ({e.strerror or e})") from None
    if data.lstrip()[:1] == b"{":
        return _json_run(data, path)
    if sniff_format(data) is None:
        return None
    return record_from_bytes(data, path)


def _json_run(data: bytes, path: str | Path) -> RunRecord | None:
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or not {"format", "status"} <= obj.keys():
        return None
    return RunRecord.from_json(obj, source=str(path))


def _expand(arg: str) -> tuple[str, list[str], bool]:
    """(group path, files, explicit) for one command-line path; directories list their own files, sorted."""
    if os.path.isdir(arg):
        name = arg.rstrip("/\\") or arg
        files = sorted(e.path for e in os.scandir(arg) if e.is_file() and not e.name.startswith("."))
        return name, files, False
    if os.path.isfile(arg):
        return os.path.dirname(arg) or ".", [arg], True
    raise SpeedrunError(f"{arg}: no such file or directory (expected a training log, a parsed-run .json or a "
                        "directory of them)")


def collect_runs(paths: Sequence[str | os.PathLike[str]]) -> list["Group"]:
    """Group the runs found at ``paths`` (module docstring): one group per directory, split when needed.

    Groups come in the order their directories first appear; split parts by ascending step count.

    Raises:
        SpeedrunError: a path does not exist, a file named explicitly is not a run, or a directory holds none.
    """
    if not paths:
        raise SpeedrunError("no paths given: expected training logs, parsed-run .json files or directories")
    found: dict[str, list[RunRecord]] = {}  # group path (as first given) -> runs
    names: dict[str, str] = {}  # absolute directory -> group path as first given
    skipped: dict[str, list[str]] = {}
    seen: set[str] = set()
    for arg in map(os.fspath, paths):
        given, files, explicit = _expand(arg)
        group_path = names.setdefault(os.path.abspath(given), given)
        runs = found.setdefault(group_path, [])
        known = 0
        for file in files:
            if os.path.abspath(file) in seen:
                known += 1
                continue
            seen.add(os.path.abspath(file))
            run = load_run(file)
            if run is None and explicit:
                raise SpeedrunError(f"{file}: not a training log or parsed-run .json")
            if run is None:
                skipped.setdefault(group_path, []).append(file)
            else:
                runs.append(run)
        if not runs and not known:
            raise SpeedrunError(f"{arg}: holds no training logs or parsed-run .json files")
    originals = iter(_originals([r for runs in found.values() for r in runs]))
    groups = []
    for path, runs in found.items():
        groups += _split(path, runs, [next(originals) for _ in runs], tuple(skipped.get(path, ())))
    return _with_unique_slugs(groups)


def _originals(runs: list[RunRecord]) -> list[str | None]:
    """For each run, the file of the first earlier run with the same content hash, else ``None``."""
    first: dict[str, str] = {}
    out = []
    for run in runs:
        out.append(first.get(run.content_hash) if run.content_hash else None)
        if run.content_hash:
            first.setdefault(run.content_hash, run.file)
    return out


def _split(path: str, runs: list[RunRecord], originals: list[str | None],
           skipped: tuple[str, ...]) -> list[Group]:
    """One group, or one per (step count, GPU count) when the directory mixes them."""
    steps = _assign([r.steps for r in runs])
    gpus = _assign([r.gpu_count for r in runs])
    keys = list(zip(steps, gpus))
    split_steps, split_gpus = len(set(steps)) > 1, len(set(gpus)) > 1
    reason = _split_reason(path, runs, split_steps, split_gpus)
    out = []
    for key in sorted(set(keys), key=_sort_key):
        idx = [i for i, k in enumerate(keys) if k == key]
        suffix = _suffix(key, split_steps, split_gpus)
        out.append(Group(name=f"{path}{suffix}", path=path, slug=suffix, runs=tuple(runs[i] for i in idx),
                         split_reason=reason, duplicate_of=tuple(originals[i] for i in idx), skipped=skipped))
    return out


def _assign(values: list[int | None]) -> list[int | str | None]:
    """Unknown values join the only known one; with several known values they stay apart (``None``)."""
    known = {v for v in values if v is not None}
    only = known.pop() if len(known) == 1 else None
    return [only if v is None else v for v in values]


def _sort_key(key: tuple[int | None, int | None]) -> tuple:
    return tuple((v is None, v or 0) for v in key)


def _split_reason(path: str, runs: list[RunRecord], split_steps: bool, split_gpus: bool) -> str | None:
    parts = []
    if split_steps:
        counts = Counter("unknown" if r.steps is None else str(r.steps) for r in runs)
        parts.append("step counts differ (" + ", ".join(f"{k} runs of {s}" for s, k in sorted(counts.items())) + ")")
    if split_gpus:
        counts = Counter("unknown" if r.gpu_count is None else str(r.gpu_count) for r in runs)
        parts.append("GPU counts differ (" + ", ".join(f"{k} runs on {g}" for g, k in sorted(counts.items())) + ")")
    return f"{path}: " + "; ".join(parts) if parts else None


def _suffix(key: tuple[int | None, int | None], split_steps: bool, split_gpus: bool) -> str:
    steps, gpus = key
    parts = []
    if split_steps:
        parts.append("steps unknown" if steps is None else f"{steps} steps")
    if split_gpus:
        parts.append("GPUs unknown" if gpus is None else "CPU" if gpus == 0 else f"{gpus} GPU{'s' * (gpus != 1)}")
    return f" [{', '.join(parts)}]" if parts else ""


def _with_unique_slugs(groups: list[Group]) -> list[Group]:
    """Give each group a unique file-name-safe slug: the shortest unique path tail plus its split suffix."""
    tails = [Path(os.path.abspath(g.path)).parts for g in groups]
    for depth in range(1, max(len(t) for t in tails) + 1):
        slugs = [_safe("__".join(t[-depth:]) + g.slug) for t, g in zip(tails, groups)]
        if len(set(slugs)) == len(slugs):
            break
    return [Group(name=g.name, path=g.path, slug=slug, runs=g.runs, split_reason=g.split_reason,
                  duplicate_of=g.duplicate_of, skipped=g.skipped) for g, slug in zip(groups, slugs)]


def _safe(slug: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", slug.replace(" [", "_").replace("]", "")).strip("_") or "group"


def run_label(file: str) -> str:
    """A short name for a run in tables: the first 8 characters of a uuid file name, else the file's stem."""
    stem = Path(file).stem if Path(file).suffix in (".txt", ".log", ".json") else Path(file).name
    return stem[:8] if _UUID_RE.match(stem) else stem
