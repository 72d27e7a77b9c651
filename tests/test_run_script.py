"""A script variant's run (speedrun run-script; issue 21, item 2): a small CPU script of our own that reads
the shards where the records read them and writes a log in the records' format (tests/data/record_style_script.py),
run under torchrun with 2 processes, its log taken, parsed and counted as a record's."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hub_server import shard_bytes

from speedrun.analysis.logs import read_record
from speedrun.analysis.record_code import record_code
from speedrun.errors import SpeedrunError
from speedrun.training.record_script import lay_out_shards, run_script, script_exit_status

DATA = Path(__file__).parent / "data"
VAL = [50256, 1000, 2000, 3000]                  # mean id 14064: the script's last val_loss 1.4064


def shards_dir(tmp_path: Path) -> Path:
    """results/shards/tiny as the tokenize stage leaves it: three shards and their manifest."""
    folder = tmp_path / "results/shards/tiny"
    folder.mkdir(parents=True)
    files = {"tiny_val_000000.bin": VAL, "tiny_train_000001.bin": [50256, 5, 6], "tiny_train_000002.bin": [50256, 7]}
    for name, tokens in files.items():
        (folder / name).write_bytes(shard_bytes(tokens))
    (folder / "manifest.json").write_text(json.dumps({"shards": [
        {"file": n, "split": "val" if "_val_" in n else "train", "tokens": len(t)} for n, t in files.items()]}))
    return folder


def test_shards_are_linked_under_the_records_names(tmp_path):
    folder = shards_dir(tmp_path)
    links = lay_out_shards(folder, tmp_path / "run")
    assert [p.name for p in links] == ["fineweb_val_000000.bin", "fineweb_train_000001.bin",
                                       "fineweb_train_000002.bin"]
    assert all(p.parent == tmp_path / "run/data/fineweb10B" and p.is_symlink() for p in links)
    assert os.readlink(links[2]) == str((folder / "tiny_train_000002.bin").resolve())


@pytest.mark.slow
def test_a_record_style_script_runs_and_its_log_is_parsed(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "code/train_gpt.py"
    script.parent.mkdir()
    shutil.copy(DATA / "record_style_script.py", script)
    shutil.copy(DATA / "record_style_helper.py", tmp_path / "code/helper.py")
    out = tmp_path / "results/train/record/seed0.txt"
    run_script(script, [tmp_path / "code/helper.py"], shards_dir(tmp_path), tmp_path / "runs/record/seed0", 2,
               tmp_path / "results/compile-cache/record", {"NUM_ITERATIONS": "3"}, out)

    text = out.read_text()
    assert "world_size 2 train_shards 2" in text
    assert record_code(text)["helper.py"] == (DATA / "record_style_helper.py").read_text()
    record = read_record(out)
    assert record.status == "complete" and record.steps == 3
    assert record.val_loss == pytest.approx(np.mean(VAL) / 10000, abs=1e-4)
    assert record.train_time_ms == 300
    assert (tmp_path / "results/compile-cache/record/inductor").is_dir()


def test_a_failing_script_is_reported(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train_gpt.py"
    script.write_text("raise SystemExit(3)\n")
    with pytest.raises(SpeedrunError) as error:
        run_script(script, [], shards_dir(tmp_path), tmp_path / "run", 1, tmp_path / "cache", {}, tmp_path / "o.txt")
    # the script's own status, not torchrun's 1 (a new user's report)
    assert str(error.value) == (f"train_gpt.py exited with status 3 (torchrun: 1) (its output: "
                                f"{tmp_path / 'run' / 'torchrun.out'})")
    assert not (tmp_path / "o.txt").exists()


def test_the_scripts_status_is_read_from_torchruns_report():
    report = ("[rank0]: Traceback ...\nRoot Cause (first observed failure):\n[0]:\n  time      : 2026-12-07\n"
              "  rank      : 0 (local_rank: 0)\n  exitcode  : -9 (pid: 4242)\n  error_file: <N/A>\n")
    assert script_exit_status(report) == -9
    assert script_exit_status("torchrun: error: unrecognized arguments\n") is None


def test_a_log_that_is_no_training_log_fails_the_run(tmp_path):
    """A script that exits 0 but leaves a log parse cannot read: refused here, so that no output stands that every
    later call would fail to parse (a new user's report), and the next call runs the script again."""
    pytest.importorskip("torch")
    script = tmp_path / "train_gpt.py"
    script.write_text("import os, uuid\nos.makedirs('logs', exist_ok=True)\n"
                      "open(f'logs/{uuid.uuid4()}.txt', 'w').write('hello\\n')\n")
    with pytest.raises(SpeedrunError) as error:
        run_script(script, [], shards_dir(tmp_path), tmp_path / "run", 1, tmp_path / "cache", {}, tmp_path / "o.txt")
    assert str(error.value).startswith(f"train_gpt.py left {tmp_path / 'run' / 'logs'}/")
    assert str(error.value).endswith(".txt, which is not a training log (expected the records' format: the code, a "
                                     "line of 100 '=', then step:<s>/<N> lines; speedrun-spec.md section 4)")
    assert not (tmp_path / "o.txt").exists()
