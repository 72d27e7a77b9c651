"""runlog.code_version: git_commit and git_dirty of the work tree that holds the code."""

import shutil
import subprocess

import pytest

from speedrun.training.runlog import code_version

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org",
                           "-c", "commit.gpgsign=false", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("y = 2\n")
    _git(tmp_path, "add", "code.py", "pkg/mod.py")
    _git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


@needs_git
def test_clean_tree_gives_head_and_not_dirty(repo):
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert code_version(repo / "pkg") == {"git_commit": head, "git_dirty": "false"}


@needs_git
def test_untracked_files_do_not_make_the_tree_dirty(repo, tmp_path_factory):
    (repo / "my_config.yaml").write_text("steps: 4\n")
    venv = tmp_path_factory.mktemp("venv")
    (repo / ".venv").symlink_to(venv)                       # a symlinked .venv, as in a user's checkout
    (repo / "pkg" / "scratch.py").write_text("z = 3\n")
    assert _git(repo, "status", "--porcelain").strip()       # git itself lists them
    assert code_version(repo)["git_dirty"] == "false"


@needs_git
@pytest.mark.parametrize("change", ["modified", "staged", "deleted"])
def test_tracked_changes_make_the_tree_dirty(repo, change):
    (repo / "my_config.yaml").write_text("steps: 4\n")
    if change == "deleted":
        (repo / "code.py").unlink()
    else:
        (repo / "code.py").write_text("x = 2\n")
    if change == "staged":
        _git(repo, "add", "code.py")
    assert code_version(repo)["git_dirty"] == "true"


def test_outside_a_work_tree_gives_nothing(tmp_path):
    assert code_version(tmp_path) == {}


def test_a_log_path_that_is_a_folder_is_refused_before_training(tmp_path):
    """`speedrun train --out <folder>` trained the whole run, then failed at the rename and left the temporary
    log behind: the run log now refuses the folder when it is opened, before the first step."""
    from speedrun.errors import SpeedrunError
    from speedrun.training.runlog import RunLog

    with pytest.raises(SpeedrunError, match=rf"^{tmp_path}: is a folder; expected the training log's file name"):
        RunLog(tmp_path, echo=False)
    assert list(tmp_path.iterdir()) == []
    log = RunLog(tmp_path / "seed0.txt", echo=False)
    log.write("step:0/1 val_loss:10.8 train_time:0ms step_avg:0.00ms")
    log.finish()
    assert (tmp_path / "seed0.txt").read_text() == "step:0/1 val_loss:10.8 train_time:0ms step_avg:0.00ms\n"
    assert [p.name for p in tmp_path.iterdir()] == ["seed0.txt"]
