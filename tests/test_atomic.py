"""Atomic output (speedrun.support.atomic): symbolic links written through, devices and FIFOs written directly, a
folder refused, OS errors named by the output's path."""

import errno
import json
import os
import stat
import tempfile
import threading

import pytest

from speedrun.support.atomic import atomic_open, printable, write_json, write_text


def test_regular_file_is_replaced_atomically(tmp_path):
    out = tmp_path / "a" / "b.json"
    write_json(out, {"x": 1})
    write_json(out, {"x": 2})
    assert json.loads(out.read_text()) == {"x": 2}
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.json"]


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_symlink_is_written_through_to_its_target(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "real" / "summary.json"
    target.write_text("old\n")
    link = tmp_path / "links" / "link.json"
    link.symlink_to(os.path.relpath(target, link.parent))
    chain = tmp_path / "links" / "chain.json"     # a link to the link
    chain.symlink_to("link.json")
    write_json(chain, [1, 2])
    assert link.is_symlink() and chain.is_symlink()
    assert json.loads(target.read_text()) == [1, 2]
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["summary.json"]     # no .tmp-* left
    assert sorted(p.name for p in (tmp_path / "links").iterdir()) == ["chain.json", "link.json"]


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "made" / "target.txt")
    write_text(link, "new\n")
    assert link.is_symlink() and (tmp_path / "made" / "target.txt").read_text() == "new\n"


def test_fifo_is_written_directly(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_text(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert received == [b"through the pipe\n"]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
def test_dev_fd_of_a_pipe_is_written_directly(tmp_path):
    read_end, write_end = os.pipe()                  # /dev/fd/N -> /proc/self/fd/N -> pipe:[...], like /dev/stdout
    with os.fdopen(read_end, "rb") as reader:
        try:
            write_json(f"/dev/fd/{write_end}", {"x": 1})
        finally:
            os.close(write_end)
        assert json.loads(reader.read()) == {"x": 1}


def _char_device(tmp_path, name, minor):
    """A copy of /dev/null (1, 3) or /dev/full (1, 7) in tmp_path; skipped without the right to make one."""
    path = tmp_path / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        with open(path, "wb"):
            pass
    except OSError as e:
        pytest.skip(f"cannot make or open a character device in {tmp_path}: {e}")
    return path


def test_character_device_is_written_directly_and_stays_one(tmp_path):
    null = _char_device(tmp_path, "null", 3)
    write_json(null, {"x": 1})
    assert stat.S_ISCHR(null.lstat().st_mode) and null.stat().st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


def test_full_device_error_names_the_path(tmp_path):
    full = _char_device(tmp_path, "full", 7)
    with pytest.raises(OSError) as info:
        write_text(full, "x" * 100_000)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(full)
    assert stat.S_ISCHR(full.lstat().st_mode)


def test_folder_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "adir"
    folder.mkdir()
    (folder / "inside").write_text("keep")
    with pytest.raises(IsADirectoryError) as info:
        write_json(folder, {})
    assert info.value.filename == str(folder)
    assert [p.name for p in folder.iterdir()] == ["inside"] and [p.name for p in tmp_path.iterdir()] == ["adir"]


def test_temporary_file_error_names_the_output_not_the_temporary(tmp_path, monkeypatch):
    def read_only(prefix, dir):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(dir, prefix + "abc"))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    out = tmp_path / "summary.json"
    with pytest.raises(OSError) as info:
        write_json(out, {})
    assert info.value.errno == errno.EROFS and info.value.filename == str(out)


def test_write_error_without_a_name_gets_the_path_and_leaves_no_file(tmp_path):
    out = tmp_path / "x.txt"
    with pytest.raises(OSError) as info:
        with atomic_open(out) as f:
            f.write("part")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert list(tmp_path.iterdir()) == []


def test_other_errors_pass_unchanged(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with atomic_open(tmp_path / "x.txt") as f:
            f.write(str(1 / 0))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="mode must be"):
        with atomic_open(tmp_path / "x.txt", "a"):
            pass


def test_a_name_that_is_not_utf8_is_written_with_backslash_escapes(tmp_path):
    """A file name read from a non-UTF-8 folder entry holds lone surrogates (os.fsdecode(b"caf\\xe9") ==
    "caf\\udce9"): text carrying it is written with the byte escaped, "caf\\xe9", not refused by the UTF-8 codec."""
    name = os.fsdecode(b"caf\xe9.txt")
    out = tmp_path / "a" / "statistics.md"
    write_text(out, f"| {name} | 3.2785 |\n| \ud800 |\n")
    assert out.read_bytes() == b"| caf\\xe9.txt | 3.2785 |\n| \\ud800 |\n"
    write_json(tmp_path / "s.json", {"file": name})              # JSON escapes it itself, and reads it back
    assert json.loads((tmp_path / "s.json").read_text()) == {"file": name}
    assert printable(f"{name} ok é") == "caf\\xe9.txt ok é"


def test_a_failed_write_leaves_no_folder_it_made(tmp_path):
    """The folders made for a write that fails are removed again; a folder that existed before stays, and so
    does a folder made meanwhile by another writer that put a file in it."""
    (tmp_path / "kept").mkdir()
    with pytest.raises(ZeroDivisionError):
        with atomic_open(tmp_path / "kept" / "new" / "deeper" / "x.md") as f:
            f.write(str(1 / 0))
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []
    with pytest.raises(ZeroDivisionError):
        with atomic_open(tmp_path / "kept" / "new" / "x.md") as f:
            (tmp_path / "kept" / "new" / "other.md").write_text("another writer's\n")
            f.write(str(1 / 0))
    assert sorted(p.name for p in (tmp_path / "kept" / "new").iterdir()) == ["other.md"]
