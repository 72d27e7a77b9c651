"""Provenance of a run, read from its log: code version, data hashes, hardware, versions, compile settings.

Our logs (``speedrun train``; docs/formats.md "Training log") carry ``key: value`` header lines before the
separator: ``seed``, ``variant``, ``config`` (the resolved training config as one line of JSON),
``git_commit``, ``git_dirty`` (``true``/``false``), ``config_sha256``, ``train_data_sha256`` (of the train
shards' manifest), ``val_data_sha256`` (of the validation shard), ``val_tokens``, ``world_size``,
``tokens_per_step``, ``device`` (``cpu`` or ``<GPU name> x <count>``) and ``compile_s`` (compile and warm-up
seconds, outside train_time). A key that is absent is ``None`` in the record.

The public logs (speedrun-spec.md 4.1-4.2) carry less: the GPU model and count come from the rows of the
nvidia-smi table, and two facts are read from the code dump, since their value decides whether two runs may be
compared (modded-nanogpt README, record rules: the same validation tokens, no new compile flags):

* ``val_tokens``: the first assignment ``val_tokens = <int>`` or ``val_tokens: int = <int>`` (the
  ``Hyperparameters`` field; 10,485,760 in every record since Nov 2024);
* compile flags: every uncommented ``torch._inductor.config.<name> = <value>`` or
  ``torch._dynamo.config.<name> = <value>`` line, and the keyword arguments of ``torch.compile(...)`` calls
  (``torch.compile:dynamic=False``). In our logs, every key of the ``config`` JSON whose name contains
  ``compile``, ``inductor`` or ``dynamo`` (``config:compile=false``).

Both sets are kept as sorted tuples of strings so that two runs compare by set equality. Every public log
here compiles with ``dynamic=False, fullgraph=True``; ``coordinate_descent_tuning`` is banned for records
(the comment beside it in the 2025 code dumps).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping

from speedrun.errors import SpeedrunError

_HEADER_RE = re.compile(r"^([a-z][a-z0-9_]*): ?(.*?)\s*$", re.M)
_PYTHON_RE = re.compile(r"^Running [Pp]ython (\S+)", re.M)
_TORCH_RE = re.compile(r"^Running [Pp]y[Tt]orch (\S+) compiled for CUDA (\S+)", re.M)
_TRITON_RE = re.compile(r"^Running Triton version (\S+)", re.M)
_GPU_ROW_RE = re.compile(r"^\|\s+\d+\s+(\S.*?)\s+(?:On|Off)\s+\|", re.M)
_DEVICE_RE = re.compile(r"^(.*?)\s*[x×]\s*(\d+)$")
_VAL_TOKENS_RE = re.compile(rb"val_tokens\s*(?::\s*int\s*)?=\s*(\d[\d_]*)\b")
_CONFIG_FLAG_RE = re.compile(rb"torch\._(inductor|dynamo)\.config\.([A-Za-z_][\w.]*)\s*=(?!=)\s*([^#\r\n]*)")
_COMPILE_KEY_RE = re.compile(r"compile|inductor|dynamo", re.I)

INT_KEYS = ("seed", "world_size", "tokens_per_step", "val_tokens")
TEXT_KEYS = ("variant", "git_commit", "config_sha256", "train_data_sha256", "val_data_sha256", "device")
COMPILE_CALL = b"torch.compile("


def sha256(data: bytes | str) -> str:
    """Hex sha256 of ``data`` (a str is UTF-8 encoded)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def versions(meta: str) -> dict[str, str]:
    """``python``, ``torch``, ``cuda`` and ``triton`` versions from the ``Running ...`` lines (absent keys
    when a line is missing; no ``cuda`` for a CPU build of torch, ``compiled for CUDA None``)."""
    out = {}
    if m := _PYTHON_RE.search(meta):
        out["python"] = m.group(1)
    if m := _TORCH_RE.search(meta):
        out["torch"] = m.group(1)
        if m.group(2) != "None":                     # a CPU build of torch: torch.version.cuda is None
            out["cuda"] = m.group(2)
    if m := _TRITON_RE.search(meta):
        out["triton"] = m.group(1)
    return out


def modded_provenance(meta: str, code: bytes | None) -> dict[str, Any]:
    """RunRecord fields of a public log: GPU model and count (nvidia-smi rows), the code dump's sha256 (with
    CRLF line endings made LF first, so a copy saved on Windows is the same code version), and its
    ``val_tokens`` and compile flags (module docstring); ``None`` where not found."""
    names = _GPU_ROW_RE.findall(meta)
    return {"gpu": ", ".join(dict.fromkeys(names)) or None, "gpu_count": len(names) or None,
            "code_hash": sha256(code.replace(b"\r\n", b"\n")) if code else None,
            "val_tokens": code_val_tokens(code) if code else None,
            "compile_flags": code_compile_flags(code) if code else None}


def code_val_tokens(code: bytes) -> int | None:
    """The first ``val_tokens = <int>`` / ``val_tokens: int = <int>`` of a code dump, else ``None``."""
    pos = 0
    while (i := code.find(b"val_tokens", pos)) >= 0:
        if m := _VAL_TOKENS_RE.match(code, i):
            return int(m.group(1).replace(b"_", b""))
        pos = i + 10
    return None


def _line_at(code: bytes, i: int) -> tuple[bytes, int]:
    """The line containing byte ``i`` (without newline) and ``i``'s offset in it."""
    start = code.rfind(b"\n", 0, i) + 1
    end = code.find(b"\n", i)
    return code[start:end if end >= 0 else len(code)], i - start


