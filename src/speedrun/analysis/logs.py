"""Parse one training log of any era into per-step metrics and a result record.

Three formats (speedrun-spec.md section 4; docs/formats.md "Training log"):

* ``llmc``: llm.c logs, ``s:<step> trl:<loss>[ lr:<x> norm:<x>]`` (train) and ``s:<step> tel:<loss>``
  (val) lines, nothing else: no separators, no timing, no total step count (record #1, 2024-06-06_AdamW;
  2024-10-13_llmc).
* ``modded``: the public modded-nanogpt speedrun logs of every era: the code dump, then blocks separated by
  lines of exactly 100 ``=`` (``Running Python/pytorch ...``, ``nvidia-smi`` table, DataLoader lines,
  warm-up messages), then ``step:{s}/{N} [train_loss:x|val_loss:x] train_time:{ms}ms step_avg:{ms}ms``
  lines and ``peak memory ...``. A file may start with a separator (Oct-Nov 2024) or with the code.
* ``speedrun``: our own ``speedrun train`` logs: ``key: value`` header lines (first line ``speedrun: <ver>``),
  one separator, the same step lines as ``modded``, ``peak memory allocated: ...``, the ``phases:`` line
  (:mod:`speedrun.support.phases`; absent from logs written before it) and possibly a ``run diverged: ...`` or
  ``run failed: ...`` line.

Only what follows the last separator line is searched for step lines, and every pattern is anchored at a
line start, so the ``print0(f"step:...")`` strings inside a code dump are never taken as metrics.

The official result of a run is the ``val_loss`` and ``train_time`` of its ``step:N/N val_loss:`` line
(modded-nanogpt README, record rules). In the logs before 2025-02-01 the first 10 steps are untimed
(``step_avg:nanms``, the timer restarts at step 11); the final line's ``train_time`` is still the result.

llm.c logs carry no total step count (no header, no config lines; the ``lr`` column of 2024-10-13_llmc prints
0.000000 from step 19214, 346 steps before the end, and 2024-06-06_AdamW has none, so it does not mark the last
step either). llm.c (``train_gpt2.cu``) validates at step 0, every ``val_loss_every`` steps and at the last
step N, then stops; train lines are numbered from 0. So the final line of a finished run is a ``tel`` at step
``k + 1`` where ``k`` is the last ``trl`` step, and so is the last line of a run cut right after a periodic
validation (``head -n 19579`` of 2024-10-13_llmc/main.log ends ``s:19499 trl:``, ``s:19500 tel:``). What
tells them apart is the validation interval, the greatest common divisor of the earlier ``tel`` steps after 0
(128 in 2024-06-06_AdamW, 250 in 2024-10-13_llmc): a periodic validation falls on a multiple of it, the final
one of a finished run only when N happens to be one (9536 and 19560 are not). A run is complete only when its
last ``tel`` step is off that interval, and then ``N = k + 1``; one that ends on the interval, or whose only
earlier validation is at step 0 (interval unknown), is truncated, its reason naming the step and the interval:
a finished run whose N is a multiple of the interval cannot be told from a cut one and is not counted either.

A log is read as bytes, after a UTF-8 byte-order mark (what Windows PowerShell's ``Out-File -Encoding utf8``
writes) when it has one; a UTF-16 or UTF-32 file (PowerShell's ``>``), a compressed or an empty file is refused
with a message that says so (:func:`not_a_log_reason`).

Parsing works on bytes: the code dump (most of a modded log) is hashed but never decoded, so 200 MB of logs
parse in a few seconds.
"""

from __future__ import annotations

import codecs
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Mapping, NamedTuple, get_args

import numpy as np
import pandas as pd

from speedrun.analysis.provenance import modded_provenance, sha256, speedrun_provenance
from speedrun.analysis.provenance import versions as read_versions
from speedrun.errors import SpeedrunError
from speedrun.support.divergence import DivergenceWatch
from speedrun.support.phases import PREFIX as PHASES_PREFIX
from speedrun.support.phases import overhead_seconds, parse_phases

