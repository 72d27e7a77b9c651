"""Output-path errors of the ``speedrun`` command: one line naming the path and the OS's reason, status 2;
other exceptions keep their traceback."""

import errno
import os
import tempfile

import pytest

from speedrun import cli
from speedrun import stats as stats_stage
from test_logs import our_log, write


@pytest.fixture
def runs(tmp_path):
    folder = tmp_path / "runs"
    for seed, final in enumerate([6.9, 6.95, 6.85]):
        write(folder / f"seed{seed}.txt", our_log(seed=seed, losses=[10.8, 9.0, 8.0, 7.5, final])[0])
    return folder


def _one_line(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err.rstrip("\n")


def test_json_out_to_a_folder(runs, tmp_path, capsys):
    folder = tmp_path / "adir"
    folder.mkdir()
    assert cli.main(["stats", str(runs), "--target", "7", "--json-out", str(folder)]) == 2
    assert _one_line(capsys) == f"speedrun stats: error: {folder}: is a folder, expected a file name (Is a directory)"
    assert list(folder.iterdir()) == []


def test_markdown_dir_that_is_a_file(runs, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    assert cli.main(["stats", str(runs), "--target", "7", "--markdown-dir", str(afile)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"speedrun stats: error: {afile}{os.sep}")
    assert line.endswith(f": {afile} is a file, not a folder (Not a directory)")
    assert afile.read_text() == "keep\n"


def test_json_out_on_a_read_only_file_system(runs, tmp_path, capsys, monkeypatch):
    def read_only(prefix, dir):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(dir, prefix + "x1y2"))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    out = tmp_path / "summary.json"
    assert cli.main(["stats", str(runs), "--target", "7", "--json-out", str(out)]) == 2
    assert _one_line(capsys) == f"speedrun stats: error: {out}: {os.strerror(errno.EROFS)}"


def test_os_error_without_a_path_keeps_its_traceback(runs, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(errno.EIO, "a bug, not a path")

    monkeypatch.setattr(stats_stage, "compute_stats", broken)
    with pytest.raises(OSError, match="a bug"):
        cli.main(["stats", str(runs)])


def test_other_exceptions_keep_their_traceback(runs, monkeypatch):
    monkeypatch.setattr(stats_stage, "compute_stats", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["stats", str(runs)])
