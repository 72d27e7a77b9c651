"""A record's script and companion files out of its log (speedrun.analysis.record_code; issue 21, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from speedrun.analysis.record_code import record_code, write_record_code
from speedrun.errors import SpeedrunError

LOGS = Path("/work/shared/reference-logs")
MAIN = "import os\nimport sys\n\nprint('step:1/2 train_time:1ms')  # looks like a log line\n"
KERNELS = "import torch\n\n\ndef relu2(x):\n    return x.relu() ** 2\n"
DC = "X = 1\n"


def record_log(files: list[tuple[str, str]], leading_separator: bool = False) -> str:
    """A log as the records write it: their train_gpt.py's own recipe (code, then per companion
    '\\n\\n' + 40 '-' + '\\n# name.py\\n' + 40 '-' + '\\n\\n' + file), printed with a newline, a line of 100 '=',
    the system lines, another line of 100 '=', then the run output."""
    code = files[0][1]
    for name, body in files[1:]:
        code += f"\n\n{'-' * 40}\n# {name}\n{'-' * 40}\n\n{body}"
    head = "=" * 100 + "\n" if leading_separator else ""
    return (head + code + "\n" + "=" * 100 + "\nRunning Python 3.12\n" + "=" * 100 + "\n"
            "step:0/2 val_loss:10.8000 train_time:0ms step_avg:0.00ms\n")


def test_script_and_companions_come_back_byte_for_byte():
    files = [("train_gpt.py", MAIN), ("triton_kernels.py", KERNELS), ("dc_triton_kernels.py", DC)]
    assert list(record_code(record_log(files)).items()) == files


def test_a_log_that_starts_with_a_separator_and_has_no_companions():
    assert record_code(record_log([("train_gpt.py", MAIN)], leading_separator=True)) == {"train_gpt.py": MAIN}


@pytest.mark.parametrize("text, message", [
    ("s:0 trl:10.9\ns:0 tel:10.8\n", "no line of 100 '=' after the code"),
    ("=" * 100 + "\n\n" + "=" * 100 + "\n", "no code before"),
    (record_log([("train_gpt.py", MAIN), ("k.py", DC), ("k.py", DC)]), "k.py appears twice"),
])
def test_logs_without_a_script_are_refused(text, message):
    with pytest.raises(SpeedrunError, match=message):
        record_code(text, "x.txt")


def test_write_record_code(tmp_path):
    log = tmp_path / "run.txt"
    log.write_text(record_log([("train_gpt.py", MAIN), ("triton_kernels.py", KERNELS)]))
    assert write_record_code(log, tmp_path / "code") == [tmp_path / "code/train_gpt.py",
                                                         tmp_path / "code/triton_kernels.py"]
    assert (tmp_path / "code/triton_kernels.py").read_text() == KERNELS
    with pytest.raises(SpeedrunError, match="record log not found"):
        write_record_code(tmp_path / "missing.txt", tmp_path / "code")


@pytest.mark.skipif(not LOGS.is_dir(), reason="the shared reference logs are not here")
@pytest.mark.parametrize("folder, companions", [
    ("2024-11-19_FlexAttention", []),            # starts with a separator
    ("2025-09-10_Yarn", []),
    ("2026-05-20_BigramsSignTrick/pr299", ["triton_kernels.py"]),
])
def test_reference_logs(folder, companions):
    log = sorted((LOGS / folder).glob("*.txt"))[0]
    files = record_code(log.read_text(), str(log))
    assert list(files) == ["train_gpt.py", *companions]
    assert files["train_gpt.py"].startswith("import os\n")
    for name, body in files.items():
        compile(body, name, "exec")                # whole Python files, not cut mid-way
        lines = body.splitlines()      # the system lines after the code are not in it (print0 calls are)
        assert not any(line.startswith("Running Python") for line in lines) and "=" * 100 not in lines