Format = Literal["speedrun", "modded", "llmc"]
Status = Literal["complete", "diverged", "truncated", "failed"]
FORMATS: tuple[str, ...] = get_args(Format)
STATUSES: tuple[str, ...] = get_args(Status)
METRIC_COLUMNS = ("step", "total_steps", "kind", "train_loss", "val_loss", "train_time_ms", "step_avg_ms")

SEPARATOR = b"=" * 100
_NUM = rb"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)"
_STEP_RE = re.compile(
    rb"^step:(\d+)/(\d+) (?:(train|val)_loss:(" + _NUM + rb") )?train_time:(" + _NUM + rb")ms step_avg:("
    + _NUM + rb")ms[ \t\r]*$", re.M)
_LLMC_RE = re.compile(rb"^s:(\d+) (trl|tel):(" + _NUM + rb")(?: lr:" + _NUM + rb" norm:" + _NUM + rb")?[ \t\r]*$",
                      re.M)
_LLMC_FIRST_RE = re.compile(rb"\s*s:\d+ t[re]l:")
_STEP_FIRST_RE = re.compile(rb"\s*step:\d+/\d+ ")
_MODDED_MARK_RE = re.compile(rb"^(?:step:\d+/\d+ |Running [Pp]y)", re.M)
_PEAK_RE = re.compile(rb"peak memory (?:allocated|consumption): (\d+) MiB")

NOT_A_LOG = ("not a training log (no 'speedrun:' header, no step:/s: lines, no line of 100 '=' followed by step: or "
             "'Running Python' lines)")
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
               b"PK\x03\x04": "zip"}
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
              (codecs.BOM_UTF16_BE, "UTF-16"))  # UTF-32 LE first: its BOM starts with UTF-16 LE's


