"""Group runs for statistics: one group per directory, split when its runs are not comparable.

A path given to ``speedrun stats``/``compare`` is a training log, a parsed-run ``.json`` (written by
``speedrun parse``; read instead of re-parsing the log), or a directory of either. A directory contributes its
own files only (not its subdirectories); files are recognised by content, not by extension (some public logs
have none, and a directory also holds README.md or statistics.md). Files named on the command line are grouped
by their parent directory, so ``speedrun stats DIR/a.txt DIR/b.txt`` (a shell glob ``DIR/*.txt``) is the one
group ``DIR`` and files of two folders are two groups, as the folders themselves would be. ``only`` (``--only
FILE...``) restricts the files read to those listed: a directory keeps its name but contributes only its listed
files (the workflow passes the configured seeds, so that the parsed run of a seed removed from the config, still
in ``results/parse/<variant>/``, is not counted).

A public record directory can mix runs that must not be pooled (speedrun-spec.md 4.3): different total step
counts (2026-01-26-UntieValueEmbeddings: 1600 and 1575 steps) or GPU counts (single-GPU logs next to 8-GPU ones).
Such a directory is always split; the group names get a suffix (``dir [1600 steps]``) and ``split_reason`` says
why. A run whose step or GPU count is unknown (an unfinished llm.c log) joins the only known value, or a group of
its own when there are several.

Code versions (``RunRecord.code_hash``) are split only on request (``code_split="split"``, ``speedrun stats
--split-code``): the published figures pool them. 2025-09-10_Yarn (5 + 2 runs) and 2025-12-14_PartialKeyOffset
(10 + 1) are each published as one group although their code dumps differ (a type annotation; a comment), and
PUBLISHED.md reproduces only when they are pooled. When pooled, the mix is never silent: the group's warnings
name every code version and its run count.

Duplicates within a group are counted once, at their first appearance, and flagged with what made them
duplicates: an identical file (sha256) or, among complete runs, an identical loss curve (the same (step, loss)
pairs: a copy with other timings, or a rerun that was not independent). Groups are not checked against each
other: a variant that changes speed only (a bit-exact kernel) repeats another's curves seed for seed, and a
record folder may be a byte copy of another (2025-05-09_SkipMLPBlocks of 2025-09-05_SkipMLPBlocks); each is
its own sample (``speedrun compare`` warns about runs shared by its two sides).
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Literal, Sequence

from speedrun.analysis.logs import NOT_A_LOG, RunRecord, not_a_log_reason, record_from_bytes, sniff_format
from speedrun.errors import SpeedrunError

CodeSplit = Literal["pool", "split"]
DuplicateKind = Literal["identical file", "identical loss curve"]
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Group:
    """Runs that are compared with each other: same directory, same step count, same GPU count (and the same
    code version when split by code).

    ``name`` is the path as given (plus a suffix such as `` [1575 steps]`` when split); ``slug`` a file-name-safe
    unique name (the directory's name, plus the suffix); ``runs`` every run found, complete or not, in file
    order; ``duplicate_of`` (parallel to ``runs``; all ``None`` when not given) names, for a run that repeats
    an earlier one, that run's file, and ``duplicate_kind`` why (:data:`DuplicateKind`); duplicates are not
    counted. ``skipped`` lists the directory's files that are not runs (README.md...) and ``skip_reasons``
    (parallel; empty strings when not given) why each is not one (:func:`skip_reason`). ``code_split`` is the
    policy the group was made with.
    """

    name: str
    path: str
    slug: str
    runs: tuple[RunRecord, ...]
    split_reason: str | None = None
    duplicate_of: tuple[str | None, ...] = ()
    skipped: tuple[str, ...] = ()
    duplicate_kind: tuple[DuplicateKind | None, ...] = ()
    code_split: CodeSplit = "pool"
    skip_reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.skip_reasons:
            object.__setattr__(self, "skip_reasons", ("",) * len(self.skipped))
        if len(self.skip_reasons) != len(self.skipped):
            raise ValueError(f"group {self.name}: {len(self.skip_reasons)} skip_reasons for {len(self.skipped)} "
                             "skipped files")
        if not self.duplicate_of:
            object.__setattr__(self, "duplicate_of", (None,) * len(self.runs))
        if not self.duplicate_kind:
            kinds = tuple(None if d is None else "identical file" for d in self.duplicate_of)
            object.__setattr__(self, "duplicate_kind", kinds)
        if not len(self.duplicate_of) == len(self.duplicate_kind) == len(self.runs):
            raise ValueError(f"group {self.name}: {len(self.duplicate_of)} duplicate_of and "
                             f"{len(self.duplicate_kind)} duplicate_kind entries for {len(self.runs)} runs")

    @property
    def duplicates(self) -> dict[str, str]:
        """file of each duplicate run -> file of the earlier run it repeats."""
        return {r.file: orig for r, orig in zip(self.runs, self.duplicate_of) if orig is not None}

    @property
    def duplicate_kinds(self) -> dict[str, DuplicateKind]:
        """file of each duplicate run -> why it is one (identical file or identical loss curve)."""
        return {r.file: kind for r, kind in zip(self.runs, self.duplicate_kind) if kind is not None}

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

    @property
    def code_versions(self) -> dict[str, int]:
        """code_hash -> number of counted runs, most frequent first (runs without a code hash are left out)."""
        return dict(Counter(r.code_hash for r in self.counted if r.code_hash).most_common())

    def warnings(self) -> list[str]:
        """What makes the counted runs doubtful as one sample: repeated seeds, pooled code versions, mixed
        data, validation tokens, world sizes or GPU models, code from a dirty git tree."""
        counted = self.counted
        seeds = Counter(r.seed for r in counted if r.seed is not None)
        out = [f"seed {s} appears in {k} runs" for s, k in seeds.items() if k > 1]
        codes = self.code_versions
        if len(codes) > 1:
            out.append(f"{len(codes)} code versions pooled (code_hash " +
                       ", ".join(f"{h[:8]} x{k}" for h, k in codes.items()) + "); --split-code separates them")
        for key, what in (("train_data_sha256", "training data"), ("val_data_sha256", "validation data"),
                          ("val_tokens", "validation token counts"), ("world_size", "world sizes"),
                          ("gpu", "GPU models")):
            values = Counter(str(getattr(r, key)) for r in counted if getattr(r, key) is not None)
            if len(values) > 1:
                out.append(f"runs differ in {what} ({key} " +
                           ", ".join(f"{_short(v)} x{k}" for v, k in values.most_common()) + ")")
        dirty = sum(1 for r in counted if r.git_dirty)
        if dirty:
            out.append(f"{dirty} run(s) from a dirty git tree (git_dirty: true): git_commit does not identify "
                       "their code")
        return out


def _short(value: str) -> str:
    return value[:8] if re.fullmatch(r"[0-9a-f]{16,}", value) else value


def _only_value(values: Iterable[int | None]) -> int | None:
    known = {v for v in values if v is not None}
    return known.pop() if len(known) == 1 else None


def load_run(path: str | Path) -> RunRecord | None:
    """The run in the file at ``path``: a training log or a parsed-run JSON; ``None`` if it is neither.

    Raises:
        SpeedrunError: the file cannot be read, or is a parsed-run JSON with missing keys.
    """
    return _load(path)[0]


def _load(path: str | Path) -> tuple[RunRecord | None, str]:
    """(the run in the file, ``""``) or (``None``, why it is not a run: :func:`skip_reason`)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpeedrunError(f"{path}: cannot read ({e.strerror or e})") from None
    unmarked = data.removeprefix(codecs.BOM_UTF8)          # a UTF-8 BOM: what Windows editors write
    if unmarked.lstrip()[:1] == b"{":
        run = _json_run(unmarked, path)
    else:
        run = None if sniff_format(data) is None else record_from_bytes(data, path)
    return (run, "") if run is not None else (None, skip_reason(data, path))


_LOG_SUFFIXES = ("", ".txt", ".log")  # the names training logs have (one public log has no suffix)


def skip_reason(data: bytes, path: str | os.PathLike[str] | None = None) -> str:
    """Why a file's content ``data`` is not a run (for a file that :func:`load_run` skips), in one phrase that
    names what the file is: empty, compressed or UTF-16 (:func:`~speedrun.analysis.logs.not_a_log_reason`),
    JSON that is not valid or not a parsed-run record (content starting with ``{``/``[``, or a ``.json``
    name), a file of another kind (``path`` has a suffix other than ``.txt``, ``.log``, ``.json`` or none: a
    ``.csv`` beside a parsed run, README.md), or text that is no training log of a known format."""
    reason = not_a_log_reason(data)
    if reason != NOT_A_LOG:
        return reason
    suffix = Path(path).suffix.lower() if path is not None else ""
    data = data.removeprefix(codecs.BOM_UTF8)
    if suffix == ".json" or data.lstrip()[:1] in (b"{", b"["):
        try:
            json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return f"not valid JSON ({e})"
        return "JSON, but not a parsed-run record (no 'format' and 'status' keys)"
    if path is not None and suffix not in _LOG_SUFFIXES:
        csv = "; stats reads the parsed run's .json beside it" if suffix == ".csv" else ""
        return f"not a training log or parsed-run .json: a {suffix} file{csv}"
    return reason


def _json_run(data: bytes, path: str | Path) -> RunRecord | None:
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or not {"format", "status"} <= obj.keys():
        return None
    return RunRecord.from_json(obj, source=str(path))


def _expand(arg: str, only: frozenset[str] | None = None) -> tuple[str, list[str], bool]:
    """(group path, files, explicit) for one command-line path; directories list their own files, sorted.
    With ``only`` (absolute paths), just the files listed there, and they are then explicit."""
    if os.path.isdir(arg):
        name = arg.rstrip("/\\") or arg
        files = sorted(e.path for e in os.scandir(arg) if e.is_file() and not e.name.startswith("."))
        if only is not None:
            return name, [f for f in files if os.path.abspath(f) in only], True
        return name, files, False
    if os.path.isfile(arg):
        return os.path.dirname(arg) or ".", [arg] if only is None or os.path.abspath(arg) in only else [], True
    raise SpeedrunError(f"{arg}: no such file or directory (expected a training log, a parsed-run .json or a "
                        "directory of them)")


def collect_runs(paths: Sequence[str | os.PathLike[str]], code_split: CodeSplit = "pool",
                 only: Sequence[str | os.PathLike[str]] | None = None,
                 notes: list[str] | None = None) -> list["Group"]:
    """Group the runs found at ``paths`` (module docstring): one group per directory, split when needed.

    ``code_split="split"`` also splits a directory by code version. With ``only``, the files read are those
    of ``only`` that ``paths`` hold (:func:`check_only` says whether every one is held). Groups come in the
    order their directories first appear; split parts by ascending step and GPU count, code versions by first
    appearance.

    ``notes``: when given, and ``paths`` are several (a shell glob such as ``reference-logs/*``) without
    ``only``, a path that holds no run (a folder of subfolders only, a README.md) is skipped, with one line
    appended to ``notes`` saying why (:func:`skip_note`), unless no path is left: then the first one's error
    is raised as without ``notes``.

    Raises:
        SpeedrunError: a path does not exist, a file named explicitly (or in ``only``) is not a run, or a
            directory holds none (none of ``only``).
    """
    if not paths:
        raise SpeedrunError("no paths given: expected training logs, parsed-run .json files or directories")
    wanted = None if only is None else frozenset(os.path.abspath(f) for f in map(os.fspath, only))
    found: dict[str, list[RunRecord]] = {}  # group path (as first given) -> runs
    names: dict[str, str] = {}  # absolute directory -> group path as first given
    skipped: dict[str, list[tuple[str, str]]] = {}  # group path -> (file, reason)
    seen: set[str] = set()
    lenient = notes is not None and len(paths) > 1 and wanted is None
    skipped_paths: list[SpeedrunError] = []
    for arg in map(os.fspath, paths):
        if lenient:
            try:
                _runs_at(arg)
            except SpeedrunError as e:
                skipped_paths.append(e)
                continue
        given, files, explicit = _expand(arg, wanted)
        group_path = names.setdefault(os.path.abspath(given), given)
        runs = found.setdefault(group_path, [])
        known = 0
        for file in files:
            if os.path.abspath(file) in seen:
                known += 1
                continue
            seen.add(os.path.abspath(file))
            run, reason = _load(file)
            if run is None and explicit:
                raise SpeedrunError(f"{file}: {reason}")
            if run is None:
                skipped.setdefault(group_path, []).append((file, reason))
            else:
                runs.append(run)
        if not runs and not known and wanted is not None:
            raise SpeedrunError(f"{arg}: holds none of the files given with --only")
        if not runs and not known:
            subfolders = sorted(e.name for e in os.scandir(arg) if e.is_dir()) if os.path.isdir(arg) else []
            hint = (f"; its subfolders may hold them: pass {os.path.join(arg, '*')} (one group per subfolder: "
                    f"{', '.join(subfolders[:6])}{', ...' if len(subfolders) > 6 else ''})" if subfolders else "")
            raise SpeedrunError(f"{arg}: holds no training logs or parsed-run .json files{hint}")
    if skipped_paths and not found:
        raise skipped_paths[0]
    if notes is not None:
        notes.extend(skip_note(e) for e in skipped_paths)
    groups = []
    for path, runs in found.items():     # duplicates within a group: another variant may match a run exactly
        groups += _split(path, runs, find_duplicates(runs), tuple(skipped.get(path, ())), code_split)
    return _with_unique_slugs(groups)


def _runs_at(arg: str) -> None:
    """Raise the :class:`SpeedrunError` that :func:`collect_runs` would for ``arg`` alone when it holds no run
    (an explicit file that is not one, a folder without any); nothing otherwise (the files are read again
    after: a few ms per log)."""
    collect_runs([arg])


def skip_note(error: SpeedrunError) -> str:
    """The note for a path skipped among several: ``skipped <error>``."""
    return f"skipped {error}"


def check_only(paths: Sequence[str | os.PathLike[str]], only: Sequence[str | os.PathLike[str]] | None) -> None:
    """Refuse files in ``only`` that do not exist or that no path of ``paths`` holds (the path itself, or a file
    directly in a directory given): such a file would be silently left out.

    Raises:
        SpeedrunError: naming the first such file (and the paths).
    """
    held = {os.path.abspath(os.fspath(p)) for p in paths}
    for file in map(os.fspath, only or ()):
        full = os.path.abspath(file)
        if not os.path.isfile(full):
            raise SpeedrunError(f"--only {file}: no such file")
        if full not in held and os.path.dirname(full) not in held:
            raise SpeedrunError(f"--only {file}: not a file of the paths given ({', '.join(map(os.fspath, paths))}); "
                                "expected files in those directories")


def find_duplicates(runs: Sequence[RunRecord]) -> list[tuple[str, DuplicateKind] | None]:
    """For each run, ``(file of the first earlier run it repeats, why)`` or ``None``.

    A run repeats an earlier one with the same content hash (identical file) or, when both are complete, the
    same loss-curve hash (identical (step, loss) pairs).
    """
    by_content: dict[str, str] = {}
    by_curve: dict[str, str] = {}
    out: list[tuple[str, DuplicateKind] | None] = []
    for run in runs:
        curve = run.curve_hash if run.status == "complete" else None
        if run.content_hash and run.content_hash in by_content:
            out.append((by_content[run.content_hash], "identical file"))
        elif curve and curve in by_curve:
            out.append((by_curve[curve], "identical loss curve"))
        else:
            out.append(None)
        if run.content_hash:
            by_content.setdefault(run.content_hash, run.file)
        if curve:
            by_curve.setdefault(curve, run.file)
    return out


def _split(path: str, runs: list[RunRecord], dups: list[tuple[str, DuplicateKind] | None],
           skipped: tuple[tuple[str, str], ...], code_split: CodeSplit) -> list[Group]:
    """One group, or one per (step count, GPU count[, code version]) when the directory mixes them.
    ``skipped``: (file, reason) of the directory's files that are not runs."""
    steps = _assign([r.steps for r in runs])
    gpus = _assign([r.gpu_count for r in runs])
    codes = _assign([r.code_hash for r in runs]) if code_split == "split" else [None] * len(runs)
    keys = list(zip(steps, gpus, codes))
    split = (len(set(steps)) > 1, len(set(gpus)) > 1, len(set(codes)) > 1)
    reason = _split_reason(path, runs, split)
    first_seen = {c: i for i, c in reversed(list(enumerate(codes)))}
    out = []
    for key in sorted(set(keys), key=lambda k: (_sort_key(k[:2]), first_seen[k[2]])):
        idx = [i for i, k in enumerate(keys) if k == key]
        suffix = _suffix(key, split)
        out.append(Group(name=f"{path}{suffix}", path=path, slug=suffix, runs=tuple(runs[i] for i in idx),
                         split_reason=reason, duplicate_of=tuple(dups[i] and dups[i][0] for i in idx),
                         duplicate_kind=tuple(dups[i] and dups[i][1] for i in idx),
                         skipped=tuple(f for f, _ in skipped), skip_reasons=tuple(r for _, r in skipped),
                         code_split=code_split))
    return out


def _assign(values: list) -> list:
    """Unknown values join the only known one; with several known values they stay apart (``None``)."""
    known = {v for v in values if v is not None}
    only = known.pop() if len(known) == 1 else None
    return [only if v is None else v for v in values]


def _sort_key(key: tuple[int | None, ...]) -> tuple:
    return tuple((v is None, v or 0) for v in key)


def _split_reason(path: str, runs: list[RunRecord], split: tuple[bool, bool, bool]) -> str | None:
    parts = []
    for on, what, attr, unit in ((split[0], "step counts", "steps", "of"), (split[1], "GPU counts", "gpu_count", "on"),
                                 (split[2], "code versions", "code_hash", "of code")):
        if on:
            counts = Counter(getattr(r, attr) for r in runs)
            # by value, so 500 steps come before 1600 (numbers, not text); unknown last
            ordered = sorted(counts.items(), key=lambda item: (item[0] is None, 0 if item[0] is None else item[0]))
            listed = ", ".join(f"{k} run{'s' * (k != 1)} {unit} {'unknown' if v is None else str(v)[:8]}"
                               for v, k in ordered)
            parts.append(f"{what} differ ({listed})")
    return f"{path}: " + "; ".join(parts) if parts else None


def _suffix(key: tuple[int | None, int | None, str | None], split: tuple[bool, bool, bool]) -> str:
    steps, gpus, code = key
    parts = []
    if split[0]:
        parts.append("steps unknown" if steps is None else f"{steps} steps")
    if split[1]:
        parts.append("GPUs unknown" if gpus is None else "CPU" if gpus == 0 else f"{gpus} GPU{'s' * (gpus != 1)}")
    if split[2]:
        parts.append("code unknown" if code is None else f"code {code[:8]}")
    return f" [{', '.join(parts)}]" if parts else ""


def _with_unique_slugs(groups: list[Group]) -> list[Group]:
    """Give each group a unique file-name-safe slug: the shortest unique path tail plus its split suffix."""
    tails = [Path(os.path.abspath(g.path)).parts for g in groups]
    for depth in range(1, max(len(t) for t in tails) + 1):
        slugs = [_safe("__".join(t[-depth:]) + g.slug) for t, g in zip(tails, groups)]
        if len(set(slugs)) == len(slugs):
            break
    return [replace(g, slug=slug) for g, slug in zip(groups, slugs)]


def _safe(slug: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", slug.replace(" [", "_").replace("]", "")).strip("_") or "group"


def run_label(file: str) -> str:
    """A short name for a run in tables: the first 8 characters of a uuid file name, else the file's stem."""
    stem = Path(file).stem if Path(file).suffix in (".txt", ".log", ".json") else Path(file).name
    return stem[:8] if _UUID_RE.match(stem) else stem
