"""A ready-to-submit record folder in the public records' layout (:func:`build_bundle`).

Each side (baseline, candidate) is what ``speedrun compare`` takes (a directory of training logs or parsed-run
``.json`` files, or one file) and must resolve to one group. The folder follows the public records that ship statistics
(2026-05-20_BigramsSignTrick: ``README.md``, ``baseline/``, ``pr299/``, each with its logs and a
``statistics.md``)::

    OUT/README.md                 results table (runs, steps, time and loss mean/std, p, runs needed, the
                                  Welch time test), rules check, scipy snippets that reproduce every figure
    OUT/baseline/<logs>           every run of the baseline, byte for byte (incomplete and duplicate ones too,
                                  so the run accounting is checkable), and statistics.md
    OUT/candidate/<logs>          the same for the candidate; its statistics.md ends with "vs baseline"

A parsed-run ``.json`` names its log (``file``, the path as given to ``speedrun parse``); the log is copied and
must still have the content that was parsed (sha256). A relative ``file`` is relative to the folder ``speedrun
parse`` ran in, which the record does not say: it is looked for from the current folder (the workflow's project
root), then from the ``.json``'s folder and each folder above it (:func:`log_candidates`), and the first copy
with the parsed content is taken. The statistics are computed from the copied logs, so they describe exactly
the bundle. The folder is written in a temporary folder beside OUT and renamed to OUT when complete; OUT must
not exist (an empty folder is replaced). The README's warning block lists every warning of the comparison
(:func:`speedrun.analysis.comparison.compare_groups`: violated rules, runs identical on both sides, runs without
a time).

The ``speedrun bundle`` stage (:mod:`speedrun.bundle`) is the command line over :func:`build_bundle`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from speedrun.analysis.bundle_readme import bundle_readme, left_out_lines
from speedrun.analysis.comparison import Comparison, compare_groups, one_group
from speedrun.analysis.group_stats import DEFAULT_ALPHA, DEFAULT_TARGET, GroupStats, group_stats
from speedrun.analysis.groups import CodeSplit, Group, check_only
from speedrun.analysis.logs import RunRecord
from speedrun.analysis.provenance import sha256
from speedrun.analysis.tables import noted_skips
from speedrun.errors import SpeedrunError
from speedrun.support.atomic import write_text

SIDES = ("baseline", "candidate")


def build_bundle(baseline: str, candidate: str, out: str | os.PathLike[str], *, target: float = DEFAULT_TARGET,
                 alpha: float = DEFAULT_ALPHA, title: str | None = None, code_split: CodeSplit = "pool",
                 only: Sequence[str] | None = None, announce: Callable[[str], None] | None = None,
                 sides: Mapping[str, str] | None = None) -> Path:
    """Write the bundle folder ``out`` (module docstring) for the runs at ``baseline`` and ``candidate``
    (with ``only``, just the files listed there, as ``speedrun compare --only``: the workflow passes the
    configured seeds, so that a stale run of a removed seed is not bundled). ``announce`` gets each line of the
    README that names files of a side's folder left out as not runs (the CLI prints them). ``sides``: what
    each side runs (``baseline``/``candidate`` -> one line), for the README's rules check.

    Returns the folder's path.

    Raises:
        SpeedrunError: ``out`` exists and is not empty; a side does not resolve to one group; a log named by a
            parsed-run JSON is missing or changed; two logs of one side share a file name.
    """
    final = Path(out)
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise SpeedrunError(f"--out {final}: exists and is not an empty folder; choose a new folder")
    check_only([baseline, candidate], only)
    group_path = dict(zip(SIDES, (baseline, candidate)))
    sources = {side: one_group(path, side.upper(), code_split, only) for side, path in group_path.items()}
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}.", dir=final.parent))
    try:
        for side, group in sources.items():
            copy_logs(group, tmp / side, record_origins(group_path[side], only))
        groups = {side: _relative(one_group(str(tmp / side), side.upper(), code_split), tmp, side) for side in SIDES}
        stats = {side: group_stats(g, target, alpha) for side, g in groups.items()}
        comparison = compare_groups(groups["baseline"], groups["candidate"], alpha, target)
        names = {side: Path(sources[side].path).name or side for side in SIDES}
        not_bundled = left_out(sources)
        _write_texts(tmp, stats, comparison, names, title or f"{names['candidate']} vs {names['baseline']}",
                     not_bundled, sides or {})
        tmp.chmod(0o777 & ~_umask())
        if final.is_dir():
            final.rmdir()
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for line in left_out_lines(not_bundled) if announce else ():
        announce(line)
    return final


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# (the record's ``file``, its ``content_hash``) -> the parsed-run .json files that hold that record
Origins = Mapping[tuple[str, str], Sequence[Path]]


def record_origins(path: str, only: Sequence[str] | None = None) -> dict[tuple[str, str], list[Path]]:
    """The parsed-run ``.json`` files at ``path`` (a directory's own files, or the file itself; with ``only``,
    those listed there, as :func:`speedrun.analysis.groups.collect_runs` reads them): (``file``,
    ``content_hash``) of each record -> the ``.json`` files holding it. Logs and other files are left out
    (a file is read past its first bytes only when they start a JSON object); unreadable files too (the
    grouping has read them already, or said why)."""
    folder = Path(path)
    files = sorted(e for e in folder.iterdir() if e.is_file() and not e.name.startswith(".")) \
        if folder.is_dir() else [folder]
    wanted = None if only is None else {os.path.abspath(f) for f in only}
    out: dict[tuple[str, str], list[Path]] = {}
    for file in files:
        if wanted is not None and os.path.abspath(file) not in wanted:
            continue
        try:
            with open(file, "rb") as f:
                if f.read(4096).lstrip()[:1] != b"{":
                    continue
            obj = json.loads(file.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(obj, dict) and isinstance(obj.get("file"), str):
            out.setdefault((obj["file"], str(obj.get("content_hash") or "")), []).append(file)
    return out


def log_candidates(run: RunRecord, origins: Origins) -> list[Path]:
    """Where the log of ``run`` may be, in order: its ``file`` as it stands (absolute, or relative to the
    current folder), then, for a relative ``file`` of a record read from a ``.json`` (``origins``,
    :func:`record_origins`), that path under the ``.json``'s folder and under each folder above it
    (``speedrun parse`` records the log's path as it was given, relative to the folder it ran in, which
    holds the ``.json`` in the usual layouts: ``results/parse/<variant>/seed0.json`` names
    ``results/train/<variant>/seed0.txt``). Each path once."""
    file = Path(run.file)
    paths = [file]
    if not file.is_absolute():
        for record in origins.get((run.file, run.content_hash or ""), ()):
            folder = Path(os.path.abspath(record)).parent
            paths += [d / file for d in (folder, *folder.parents)]
    unique: dict[str, Path] = {}
    for p in paths:
        unique.setdefault(os.path.abspath(p), p)
    return list(unique.values())


def find_log(run: RunRecord, origins: Origins | None = None) -> tuple[Path, bytes]:
    """The log of ``run`` and its bytes: the first of :func:`log_candidates` that exists and, when the run has a
    ``content_hash``, has that sha256.

    Raises:
        SpeedrunError: no candidate can be read (naming the ``.json`` that names the log and every path tried,
            with why), or every one that exists differs from what was parsed.
    """
    origins = origins or {}
    records = list(origins.get((run.file, run.content_hash or ""), ()))
    named_by = f" named by {', '.join(map(str, records))}" if records else ""
    changed, tried = None, []
    for path in log_candidates(run, origins):
        try:
            data = path.read_bytes()
        except OSError as e:
            tried.append((path, e.strerror or str(e)))
            continue
        if not run.content_hash or sha256(data) == run.content_hash:
            return path, data
        changed = changed or path
    if changed is not None:
        raise SpeedrunError(f"{changed}: the log changed since it was parsed (sha256 differs from the parsed-run "
                            f"record{named_by}); parse it again")
    if len(tried) == 1:
        path, why = tried[0]
        raise SpeedrunError(f"{path}: cannot read the training log of run {run.file}{named_by} ({why}); a bundle "
                            "needs the logs, not only their parsed .json")
    raise SpeedrunError(f"{run.file}: cannot find the training log of run {run.file}{named_by}: tried "
                        + "; ".join(f"{path} ({why})" for path, why in tried)
                        + " (a relative path is looked for from the current folder, then from the .json's folder "
                        "and each folder above it); a bundle needs the logs, not only their parsed .json")


def copy_logs(group: Group, dest: Path, origins: Origins | None = None) -> list[Path]:
    """Copy the log of every run of ``group`` into ``dest`` (created), found by :func:`find_log` (``origins``:
    the ``.json`` files the runs were read from, :func:`record_origins`); return the copies.

    Raises:
        SpeedrunError: a log is missing, differs from what was parsed, or two logs share a file name.
    """
    dest.mkdir(parents=True)
    copied: dict[str, Path] = {}
    for run in group.runs:
        source, data = find_log(run, origins)
        if str(source.resolve()) in copied:
            continue
        target = dest / source.name
        if target.exists():
            raise SpeedrunError(f"{source}: another log of the {dest.name} runs is also named {source.name}")
        target.write_bytes(data)
        copied[str(source.resolve())] = target
    return list(copied.values())


def _relative(group: Group, root: Path, side: str) -> Group:
    """``group`` with file names relative to the bundle (``baseline/<log>``) instead of the temporary folder."""
    def rel(path: str | None) -> str | None:
        return None if path is None else os.path.relpath(path, root)

    runs = tuple(replace(r, file=rel(r.file)) for r in group.runs)
    return replace(group, name=side, path=side, slug=side, runs=runs, skipped=tuple(map(rel, group.skipped)),
                   duplicate_of=tuple(map(rel, group.duplicate_of)))


def left_out(sources: Mapping[str, Group]) -> dict[str, list[tuple[str, str]]]:
    """Per side, the files of its folder that look like logs or parsed runs but are not runs, as ``speedrun
    stats`` notes them (:func:`~speedrun.analysis.tables.noted_skips`: a cut or unreadable log, a corrupt
    ``.json``), so not copied: (the file's path relative to the side's folder, why it is not a run)."""
    def name(path: str, group: Group) -> str:
        relative = os.path.relpath(path, group.path) if os.path.isdir(group.path) else os.path.basename(path)
        return relative if not relative.startswith("..") else path

    return {side: [(name(f, g), why) for f, why in noted_skips(g)] for side, g in sources.items()}


def _write_texts(root: Path, stats: dict[str, GroupStats], c: Comparison, names: dict[str, str], title: str,
                 not_bundled: Mapping[str, Sequence[tuple[str, str]]], sides: Mapping[str, str]) -> None:
    from speedrun.analysis.comparison_tables import vs_baseline_lines
    from speedrun.analysis.tables import statistics_markdown

    titles = {side: f"{side.capitalize()} ({names[side]})" for side in SIDES}
    extra = {"baseline": [], "candidate": vs_baseline_lines(c, "baseline", "candidate")}
    for side in SIDES:
        write_text(root / side / "statistics.md", statistics_markdown(stats[side], titles[side], extra[side]))
    write_text(root / "README.md", bundle_readme(title, stats["baseline"], stats["candidate"], c, titles,
                                                 not_bundled, sides))