@dataclass(frozen=True)
class RunRecord:
    """The result of one run (docs/formats.md "Parsed run"), in the units of the log.

    ``val_loss`` (nats/token), ``train_time_ms`` and ``step_avg_ms`` (milliseconds) are those of the final
    ``step:N/N val_loss`` line, ``None`` unless ``status == "complete"``. ``steps`` is the scheduled total N
    (``None`` for an unfinished llm.c log), ``last_step`` the last logged step. ``gpu_count`` counts the GPU
    rows of the nvidia-smi table (``modded``) or comes from our ``device:`` header (0 on CPU).
    ``code_hash`` identifies the code version: the sha256 of the code dump (``modded``: the text before the
    separator that ends it, CRLF line endings read as LF) or, for our logs, of the ``config:`` line's JSON with
    the git commit (:func:`speedrun.analysis.provenance.speedrun_provenance`); ``content_hash`` the sha256 of
    the whole file; ``curve_hash`` the sha256 of the logged (step, loss) pairs. Identical files or identical
    loss curves are the same run (:mod:`speedrun.analysis.groups`). ``reason`` says why a run is not complete.

    Provenance (:mod:`speedrun.analysis.provenance`; ``None`` when the log does not say): ``git_commit``,
    ``git_dirty``, ``config_sha256``, ``train_data_sha256``, ``val_data_sha256`` (hex), ``val_tokens``,
    ``tokens_per_step`` (tokens), ``device`` (our ``device:`` header), ``compile_s`` (s, compile and warm-up,
    not in train_time), ``compile_flags`` (sorted compile settings), ``versions`` (python, torch, cuda, triton).

    Phases (our ``phases:`` line, :mod:`speedrun.support.phases`; ``None`` for a log without it):
    ``phases_s`` maps each phase, ``wall`` and ``first_batch`` to seconds; ``validations`` counts the
    evaluations; :attr:`overhead_s` is ``wall - training - compile``.
    """

    file: str
    format: Format
    status: Status
    steps: int | None
    last_step: int | None
    val_loss: float | None
    train_time_ms: float | None
    step_avg_ms: float | None
    seed: int | None = None
    variant: str | None = None
    world_size: int | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    code_hash: str | None = None
    peak_memory_mib: int | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    content_hash: str = ""
    curve_hash: str | None = None
    reason: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    config_sha256: str | None = None
    train_data_sha256: str | None = None
    val_data_sha256: str | None = None
    val_tokens: int | None = None
    tokens_per_step: int | None = None
    device: str | None = None
    compile_s: float | None = None
    compile_flags: tuple[str, ...] | None = None
    phases_s: Mapping[str, float] | None = None
    validations: int | None = None

    @property
    def overhead_s(self) -> float | None:
        """Seconds of the run's process besides training and compile (``wall - training - compile`` of
        :attr:`phases_s`), or ``None`` without a ``phases:`` line."""
        return None if self.phases_s is None else overhead_seconds(self.phases_s)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (docs/formats.md "Parsed run")."""
        out = asdict(self)
        out["versions"] = dict(self.versions)
        out["phases_s"] = None if self.phases_s is None else dict(self.phases_s)
        out["compile_flags"] = None if self.compile_flags is None else list(self.compile_flags)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], source: str = "<json>") -> "RunRecord":
        """Rebuild a record written by :meth:`to_json` (keys added later default to ``None``).

        Raises:
            SpeedrunError: a required key is missing or ``format``/``status`` has an unknown value.
        """
        names = {f.name for f in fields(cls)}
        missing = [k for k in ("file", "format", "status", "steps", "last_step", "val_loss", "train_time_ms")
                   if k not in obj]
        if missing:
            raise SpeedrunError(f"{source}: parsed-run record lacks key(s) {', '.join(missing)}")
        if obj["format"] not in FORMATS or obj["status"] not in STATUSES:
            raise SpeedrunError(f"{source}: format {obj['format']!r} / status {obj['status']!r}: expected one of "
                                f"{FORMATS} / {STATUSES}")
        values = {k: v for k, v in obj.items() if k in names}
        if values.get("compile_flags") is not None:
            values["compile_flags"] = tuple(values["compile_flags"])
        values["versions"] = dict(values.get("versions") or {})
        if values.get("phases_s") is not None:
            values["phases_s"] = dict(values["phases_s"])
        return cls(**values)


@dataclass(frozen=True)
class ParsedLog:
    """A parsed log: ``metrics`` has one row per step line, columns :data:`METRIC_COLUMNS`.

    ``step`` int64; ``total_steps`` Int64 (NA for llm.c lines of an unfinished run); ``kind`` ``"train"`` or
    ``"val"``; ``train_loss``, ``val_loss`` (nats/token), ``train_time_ms``, ``step_avg_ms`` float64, NaN where
    the line has no such value (and where the log printed ``nan``, e.g. the untimed ``step_avg:nanms``).
    """

    record: RunRecord
    metrics: pd.DataFrame


@dataclass(frozen=True)
class _Scan:
    """The raw pieces of one log: its format, step lines as bytes tuples ``(step, total, kind, loss, train_time,
    step_avg)`` (``b""`` where absent; llm.c rows have no total or times), the text after the last separator
    (``body``), the decoded header/metadata text, and the code dump."""

    format: Format
    rows: list[tuple[bytes, ...]]
    body: bytes
    meta: str
    code: bytes | None


def parse_log(path: str | Path) -> ParsedLog:
    """Parse the training log at ``path`` into per-step metrics and its :class:`RunRecord`.

    Raises:
        SpeedrunError: the file cannot be read or is not a training log of a known format.
    """
    data = _read(path)
    scan = _scan(data, path)
    return ParsedLog(record=_record(scan, data, path), metrics=_metrics(scan))


def read_record(path: str | Path) -> RunRecord:
    """The :class:`RunRecord` of the log at ``path``, without building the metrics table (faster).

    Raises:
        SpeedrunError: as :func:`parse_log`.
    """
    return record_from_bytes(_read(path), path)


def record_from_bytes(data: bytes, path: str | Path) -> RunRecord:
    """The :class:`RunRecord` of a log's content ``data``; ``path`` names it in the record and in errors.

    Raises:
        SpeedrunError: ``data`` is not a training log of a known format.
    """
    return _record(_scan(data, path), data, path)


def sniff_format(data: bytes) -> Format | None:
    """The log format of a file's content, or ``None`` when it is not a training log.

    A log is ours when it starts with ``speedrun:``, llm.c when it starts with ``s:<n> trl:``/``tel:``,
    modded when it starts with a ``step:<s>/<N>`` line, or holds a separator line of exactly 100 ``=``
    followed by a ``step:<s>/<N>`` or ``Running Python``/``Running pytorch`` line (so a README with a rule
    of ``=`` is not taken for a log). A UTF-8 byte-order mark at the start is ignored.
    """
    data = data.removeprefix(codecs.BOM_UTF8)
    if data.startswith(b"speedrun: "):
        return "speedrun"
    if _LLMC_FIRST_RE.match(data):
        return "llmc"
    if _STEP_FIRST_RE.match(data):
        return "modded"
    seps = _separators(data)
    if seps and _MODDED_MARK_RE.search(data, seps[0][0]):
        return "modded"
    return None


def not_a_log_reason(data: bytes) -> str:
    """Why a file's content ``data``, which :func:`sniff_format` does not take for a log, is not one: empty,
    compressed (gzip, bzip2, xz, zstd, zip), UTF-16 or UTF-32 text (a byte-order mark: what Windows PowerShell's
    ``>`` writes), or text of no known format (:data:`NOT_A_LOG`). One sentence, for messages and
    ``skip_reasons``."""
    if not data.strip():
        return "empty file (a run killed before it wrote anything?)"
    kind = next((k for magic, k in _COMPRESSED.items() if data.startswith(magic)), None)
    if kind:
        return f"{kind}-compressed: decompress it to read it as a log"
    wide = next(((bom, enc) for bom, enc in _WIDE_BOMS if data.startswith(bom)), None)
    if wide:
        bom, enc = wide
        powershell = ", as Windows PowerShell's '>' writes" if bom == codecs.BOM_UTF16_LE else ""
        return (f"{enc} text (byte-order mark {bom.hex(' ').upper()}{powershell}): convert it to UTF-8 to read it "
                f"as a log (iconv -f {enc} -t UTF-8 LOG > NEW, or in PowerShell Get-Content LOG | Set-Content "
                "-Encoding utf8 NEW)")
    return NOT_A_LOG


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise SpeedrunError(f"{path}: cannot read the log ({e.strerror or e})") from None


def _separators(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte spans of the lines that are exactly 100 ``=`` (``end`` after the newline)."""
    spans, pos = [], 0
    while (i := data.find(SEPARATOR, pos)) >= 0:
        end = i + len(SEPARATOR)
        tail = data[end:end + 2]
        at_line_start = i == 0 or data[i - 1] == 0x0A
        if at_line_start and (tail[:1] in (b"\n", b"") or tail == b"\r\n"):
            spans.append((i, data.find(b"\n", end) + 1 or len(data)))
        pos = end
    return spans


