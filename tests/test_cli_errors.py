"""Output-path errors of the ``speedrun`` command: one line naming the path and the OS's reason, status 2;
other exceptions keep their traceback."""

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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


def _speedrun_into_a_closed_pipe(*args):
    """Run ``python -m speedrun ARGS`` (this checkout's package) with stdout a pipe whose reader has already
    gone, as ``speedrun ... | head -1`` ends once head has its line; (exit status, stderr)."""
    src = Path(cli.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    read_end, write_end = os.pipe()
    os.close(read_end)                       # closed before the child starts: its first write fails, every time
    try:
        done = subprocess.run([sys.executable, "-m", "speedrun", *args], stdout=write_end, stderr=subprocess.PIPE,
                              env=env, text=True, timeout=120)
    finally:
        os.close(write_end)
    return done.returncode, done.stderr


@pytest.mark.parametrize("stage", ["stats", "compare"])
def test_closed_stdout_ends_quietly_with_status_141(runs, tmp_path, stage):
    """``speedrun stats DIR --json | head -1``: no BrokenPipeError traceback (nor "Exception ignored" at exit),
    status 141 = 128 + SIGPIPE, as a shell reports for cat or grep."""
    args = ["stats", str(runs), "--json"] if stage == "stats" else ["compare", str(runs), str(runs)]
    status, err = _speedrun_into_a_closed_pipe(*args)
    assert err == "" and status == 141


def test_a_broken_pipe_that_is_not_stdout_keeps_its_traceback(monkeypatch):
    """A BrokenPipeError from a socket or another pipe (stdout still open) is a real failure, not ``| head``."""
    def broken_socket(argv):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(cli, "_run", broken_socket)
    monkeypatch.setattr(cli, "_stdout_reader_gone", lambda: False)
    with pytest.raises(BrokenPipeError):
        cli.main(["stats", "x"])


@pytest.mark.parametrize("reader_open", [True, False])
def test_stdout_reader_gone_tells_a_closed_pipe_from_an_open_one(monkeypatch, reader_open):
    read_end, write_end = os.pipe()
    if not reader_open:
        os.close(read_end)
    with os.fdopen(write_end, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        gone = cli._stdout_reader_gone()
        monkeypatch.undo()
    if reader_open:
        os.close(read_end)
    assert gone is (not reader_open)


def test_top_level_help_is_plain_text(capsys):
    """`speedrun --help` prints the module docstring's first line without its reStructuredText markup."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "The speedrun command: one subcommand per pipeline stage." in out.splitlines()
    assert "``" not in out


def test_parse_and_stats_say_the_same_of_a_compressed_or_utf16_log(runs, tmp_path, capsys):
    """`speedrun parse x.txt.gz` says what `speedrun stats` says of it: gzip-compressed, decompress it; a UTF-16
    log (PowerShell's `>`, byte-order mark FF FE) is named as such, with how to convert it."""
    import gzip

    text = (runs / "seed0.txt").read_bytes()
    gz, utf16 = tmp_path / "old.txt.gz", tmp_path / "ps.txt"
    gz.write_bytes(gzip.compress(text))
    utf16.write_bytes(b"\xff\xfe" + text.decode().encode("utf-16-le"))
    for path, reason in ((gz, "gzip-compressed: decompress it to read it as a log"),
                         (utf16, "UTF-16 text (byte-order mark FF FE, as Windows PowerShell's '>' writes): convert "
                                 "it to UTF-8 to read it as a log (iconv -f UTF-16 -t UTF-8 LOG > NEW, or in "
                                 "PowerShell Get-Content LOG | Set-Content -Encoding utf8 NEW)")):
        assert cli.main(["parse", str(path)]) == 2
        assert _one_line(capsys) == f"speedrun parse: error: {path}: {reason}"
        assert cli.main(["stats", str(path)]) == 2
        assert _one_line(capsys) == f"speedrun stats: error: {path}: {reason}"


def test_parse_refuses_a_folder_as_output_before_writing_anything(runs, tmp_path, capsys):
    """`speedrun parse LOG --json DIR --csv p.csv` failed on the JSON after writing p.csv: now refused first."""
    log = next(runs.glob("*.txt"))
    assert cli.main(["parse", str(log), "--json", str(tmp_path), "--csv", str(tmp_path / "p.csv")]) == 2
    assert _one_line(capsys) == f"speedrun parse: error: --json {tmp_path}: is a folder; expected a file name"
    assert not (tmp_path / "p.csv").exists()
