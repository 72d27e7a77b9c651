"""Downloading one file of a Hugging Face dataset, checked, to a local path (:func:`download_file`).

A download goes through ``huggingface_hub`` (``hf_hub_download``, ``repo_type="dataset"``):

1. ``HEAD`` of the file at the configured revision gives the commit, the size and the ETag (for an LFS file,
   ``X-Linked-Etag`` is its sha256; for a small git file, its git blob sha1).
2. The file is downloaded, pinned to that commit, into a staging folder beside the output
   (``.{name}.download/``, :func:`staging_dir`). ``huggingface_hub`` resumes a body cut short within the call
   (HTTP ``Range``); a download that still fails is redone on the next attempt, never taken as complete.
3. Its size and hash are checked against the Hub's (and the expected size and sha256 when given);
   only then is it renamed to the output path. The staging folder is removed whether the download succeeds or
   fails (only a killed process leaves it; the next attempt then drops its partial files).

Arguments that no download can satisfy (a repository not ``owner/name``, a sha256 not 64 hex digits, an output
that is an existing folder) are refused by :func:`check_arguments` before any request.

429, 408 and 5xx answers and connection errors are retried with exponential backoff, honoring
``Retry-After`` (:class:`~speedrun.data.hub.RetryPolicy`); a missing repository, revision or file, a gated
repository, or a failed check is a :class:`~speedrun.errors.SpeedrunError` naming the repository, revision and
file. ``huggingface_hub`` is imported inside the functions that use it (it reads ``HF_ENDPOINT`` at import).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from speedrun.data.hub import RetryPolicy, with_retries
from speedrun.data.hub_paths import repo_slug
from speedrun.errors import SpeedrunError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_HASH_CHUNK = 1 << 22


@dataclass(frozen=True)
class HubFile:
    """One file of a dataset repository on the Hub: ``repo`` (``owner/name``), ``revision`` (branch, tag or
    commit) and ``path`` in the repo. ``endpoint`` None means ``HF_ENDPOINT`` (default huggingface.co)."""

    repo: str
    revision: str
    path: str
    endpoint: str | None = None

    def __str__(self) -> str:
        return f"{self.path} of dataset {self.repo} at revision {self.revision}"


@dataclass(frozen=True)
class Downloaded:
    """A finished download: where it lies, the commit it came from, its size (bytes) and sha256."""

    path: Path
    commit: str
    size: int
    sha256: str


def file_hashes(path: Path) -> tuple[str, str]:
    """``(sha256, git blob sha1)`` of the file at ``path``, in one pass."""
    sha256, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


def _verify(staged: Path, remote: HubFile, hub_size: int | None, etag: str,
            expected_size: int | None, expected_sha256: str | None) -> str:
    """Check the staged download against the Hub's size and hash and the caller's; return its sha256."""
    size = staged.stat().st_size
    for source, wanted in (("the Hub's", hub_size), ("the expected", expected_size)):
        if wanted is not None and size != wanted:
            raise SpeedrunError(f"{remote}: downloaded {size} bytes but {source} size is {wanted} bytes")
    sha256, git_sha1 = file_hashes(staged)
    checks = [("--sha256", expected_sha256.lower() if expected_sha256 else None, sha256),
              ("the Hub's sha256 (LFS ETag)", etag if _SHA256.match(etag) else None, sha256),
              ("the Hub's git blob id (ETag)", etag if _SHA1.match(etag) else None, git_sha1)]
    for source, wanted, actual in checks:
        if wanted is not None and wanted != actual:
            raise SpeedrunError(f"{remote}: downloaded content hashes to {actual} but {source} is {wanted}")
    return sha256


def progress_bar_class(label: str) -> type:
    """A tqdm class for ``huggingface_hub``'s download bar, labelled ``label``, that also reports into logs.

    ``huggingface_hub`` hides its own bar when stderr is not a terminal (a Snakemake log) and labels it with
    the CDN URL; this one always shows, refreshed every second on a terminal and every 30 s in a file.
    """
    from tqdm import tqdm

    class DownloadProgress(tqdm):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("mininterval", 1.0 if sys.stderr.isatty() else 30.0)
            kwargs["desc"] = label
            super().__init__(*args, **kwargs)

    return DownloadProgress


def staging_dir(out: Path) -> Path:
    """The folder where the download of ``out`` is staged: ``.{name}.download`` beside it."""
    return out.parent / f".{out.name}.download"


def check_arguments(repo: str, *, file: str | None = None, out: str | os.PathLike[str] | None = None,
                    sha256: str | None = None) -> None:
    """Refuse, before any request, arguments that no download can satisfy; each error names its option.

    Raises:
        SpeedrunError: ``repo`` is not ``owner/name`` (``--repo``), ``sha256`` is not 64 hex digits
            (``--sha256``), or ``out`` is an existing folder (``--out``: the path of the file is expected).
    """
    try:
        repo_slug(repo)
    except SpeedrunError:
        raise SpeedrunError(f"--repo {repo!r}: expected a dataset repository 'owner/name' "
                            f"(e.g. kjj0/fineweb10B-gpt2)") from None
    if sha256 is not None and not _SHA256.fullmatch(sha256.lower()):
        raise SpeedrunError(f"--sha256 {sha256!r}: expected the file's sha256 as 64 hex digits, "
                            f"got {len(sha256)} characters")
    if out is not None and Path(out).is_dir():
        example = Path(out) / Path(file).name if file else Path(out) / "<file name>"
        raise SpeedrunError(f"--out {out}: is an existing folder; expected the path of the file to write "
                            f"(e.g. --out {example})")


def download_file(remote: HubFile, out: str | os.PathLike[str], *, token: str | None = None,
                  expected_size: int | None = None, sha256: str | None = None,
                  policy: RetryPolicy = RetryPolicy(), sleep: Callable[[float], None] = time.sleep) -> Downloaded:
    """Download ``remote`` to ``out`` through ``huggingface_hub``, checked; ``out`` appears only when complete.

    Args:
        remote: the file, repository, revision (and Hub endpoint).
        out: the final path; parent folders are created.
        token: a Hub token (``HF_TOKEN``), or None for anonymous access.
        expected_size: bytes the file must hold, or None.
        sha256: hex sha256 the file must have, or None (an LFS file is also checked against the Hub's).
        policy, sleep: retries of transient failures (:func:`with_retries`).

    Raises:
        SpeedrunError: an argument :func:`check_arguments` refuses (before any request), the repository,
            revision or file does not exist or is gated, retries ran out, or the size or a hash does not
            match. ``out`` is then left absent (or as it was), and no staging folder is left.
    """
    check_arguments(remote.repo, file=remote.path, out=out, sha256=sha256)
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    out = Path(out)
    url = hf_hub_url(remote.repo, remote.path, repo_type="dataset", revision=remote.revision,
                     endpoint=remote.endpoint)
    what = str(remote)
    meta = with_retries(lambda: get_hf_file_metadata(url, token=token), what, policy, sleep)
    if not meta.commit_hash or not meta.etag:
        raise SpeedrunError(f"{what}: {url} answered without X-Repo-Commit/ETag: not a Hugging Face Hub endpoint "
                            f"(check HF_ENDPOINT)")
    if expected_size is not None and meta.size is not None and meta.size != expected_size:
        raise SpeedrunError(f"{what}: the Hub's file holds {meta.size} bytes, expected {expected_size}")
    staging = staging_dir(out)
    for stale in staging.rglob("*.incomplete") if staging.is_dir() else ():
        stale.unlink()  # left by a killed attempt; huggingface_hub >= 1.0 never resumes another process's file
    try:
        staged = Path(with_retries(
            lambda: hf_hub_download(remote.repo, remote.path, repo_type="dataset", revision=meta.commit_hash,
                                    local_dir=staging, token=token, endpoint=remote.endpoint,
                                    tqdm_class=progress_bar_class(remote.path)),
            what, policy, sleep))
        digest = _verify(staged, remote, meta.size, meta.etag, expected_size, sha256)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, out)
    finally:  # on success and on every failure (retries spent, a check, Ctrl-C): nothing staged is kept
        shutil.rmtree(staging, ignore_errors=True)
    return Downloaded(out, meta.commit_hash, out.stat().st_size, digest)
