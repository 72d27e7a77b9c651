"""Atomic file output: write to a temporary name in the same folder, then rename.

A file that exists under its final name is always complete: a crash or a full disk leaves at most
a ``.tmp-*`` file behind, which no stage (and no Snakemake rerun) takes as a finished output.

Two kinds of path are not replaced by a new regular file:

* a symbolic link is written through: the temporary file goes beside the link's resolved target and is
  renamed onto the target, so the link stays and points at the new content;
* an existing path that is neither a regular file nor a folder (a character device such as ``/dev/null``
  or ``/dev/full``, a FIFO, a socket), and any path under ``/dev`` or ``/proc`` (``/dev/stdout``,
  ``/dev/fd/1``: an open file of the process, even when that is a regular file), is written directly, not
  atomically: renaming onto it would replace the device or pipe by a regular file, or detach the open file
  from whoever holds it.

An existing folder is refused (:class:`IsADirectoryError`). OS errors of the temporary file, the rename or a
write without a file name (a full disk) are raised naming the final path, so that ``speedrun`` can print them
as one line. Parent folders are made as needed; those made for a write that fails are removed again (when
still empty), so a failed write leaves no empty folder behind.

Text is written as UTF-8 with the error handler :data:`ESCAPE_ERRORS`: a file name that is not valid UTF-8
(Python holds its bytes as lone surrogates, ``os.fsdecode``: ``caf\\udce9.txt`` for ``caf\\xe9.txt``) is
written with backslash escapes of its bytes (``caf\\xe9.txt``), as ``ls -b`` and Python's bytes repr show it,
instead of failing with ``UnicodeEncodeError: surrogates not allowed`` (:func:`printable` does the same for
console output).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator


ESCAPE_ERRORS = "speedrun.backslashescape"


def _backslash_escape(error: UnicodeError) -> tuple[str, int]:
    """Codec error handler :data:`ESCAPE_ERRORS`: each character that cannot be encoded as a backslash escape;
    a lone surrogate U+DC80..U+DCFF (an undecodable byte kept by ``surrogateescape``, as in ``os.fsdecode``) as
    that byte, ``\\xe9``; any other as ``\\uXXXX``. Only for encoding.

    Raises:
        UnicodeError: ``error`` itself, for a decoding or translating error.
    """
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start:error.end]
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else f"\\u{ord(c):04x}"
                   for c in bad), error.end


codecs.register_error(ESCAPE_ERRORS, _backslash_escape)


def printable(text: str) -> str:
    """``text`` with the characters that UTF-8 cannot encode (lone surrogates: file names that are not UTF-8)
    as backslash escapes (:data:`ESCAPE_ERRORS`), so that it can be written as UTF-8, or printed where stdout's
    errors handler is ``strict`` (a UTF-8 locale other than C.UTF-8)."""
    return text.encode("utf-8", ESCAPE_ERRORS).decode("utf-8")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _named(e: OSError, path: Path) -> OSError:
    """``e`` again (same errno, so the same subclass) with ``path`` as its file name."""
    return OSError(e.errno, e.strerror or str(e), str(path))


def _target(path: str | os.PathLike[str]) -> tuple[Path, bool]:
    """(the path to write, whether to write it directly): a symbolic link's resolved target; direct for an
    existing path that is not a regular file and for a path under /dev or /proc (module docstring).

    Raises:
        IsADirectoryError: the path (or the link's target) is a folder.
    """
    final = Path(path)
    try:
        mode = final.stat().st_mode          # follows links, /proc's magic ones (/dev/stdout) included
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(final))
    special = Path(os.path.abspath(final)).parts[1:2] in (("dev",), ("proc",))
    if special or (mode is not None and not stat.S_ISREG(mode)):
        return final, True
    return (final.resolve() if final.is_symlink() else final), False


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` if the block succeeds.

    The caller writes the temporary path by any means (numpy, pyarrow, matplotlib...). On an
    exception the temporary file is removed and the exception propagates; ``path`` is untouched.
    Parent folders are created, and removed again (when empty) if the block fails. A symbolic link is written
    through to its target; an existing path that is not a regular file (device, FIFO) is yielded itself and
    written directly (module docstring).

    Raises:
        IsADirectoryError: ``path`` is a folder.
        OSError: the temporary file cannot be made or renamed (named as ``path``).
    """
    final, direct = _target(path)
    if direct:
        yield final
        return
    made = [p for p in (final.parent, *final.parent.parents) if not p.exists()][::-1]  # outermost first
    final.parent.mkdir(parents=True, exist_ok=True)     # an error names the folder it could not make
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{final.name}.", dir=final.parent)
    except OSError as e:                                   # names the temporary file: name the output
        _remove_empty(made)
        raise _named(e, final) from e
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.chmod(0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual permissions
    try:
        yield tmp
        try:
            os.replace(tmp, final)
        except OSError as e:
            raise _named(e, final) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        _remove_empty(made)
        raise


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (outermost first, as made), innermost first, while they are empty: the folders made
    for a write that failed. A folder that another writer has filled meanwhile stays, and so do its parents."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[Any]:
    """Open a temporary file beside ``path`` for writing; rename it to ``path`` when closed cleanly.

    ``mode`` is ``"w"`` (text, UTF-8 unless ``encoding`` is given, unencodable characters such as the lone
    surrogates of a non-UTF-8 file name as backslash escapes unless ``errors`` is given: module docstring) or
    ``"wb"``. The data is flushed and fsynced before the rename. A symbolic link is written through to its
    target, a device or FIFO directly, without fsync (module docstring).

    Raises:
        ValueError: another ``mode``.
        OSError: as :func:`atomic_path`; a write error without a file name (a full disk) names ``path``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open mode must be 'w' or 'wb', got {mode!r}")
    if mode == "w":
        kwargs.setdefault("encoding", "utf-8")
        kwargs.setdefault("errors", ESCAPE_ERRORS)
    with atomic_path(path) as tmp:
        try:
            with open(tmp, mode, **kwargs) as f:
                yield f
                f.flush()
                if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    os.fsync(f.fileno())
        except OSError as e:
            if e.filename is not None or e.errno is None:
                raise
            raise _named(e, Path(path)) from e


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically (:func:`atomic_open`)."""
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True, allow_nan=True)
        f.write("\n")


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8; a non-UTF-8 file name in it as backslash escapes), atomically (:func:`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(text)
