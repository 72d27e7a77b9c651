"""A record's script and companion files, taken out of its log (issue 21, item 2; speedrun-spec.md section 4).

A record's log begins with its code: ``train_gpt.py`` as read by the script itself, then, since 2025-12, each
companion file it imports (``triton_kernels.py``, ``dc_triton_kernels.py``) appended as a section
``"\\n\\n" + 40 "-" + "\\n# <name>.py\\n" + 40 "-" + "\\n\\n" + <file>``; the whole printed with a newline and
followed by a line of exactly 100 ``=`` (records #1-#89; the logs of Oct-Nov 2024 also *start* with such a
line). So the code is everything before the first line of 100 ``=`` that follows it, and splitting on the
section headings gives back each file byte for byte.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from speedrun.errors import SpeedrunError

SEPARATOR = "=" * 100
_SECTION = re.compile(r"\n\n-{40}\n# ([A-Za-z0-9_.-]+\.py)\n-{40}\n\n")
MAIN_SCRIPT = "train_gpt.py"


def record_code(text: str, source: str = "<log>") -> dict[str, str]:
    """The files of a record's log ``text``: ``{"train_gpt.py": ..., "<companion>.py": ...}`` in log order.

    ``source`` names the log in messages. Raises :class:`SpeedrunError` when the log holds no code before a
    line of 100 ``=`` (an llm.c log, or no separator), or when a companion file is named twice.
    """
    lines = text.split("\n")
    start = 1 if lines and lines[0] == SEPARATOR else 0      # Oct-Nov 2024: a separator opens the log
    try:
        end = lines.index(SEPARATOR, start)
    except ValueError:
        raise SpeedrunError(f"{source}: no line of 100 '=' after the code; not a record log with its script "
                            "(llm.c logs hold no code)") from None
    code = "\n".join(lines[start:end])
    if not code.strip():
        raise SpeedrunError(f"{source}: no code before its line of 100 '='")
    parts = _SECTION.split(code)
    files = {MAIN_SCRIPT: parts[0]}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in files:
            raise SpeedrunError(f"{source}: the companion file {name} appears twice in the logged code")
        files[name] = body
    return files


def write_record_code(log: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the files of the record log ``log`` (:func:`record_code`) into ``out_dir``; return their paths
    (``train_gpt.py`` first). Raises :class:`SpeedrunError` as :func:`record_code`, or when ``log`` is missing."""
    path = Path(log)
    if not path.is_file():
        raise SpeedrunError(f"{path}: record log not found (a script variant's script.log)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, body in record_code(path.read_text(encoding="utf-8"), str(path)).items():
        (out / name).write_text(body, encoding="utf-8")
        written.append(out / name)
    return written