def _scan(data: bytes, path: str | Path) -> _Scan:
    """Raises: SpeedrunError: ``data`` is no training log (:func:`not_a_log_reason`)."""
    data = data.removeprefix(codecs.BOM_UTF8)
    fmt = sniff_format(data)
    if fmt is None:
        raise SpeedrunError(f"{path}: {not_a_log_reason(data)}")
    if fmt == "llmc":
        rows = [(st, b"", b"val" if k == b"tel" else b"train", loss, b"", b"") for st, k, loss in _LLMC_RE.findall(data)]
        return _Scan(fmt, rows, data, "", None)
    seps = _separators(data)
    body = data[seps[-1][1]:] if seps else data
    if fmt == "speedrun":
        meta = data[:seps[0][0]] if seps else data
        return _Scan(fmt, _STEP_RE.findall(body), body, meta.decode("utf-8", "replace"), None)
    code_start = seps[0][1] if seps and seps[0][0] == 0 else 0
    code_seps = [s for s in seps if s[0] >= code_start]
    code_end = code_seps[0][0] if code_seps else len(data)
    meta_start = code_seps[0][1] if code_seps else len(data)
    meta = data[meta_start:seps[-1][0]] if seps and seps[-1][0] >= meta_start else b""
    return _Scan(fmt, _STEP_RE.findall(body), body, meta.decode("utf-8", "replace"), data[code_start:code_end])