def _commented(line: bytes, offset: int) -> bool:
    return b"#" in line[:offset]


def code_compile_flags(code: bytes) -> tuple[str, ...]:
    """Sorted compile settings of a code dump (module docstring): inductor/dynamo config assignments and the
    keyword arguments of ``torch.compile(...)`` calls, in uncommented code."""
    flags: set[str] = set()
    for marker in (b"torch._inductor.config.", b"torch._dynamo.config."):
        pos = 0
        while (i := code.find(marker, pos)) >= 0:
            pos = i + len(marker)
            line, offset = _line_at(code, i)
            m = _CONFIG_FLAG_RE.match(line, offset)
            if m and not _commented(line, offset):
                flags.add(f"{m.group(1).decode()}.{m.group(2).decode()}={m.group(3).decode().strip()}")
    pos = 0
    while (i := code.find(COMPILE_CALL, pos)) >= 0:
        pos = i + len(COMPILE_CALL)
        line, offset = _line_at(code, i)
        if not _commented(line, offset):
            flags.update(f"torch.compile:{arg}" for arg in _keyword_args(line[offset + len(COMPILE_CALL):]))
    return tuple(sorted(flags))


def _keyword_args(rest: bytes) -> list[str]:
    """``key=value`` items of a call's argument list (``rest`` starts after its ``(``; one line)."""
    depth, item, items = 0, bytearray(), []
    for ch in rest:
        if ch in b"([{":
            depth += 1
        elif ch in b")]}":
            if depth == 0:
                items.append(bytes(item))
                break
            depth -= 1
        elif ch == ord(",") and depth == 0:
            items.append(bytes(item))
            item = bytearray()
            continue
        item.append(ch)
    out = []
    for raw in items:
        text = raw.decode("utf-8", "replace").strip()
        if re.match(r"^[A-Za-z_]\w*\s*=[^=]", text):
            key, value = text.split("=", 1)
            out.append(f"{key.strip()}={value.strip()}")
    return out


def config_compile_flags(config: Mapping[str, Any], prefix: str = "", inside: bool = False) -> tuple[str, ...]:
    """``config:<key path>=<JSON value>`` for every key of a (nested) config whose name, or a parent's name,
    contains ``compile``, ``inductor`` or ``dynamo``, sorted."""
    out = []
    for key, value in config.items():
        path, matched = f"{prefix}{key}", inside or bool(_COMPILE_KEY_RE.search(str(key)))
        if isinstance(value, Mapping):
            out += config_compile_flags(value, f"{path}.", matched)
        elif matched:
            out.append(f"config:{path}={json.dumps(value, sort_keys=True)}")
    return tuple(sorted(out))


def speedrun_provenance(meta: str, path: str | Path) -> dict[str, Any]:
    """RunRecord fields from our ``key: value`` header lines (module docstring).

    ``code_hash`` is the sha256 of the ``config`` line's JSON, preceded by ``git <commit>[+dirty]`` and a
    newline when the log names a commit: runs with one code version share it.

    Raises:
        SpeedrunError: a header value has the wrong type (``seed: x``, ``git_dirty: maybe``, a ``config``
            that is not a JSON object).
    """
    header = dict(_HEADER_RE.findall(meta))
    out: dict[str, Any] = {k: header.get(k) or None for k in TEXT_KEYS}
    for key in INT_KEYS:
        out[key] = _typed(header, key, int, path, "an integer")
    out["compile_s"] = _typed(header, "compile_s", float, path, "a number of seconds")
    out["git_dirty"] = _flag(header, "git_dirty", path)
    out.update(_device(out["device"]))
    config = header.get("config")
    out["compile_flags"] = config_compile_flags(_config(config, path)) if config else None
    out["code_hash"] = _code_hash(config, out["git_commit"], out["git_dirty"])
    return out


def _typed(header: Mapping[str, str], key: str, kind: type, path: str | Path, expected: str) -> Any:
    if not header.get(key):
        return None
    try:
        return kind(header[key])
    except ValueError:
        raise SpeedrunError(f"{path}: header '{key}: {header[key]}': expected {expected}") from None


def _flag(header: Mapping[str, str], key: str, path: str | Path) -> bool | None:
    value = header.get(key)
    if not value:
        return None
    if value.lower() not in ("true", "false"):
        raise SpeedrunError(f"{path}: header '{key}: {value}': expected true or false")
    return value.lower() == "true"


def _device(device: str | None) -> dict[str, Any]:
    """``gpu`` and ``gpu_count`` of a ``device:`` value: ``cpu`` -> (None, 0); ``NAME x K`` -> (NAME, K)."""
    if device == "cpu":
        return {"gpu": None, "gpu_count": 0}
    if device and (m := _DEVICE_RE.match(device)):
        return {"gpu": m.group(1), "gpu_count": int(m.group(2))}
    return {"gpu": device, "gpu_count": None}


def _config(text: str, path: str | Path) -> Mapping[str, Any]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpeedrunError(f"{path}: header 'config': not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(config, dict):
        raise SpeedrunError(f"{path}: header 'config': expected a JSON object, got {text[:40]!r}")
    return config


def _code_hash(config: str | None, commit: str | None, dirty: bool | None) -> str | None:
    if config is None:
        return None
    if commit is None:
        return sha256(config)
    return sha256(f"git {commit}{'+dirty' if dirty else ''}\n{config}")
