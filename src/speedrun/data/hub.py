"""Requests to the Hugging Face Hub that survive its transient failures, and listing a dataset's files.

:func:`with_retries` wraps one ``huggingface_hub`` call: 429, 408 and 5xx answers and connection errors are
retried with exponential backoff, honoring ``Retry-After`` (:class:`RetryPolicy`); a missing repository,
revision or file, a gated repository or another client error is a :class:`~speedrun.errors.SpeedrunError`
at once, naming what was asked for. ``huggingface_hub`` is imported inside the functions that use it (it reads
``HF_ENDPOINT`` at import), so importing this module touches neither it nor the network.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from speedrun.errors import SpeedrunError

T = TypeVar("T")
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient failures (429, 408, 5xx, connection errors) are retried.

    Attempt k (1-based) that fails waits ``min(max_delay_s, base_delay_s * 2**(k-1))`` seconds, or the
    server's ``Retry-After`` when longer (capped at ``max_retry_after_s``), before attempt k+1; after
    ``attempts`` attempts the last error is raised as a :class:`SpeedrunError`.
    """

    attempts: int = 6
    base_delay_s: float = 2.0
    max_delay_s: float = 60.0
    max_retry_after_s: float = 600.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise SpeedrunError(f"retry attempts must be >= 1, got {self.attempts}")
        if min(self.base_delay_s, self.max_delay_s, self.max_retry_after_s) < 0:
            raise SpeedrunError(f"retry delays must be >= 0 s, got {self.base_delay_s}, {self.max_delay_s}, "
                                f"{self.max_retry_after_s}")

    def delay_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        backoff = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        if retry_after_s is None:
            return backoff
        return max(backoff, min(retry_after_s, self.max_retry_after_s))


@dataclass(frozen=True)
class RemoteFile:
    """A file listed in a repository: ``path``, ``size`` in bytes, ``sha256`` (LFS files) or None."""

    path: str
    size: int
    sha256: str | None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level exception classes of the HTTP clients ``huggingface_hub`` may use."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"),
                         ("requests", "ConnectionError"), ("requests", "Timeout")):
        mod = sys.modules.get(module)
        if mod is not None and isinstance(getattr(mod, name, None), type):
            found.append(getattr(mod, name))
    return tuple(found)


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _retry_after_s(error: BaseException) -> float | None:
    response = getattr(error, "response", None)
    value = getattr(response, "headers", {}).get("Retry-After") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _user_error(error: BaseException, what: str) -> SpeedrunError | None:
    """The user-facing error for a failure that no retry can fix, or None when the failure is not one."""
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(error, GatedRepoError):
        return SpeedrunError(f"{what}: the repository is gated; accept its terms on the Hub and set HF_TOKEN "
                             f"to a token of that account (HTTP {_status(error)})")
    if isinstance(error, RepositoryNotFoundError):
        return SpeedrunError(f"{what}: repository not found (or private: set HF_TOKEN) (HTTP {_status(error)})")
    if isinstance(error, RevisionNotFoundError):
        return SpeedrunError(f"{what}: revision not found in the repository")
    if isinstance(error, EntryNotFoundError) and not isinstance(error, LocalEntryNotFoundError):
        return SpeedrunError(f"{what}: no such file in the repository at this revision")
    if isinstance(error, HfHubHTTPError) and _status(error) not in RETRYABLE_STATUS:
        hint = " (set HF_TOKEN to a token with access)" if _status(error) in (401, 403) else ""
        return SpeedrunError(f"{what}: HTTP {_status(error)} from the Hub{hint}: {error}")
    if isinstance(error, OSError) and error.errno is not None:
        return SpeedrunError(f"{what}: {error}")  # a full disk, a permission error: not worth a retry
    return None


def _transient(error: BaseException) -> bool:
    """A failure worth retrying: 429, 408 or 5xx, a connection error, the Hub unreachable (huggingface_hub's
    LocalEntryNotFoundError), or a body that ended short of its size (its "Consistency check failed")."""
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError

    if isinstance(error, HfHubHTTPError):
        return _status(error) in RETRYABLE_STATUS
    return isinstance(error, (LocalEntryNotFoundError, *_transport_errors())) or (
        isinstance(error, OSError) and error.errno is None)


def with_retries(call: Callable[[], T], what: str, policy: RetryPolicy,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, retried on transient Hub failures according to ``policy``.

    ``what`` names the repository, revision and file in messages. Raises :class:`SpeedrunError` at once for
    a failure no retry can fix, and after ``policy.attempts`` attempts for a transient one; any other
    exception (a bug) propagates unchanged.
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return call()
        except SpeedrunError:
            raise
        except Exception as error:  # classified below: the user's, transient, or a bug
            user_error = _user_error(error, what)
            if user_error is not None:
                raise user_error from error
            if not _transient(error):
                raise
            if attempt == policy.attempts:
                raise SpeedrunError(f"{what}: gave up after {attempt} attempts; last error: "
                                    f"{type(error).__name__}: {error}") from error
            delay = policy.delay_s(attempt, _retry_after_s(error))
            first_line = str(error).splitlines()[0] if str(error) else ""
            print(f"{what}: attempt {attempt}/{policy.attempts} failed ({type(error).__name__}: {first_line}); "
                  f"retrying in {delay:.1f} s", file=sys.stderr)
            sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")


def list_remote_files(repo: str, revision: str, prefix: str = "", *, endpoint: str | None = None,
                      token: str | None = None, policy: RetryPolicy = RetryPolicy(),
                      sleep: Callable[[float], None] = time.sleep) -> tuple[str, list[RemoteFile]]:
    """``(commit, files)``: the files of dataset ``repo`` at ``revision`` under folder ``prefix``.

    ``files`` is sorted by path; each has its size in bytes and, for LFS files, its sha256. Used to plan
    the download jobs (how many parquet files or shards there are, and how large). Raises
    :class:`SpeedrunError` for a missing or gated repository, revision or folder.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token)
    what = f"{prefix or '/'} of dataset {repo} at revision {revision}"
    info = with_retries(lambda: api.dataset_info(repo, revision=revision), what, policy, sleep)
    if not info.sha:
        raise SpeedrunError(f"{what}: the Hub gave no commit for this revision")
    entries = with_retries(lambda: list(api.list_repo_tree(repo, path_in_repo=prefix or None, recursive=True,
                                                           revision=info.sha, repo_type="dataset")),
                           what, policy, sleep)
    files = [RemoteFile(e.path, int(e.size), e.lfs.sha256 if e.lfs else None)
             for e in entries if isinstance(e, RepoFile)]
    return info.sha, sorted(files, key=lambda f: f.path)
