"""A script variant of config.yaml (``variants.<name>.script``; issue 21, item 2), resolved once: :func:`script_spec`.

A script variant runs a script of its own (a record's ``train_gpt.py``) instead of our model, through the stage
``speedrun run-script``. Its script comes in one of two forms:

- ``{path: train_gpt.py, files: [triton_kernels.py], env: {...}}``: the script and its companion files;
- ``{log: records/.../<uuid>.txt, env: {...}}``: a record's log, whose code part holds the script and its
  companion files (:func:`speedrun.analysis.record_code.record_code`), taken out when the run starts.

Relative paths are read from the config's ``clone`` folder when it names one (a modded-nanogpt clone), else
from Snakemake's working folder, as ``data.files.paths`` are. Only ``train.world_size``, ``train.nodes`` and
``train.device`` apply to such a variant (:data:`SCRIPT_TRAIN_KEYS`): where its processes go. Everything else
(model, schedule, optimizer, data sizes) is the script's own.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from speedrun.analysis.record_code import MAIN_SCRIPT, record_code
from speedrun.analysis.provenance import sha256
from speedrun.errors import SpeedrunError
from speedrun.workflow.messages import ENV_TEXT_HINT

# The variant's `train` keys that apply to a script variant: they place its processes (Placement).
SCRIPT_TRAIN_KEYS = ("world_size", "nodes", "device")


@dataclass(frozen=True)
class ScriptSpec:
    """The script of a script variant, its paths as the workflow reads them (relative to Snakemake's working
    folder, or absolute).

    ``path`` and ``files`` (the path form) or ``log`` (the log form) are set, never both. ``env``: the
    variant's environment settings, as ``(NAME, VALUE)`` pairs in config order. ``sha256``: of the script
    (the file, or the ``train_gpt.py`` of the log's code) when the config was resolved."""

    path: str | None
    files: tuple[str, ...]
    log: str | None
    env: tuple[tuple[str, str], ...]
    sha256: str

    @property
    def inputs(self) -> list[str]:
        """The files whose change reruns the variant: the script and its companions, or the log."""
        return [self.log] if self.log else [str(self.path), *self.files]

    @property
    def source_args(self) -> list[str]:
        """``speedrun run-script`` arguments naming the script: ``--script P --files F...`` or ``--log L``."""
        if self.log:
            return ["--log", self.log]
        return ["--script", str(self.path), *(["--files", *self.files] if self.files else [])]

    @property
    def env_args(self) -> list[str]:
        """``NAME=VALUE`` of each ``env`` setting (``speedrun run-script --env``)."""
        return [f"{name}={value}" for name, value in self.env]

    @property
    def params(self) -> str:
        """Canonical JSON of the spec (a params value Snakemake compares as a string): the paths and env,
        not the sha256 (an edit of the script reruns the runs through their inputs)."""
        return json.dumps({"script": {"path": self.path, "files": list(self.files), "log": self.log,
                                      "env": dict(self.env)}}, sort_keys=True, separators=(",", ":"))

    def describe(self) -> str:
        """One line for the report and the comparison: ``script <path> (sha256 <12 hex>)``, or ``script
        train_gpt.py of the log <log> (sha256 ...)``, with its companion files and env settings."""
        what = f"script {self.path}" if self.path else f"script {MAIN_SCRIPT} of the log {self.log}"
        extra = [f"companion files {', '.join(self.files)}"] if self.files else []
        extra += [f"env {' '.join(self.env_args)}"] if self.env else []
        return f"{what} (sha256 {self.sha256[:12]})" + "".join(f"; {e}" for e in extra)


def config_path(path: str, clone: str | None) -> str:
    """``path`` as the workflow reads it: ``~`` expanded; a relative one joined to ``clone`` (itself read
    from Snakemake's working folder, ``~`` expanded) when the config names a ``clone``."""
    path = os.path.expanduser(path)
    if clone is None or os.path.isabs(path):
        return path
    return os.path.join(os.path.expanduser(clone), path)


def script_spec(where: str, name: str, script: Mapping[str, Any], clone: str | None) -> ScriptSpec:
    """The :class:`ScriptSpec` of ``variants.<name>.script`` (``script``, after the schema's check).

    Raises:
        SpeedrunError: one line naming ``where``, the variant and the key: neither ``path`` nor ``log``, or
            both; ``files`` beside ``log`` (the log holds the companion files); a script, companion file or log
            that is not a file; a log without a script before its line of 100 ``=``.
    """
    key = f"variants.{name}.script"
    given = [k for k in ("path", "log") if k in script]
    if len(given) != 1:
        raise SpeedrunError(f"{where}: {key}: expected either `path` (the script, with its `files`) or `log` (a "
                            f"record's log holding the script), got {'both' if given else 'neither'}")
    if "log" in script and script.get("files"):
        raise SpeedrunError(f"{where}: {key}.files: not with `log`: the companion files are taken out of the log")
    env = tuple((str(k), _env_value(where, key, k, v)) for k, v in (script.get("env") or {}).items())
    if "log" in script:
        log = config_path(script["log"], clone)
        _check_file(where, f"{key}.log", log, "a record's log")
        try:
            code = record_code(Path(log).read_text(encoding="utf-8"), log)[MAIN_SCRIPT]
        except (OSError, UnicodeDecodeError) as e:
            raise SpeedrunError(f"{where}: {key}.log: {log}: cannot read it ({e})") from None
        except SpeedrunError as e:
            raise SpeedrunError(f"{where}: {key}.log: {e}") from None
        return ScriptSpec(path=None, files=(), log=log, env=env, sha256=sha256(code))
    path = config_path(script["path"], clone)
    _check_file(where, f"{key}.path", path, "the script")
    files = tuple(config_path(f, clone) for f in script.get("files") or ())
    for i, f in enumerate(files):
        _check_file(where, f"{key}.files[{i}]", f, "a companion file")
    names = [Path(p).name for p in (path, *files)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpeedrunError(f"{where}: {key}: {', '.join(twice)} named twice: the script and its companion files "
                            "are copied side by side into the run's folder, so their names must differ")
    return ScriptSpec(path=path, files=files, log=None, env=env, sha256=sha256(Path(path).read_bytes()))


def check_script_train_keys(where: str, name: str, overrides: Mapping[str, Any]) -> None:
    """Refuse a key of ``variants.<name>.train`` that does not apply to a script variant (anything but
    :data:`SCRIPT_TRAIN_KEYS`), naming the variant and the key."""
    for key in overrides:
        if key not in SCRIPT_TRAIN_KEYS:
            takes = ", ".join(f"train.{k}" for k in SCRIPT_TRAIN_KEYS)
            raise SpeedrunError(f"{where}: variants.{name}.train.{key}: does not apply to a script variant "
                                f"(variants.{name}.script runs its own script, which sets its own model, schedule "
                                f"and data sizes); a script variant takes only {takes}")


def _check_file(where: str, key: str, path: str, what: str) -> None:
    if not os.path.isfile(path):
        found = "a folder" if os.path.isdir(path) else "no such file"
        raise SpeedrunError(f"{where}: {key}: {path}: {found}; expected {what} (a relative path is read from "
                            "the `clone` folder when the config names one, else from Snakemake's working folder)")


def _env_value(where: str, key: str, name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpeedrunError(f"{where}: {key}.env.{name}: {value!r}; expected a string or a number{ENV_TEXT_HINT}")
    return str(value)