def _first_line(body: bytes, prefix: bytes) -> str | None:
    """The first line of ``body`` that starts with ``prefix`` (decoded, stripped), or ``None``.

    ``bytes.find`` is used instead of a ``^``-anchored regex: it is 15 times faster on 200 KB logs.
    """
    if body.startswith(prefix):
        i = 0
    elif (j := body.find(b"\n" + prefix)) >= 0:
        i = j + 1
    else:
        return None
    end = body.find(b"\n", i)
    return body[i:end if end >= 0 else len(body)].decode("utf-8", "replace").strip()


def _peak_memory(body: bytes) -> int | None:
    """MiB of the last ``peak memory allocated: N MiB ...`` or ``peak memory consumption: N MiB`` line."""
    i = body.rfind(b"\npeak memory ")
    m = _PEAK_RE.match(body, i + 1 if i >= 0 else 0)
    return int(m.group(1)) if m else None


def _phases(body: bytes, path: str | Path) -> dict[str, Any]:
    """``phases_s`` and ``validations`` of our log's ``phases:`` line (empty when it has none).

    Raises:
        SpeedrunError: the line is malformed (:func:`speedrun.support.phases.parse_phases`).
    """
    line = _first_line(body, PHASES_PREFIX.encode())
    if line is None:
        return {}
    try:
        seconds, count = parse_phases(line)
    except ValueError as e:
        raise SpeedrunError(f"{path}: line {line[:60]!r}...: {e}") from None
    return {"phases_s": seconds, "validations": count}


def _float(x: bytes | None) -> float | None:
    return None if x is None or x == b"" else float(x)


class _Result(NamedTuple):
    steps: int | None  # scheduled total N
    last_step: int | None
    final: tuple[float, float | None, float | None] | None  # val_loss, train_time_ms, step_avg_ms of step N
    curve_hash: str | None
    nonfinite: str | None  # why the run diverged: "non-finite val_loss at step 12" (support.divergence)
    cut: str | None = None  # why an llm.c log that ends with a val line is not taken as finished


def _record(scan: _Scan, data: bytes, path: str | Path) -> RunRecord:
    result = _result(scan)
    status, reason = _status(scan, result)
    final = result.final if status == "complete" else None
    if scan.format == "speedrun":
        info = {**speedrun_provenance(scan.meta, path), **_phases(scan.body, path)}
    else:
        info = modded_provenance(scan.meta, scan.code)
    return RunRecord(
        file=str(path), format=scan.format, status=status, steps=result.steps, last_step=result.last_step,
        val_loss=final[0] if final else None, train_time_ms=final[1] if final else None,
        step_avg_ms=final[2] if final else None, peak_memory_mib=_peak_memory(scan.body),
        versions=read_versions(scan.meta), content_hash=sha256(data), curve_hash=result.curve_hash, reason=reason,
        **info)


def _result(scan: _Scan) -> _Result:
    """Scheduled steps, last step, the final val line, the loss-curve hash and the first non-finite loss.

    llm.c: N is known only when the run ended, i.e. its last row is a val row one step after the last train
    row, at a step off the validation interval (module docstring; :func:`_llmc_cut`).
    """
    rows = scan.rows
    if not rows:
        return _Result(None, None, None, None, None)
    last_step, final, cut = int(rows[-1][0]), None, None
    if scan.format == "llmc":
        train = [r for r in rows if r[2] == b"train"]
        ended = rows[-1][2] == b"val" and bool(train) and last_step == int(train[-1][0]) + 1
        cut = _llmc_cut(rows) if ended else None
        ended = ended and cut is None
        steps = last_step if ended else None
        final = (float(rows[-1][3]), None, None) if ended else None
    else:
        steps = int(rows[-1][1])
        final = next(((float(loss), float(t), _float(avg)) for st, n, kind, loss, t, avg in reversed(rows)
                      if kind == b"val" and int(st) == int(n) == steps), None)
    losses = [r for r in rows if r[2]]
    nonfinite = diverged_at(losses)
    curve = sha256(b" ".join(r[0] + b":" + r[3] for r in losses))
    return _Result(steps, last_step, final, curve, nonfinite, cut)


