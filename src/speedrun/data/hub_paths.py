"""Where the files of the two FineWeb forms are on the Hub, and where the workflow keeps them.

FineWeb comes in two forms (speedrun-spec.md section 1.2, shared/docs/offline-data.md): the raw parquet files
of ``HuggingFaceFW/fineweb`` (config ``sample-10BT``: ``sample/10BT/000_00000.parquet`` ...
``014_00000.parquet``, :func:`fineweb_parquet_files`) and the pre-tokenized GPT-2 shards of
``kjj0/fineweb10B-gpt2`` (``fineweb_val_000000.bin``, ``fineweb_train_000001.bin`` ...,
:func:`pretokenized_shard_files`) that modded-nanogpt's ``data/cached_fineweb10B.py`` fetches. Each downloaded
file lies at :func:`download_path`, ``results/download/<owner>--<name>/<revision>/<path in repo>``, so that the
files of two revisions of one repository never share a path.

Names only: nothing here touches the network or imports ``huggingface_hub``, so the workflow plans with it.
"""

from __future__ import annotations

import re
import urllib.parse

from speedrun.errors import SpeedrunError

_FINEWEB_CONFIG = re.compile(r"^sample-(\d+BT)$")
DOWNLOAD_ROOT = "results/download"


def repo_slug(repo: str) -> str:
    """``owner--name`` for ``owner/name``: the folder of a repository's files under results/download/.

    Raises :class:`SpeedrunError` unless ``repo`` is ``owner/name``.
    """
    owner, slash, name = repo.partition("/")
    if not (owner and slash and name) or "/" in name or "--" in repo:
        raise SpeedrunError(f"dataset repository {repo!r}: expected 'owner/name' (e.g. kjj0/fineweb10B-gpt2)")
    return f"{owner}--{name}"


def revision_slug(revision: str) -> str:
    """The folder of a revision's files under ``results/download/<owner>--<name>/``: ``revision`` percent-encoded.

    Letters, digits and ``_.-~`` stay as they are, so a branch, tag or commit reads unchanged (``main``,
    ``v1.0``, 40 hex digits); ``/`` and every other byte become ``%XX`` (``refs/pr/1`` -> ``refs%2Fpr%2F1``), and
    a leading ``.`` becomes ``%2E`` (no hidden folder, no ``..``). The mapping is one to one
    (``urllib.parse.unquote`` inverts it), so two revisions never share a folder. Raises
    :class:`SpeedrunError` for an empty revision.
    """
    if not revision:
        raise SpeedrunError("revision is empty: expected a branch, tag or commit (e.g. main)")
    slug = urllib.parse.quote(revision, safe="")
    return "%2E" + slug[1:] if slug.startswith(".") else slug


def download_path(repo: str, revision: str, path: str) -> str:
    """Where the workflow keeps file ``path`` of dataset ``repo`` at ``revision``, relative to the workdir:
    ``results/download/{repo_slug(repo)}/{revision_slug(revision)}/{path}``.

    Raises :class:`SpeedrunError` for a repository not ``owner/name`` or an empty revision.
    """
    return f"{DOWNLOAD_ROOT}/{repo_slug(repo)}/{revision_slug(revision)}/{path}"


def fineweb_parquet_files(config_name: str, count: int) -> list[str]:
    """The first ``count`` parquet files of a FineWeb sample config, in dataset order.

    ``sample-10BT`` -> ``sample/10BT/000_00000.parquet`` ... (15 files in that config). Raises
    :class:`SpeedrunError` for another config name or ``count < 1``.
    """
    match = _FINEWEB_CONFIG.match(config_name)
    if match is None:
        raise SpeedrunError(f"FineWeb config {config_name!r}: expected a sample config such as 'sample-10BT'")
    if count < 1:
        raise SpeedrunError(f"number of FineWeb parquet files is {count}; expected at least 1")
    return [f"sample/{match.group(1)}/{i:03d}_00000.parquet" for i in range(count)]


def pretokenized_shard_files(train_shards: int, prefix: str = "fineweb") -> list[str]:
    """``fineweb_val_000000.bin`` then ``fineweb_train_000001.bin`` ... ``_{train_shards:06d}.bin``.

    The names of ``kjj0/fineweb10B-gpt2`` (104 files of 100M tokens: val + 103 train). Raises
    :class:`SpeedrunError` for ``train_shards < 1``.
    """
    if train_shards < 1:
        raise SpeedrunError(f"number of train shards is {train_shards}; expected at least 1")
    return [f"{prefix}_val_000000.bin"] + [f"{prefix}_train_{i:06d}.bin" for i in range(1, train_shards + 1)]