def diverged_at(rows: list[tuple[bytes, ...]]) -> str | None:
    """Why the run of these loss rows (``(step, total, kind, loss, ...)``, log order) has diverged, by the rule
    of :mod:`speedrun.support.divergence` (a log written before that rule, or by another program, is judged as
    the training loop would have stopped it), or ``None``."""
    watch = DivergenceWatch()
    for row in rows:
        check = watch.val if row[2] == b"val" else watch.train
        why = check(int(row[0]), float(row[3]))
        if why:
            return why
    return None


def _llmc_cut(rows: list[tuple[bytes, ...]]) -> str | None:
    """Why an llm.c log whose last row is a val row one step after its last train row may be a run cut right
    after a periodic validation, or ``None`` when that row is the final validation: its step is off the
    validation interval, the gcd of the earlier val steps after 0 (module docstring)."""
    last = int(rows[-1][0])
    interval = math.gcd(*(int(r[0]) for r in rows[:-1] if r[2] == b"val"))
    expected = "at N = the last 'trl' step + 1 (llm.c logs state no total step count)"
    if interval == 0:
        return (f"log ends at step {last} with its first val line after step 0: the validation interval is unknown, "
                f"so a periodic validation cannot be told from the final one; expected a final 's:N tel:' line off "
                f"the interval of the earlier val lines, {expected}")
    if last % interval == 0:
        return (f"log ends at step {last} with a val line at a multiple of the validation interval {interval}, as "
                f"periodic validations are: the run may have been cut there; expected the final 's:N tel:' line "
                f"off that interval, {expected}")
    return None


def _status(scan: _Scan, result: _Result) -> tuple[Status, str | None]:
    """Status by precedence: diverged, failed, complete, truncated (docs/formats.md "Parsed run")."""
    diverged = _first_line(scan.body, b"run diverged")
    if diverged or result.nonfinite:
        return "diverged", diverged or result.nonfinite
    failed = _first_line(scan.body, b"run failed")
    if failed:
        return "failed", failed
    if result.final is not None:
        return "complete", None
    if result.last_step is None:
        return "truncated", "no metrics lines"
    if result.cut:
        return "truncated", result.cut
    total = result.steps if result.steps is not None else "an unknown total"
    return "truncated", f"log ends at step {result.last_step} of {total} without the final val_loss line"


def _metrics(scan: _Scan) -> pd.DataFrame:
    """The per-step table (:class:`ParsedLog`) from the scanned rows."""
    rows = scan.rows
    totals = [_result(scan).steps] * len(rows) if scan.format == "llmc" else [int(r[1]) for r in rows]
    kind = np.array(["val" if r[2] == b"val" else "train" for r in rows], dtype=object)
    loss = np.array([_float(r[3]) for r in rows], dtype=np.float64)
    nan = np.full(len(rows), np.nan)
    frame = {"step": [int(r[0]) for r in rows], "total_steps": totals, "kind": kind,
             "train_loss": np.where(kind == "train", loss, nan), "val_loss": np.where(kind == "val", loss, nan),
             "train_time_ms": np.array([_float(r[4]) for r in rows], dtype=np.float64),
             "step_avg_ms": np.array([_float(r[5]) for r in rows], dtype=np.float64)}
    df = pd.DataFrame(frame, columns=list(METRIC_COLUMNS))
    return df.astype({"step": "int64", "total_steps": "Int64", "kind": "object"})
