"""A loopback Hugging Face Hub for tests: the routes ``huggingface_hub`` uses to download dataset files.

Served on 127.0.0.1 by a stdlib threading HTTP/1.1 server (shared/docs/offline-data.md, "Testing Hugging
Face Hub downloads"):

- ``HEAD``/``GET /datasets/{repo}/resolve/{revision}/{file}``: ``X-Repo-Commit`` (40 hex) and ``ETag``, never
  an ``X-Xet-*`` header. A small text file is served as a git blob (ETag = its git blob sha1). An LFS file
  (``.parquet``, ``.bin``) answers as the real Hub does: a 302 to a CDN location (here ``/cdn/{sha256}`` on the
  same server, named ``localhost`` so that it is another host) with ``X-Linked-Etag`` = its sha256 and ``X-Linked-Size``.
- ``GET /cdn/{sha256}``: the LFS body, with ``Range: bytes=a-`` / ``a-b`` answered by 206 (resumed downloads).
- ``GET /api/datasets/{repo}[/revision/{revision}]``: JSON with ``sha`` and ``siblings``.
- ``GET /api/datasets/{repo}/tree/{revision}[/{path}]?recursive=true&expand=false``: JSON list of
  ``{type, path, size, oid[, lfs]}``.
- Errors carry ``X-Error-Code``: ``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound`` (404) and
  ``GatedRepo`` (401 without the repo's token).

Faults are injected per file name with :meth:`HubServer.fail`: an HTTP status (404, 500 then success, 429
with ``Retry-After``), a body cut short (the connection closes before ``Content-Length`` bytes), a short body
with a consistent ``Content-Length``, or a corrupt body (one byte flipped). Every request is logged in
:attr:`HubServer.requests`.

Also the tiny data such a server serves: :func:`fineweb_parquet_bytes` (FineWeb's columns) and
:func:`shard_bytes` (the llm.c / modded-nanogpt shard format, written independently of ``speedrun``).
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal, Mapping, Sequence
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

LFS_SUFFIXES = (".parquet", ".bin")
FaultKind = Literal["status", "cut", "short", "corrupt"]


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob holding ``data`` (what the Hub gives as ETag of a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Fault:
    """One injected failure, used ``times`` times on requests for one file by one of ``methods``."""

    kind: FaultKind
    times: int = 1
    status: int = 500
    error_code: str | None = None
    retry_after_s: int | None = None
    cut_at: int | None = None  # "cut": absolute byte offset where the body stops (default: half the file)
    methods: tuple[str, ...] = ("GET",)


@dataclass(frozen=True)
class Request:
    """One request the server received."""

    method: str
    path: str
    range: str | None
    authorization: str | None
    time_s: float


@dataclass
class _Repo:
    files: dict[str, bytes]
    commit: str
    token: str | None
    branches: dict[str, str] = field(default_factory=dict)


class HubServer:
    """The loopback Hub: ``with HubServer() as hub: hub.add_dataset(...); ... hub.url ...``."""

    def __init__(self) -> None:
        self._repos: dict[str, _Repo] = {}
        self._faults: dict[str, list[Fault]] = {}
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.hub = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def cdn_url(self) -> str:
        """The same server under another host name, as a CDN is off the Hub's host (no auth sent there)."""
        return f"http://localhost:{self._httpd.server_address[1]}"

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def add_dataset(self, repo_id: str, files: Mapping[str, bytes], *, token: str | None = None) -> str:
        """Serve dataset ``repo_id`` (``owner/name``) holding ``files`` (path -> bytes) on branch ``main``.

        ``token``: the repo is gated, readable only with ``Authorization: Bearer <token>``. Returns the
        commit hash, the sha1 of the repo's content.
        """
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
        commit = digest.hexdigest()
        self._repos[repo_id] = _Repo(dict(files), commit, token, {"main": commit})
        return commit

    def fail(self, filename: str, kind: FaultKind, **options: object) -> None:
        """Queue a :class:`Fault` (``kind`` plus its fields as keywords) for requests of ``filename``."""
        with self._lock:
            self._faults.setdefault(filename, []).append(Fault(kind, **options))  # type: ignore[arg-type]

    def take_fault(self, filename: str, method: str) -> Fault | None:
        """The next pending fault for ``filename`` and ``method``, counted as used (None when none)."""
        with self._lock:
            for fault in self._faults.get(filename, []):
                if method in fault.methods and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def gets(self, filename: str) -> list[Request]:
        """The GET requests that fetched the body of ``filename`` (resolve or CDN route)."""
        suffixes = {f"/{filename}"} | {f"/cdn/{s}" for s in self._lfs_hashes(filename)}
        return [r for r in self.requests if r.method == "GET" and any(r.path.endswith(s) for s in suffixes)]

    def _lfs_hashes(self, filename: str) -> set[str]:
        return {hashlib.sha256(r.files[filename]).hexdigest() for r in self._repos.values() if filename in r.files}

    def repo(self, repo_id: str) -> _Repo | None:
        return self._repos.get(repo_id)

    def find_blob(self, sha256: str) -> tuple[str, bytes] | None:
        """``(path, data)`` of the LFS file whose sha256 is ``sha256``, in any repo."""
        for repo in self._repos.values():
            for path, data in repo.files.items():
                if hashlib.sha256(data).hexdigest() == sha256:
                    return path, data
        return None


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
        pass

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_GET(self) -> None:
        self._dispatch("GET")

    # ---- routing ------------------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        self.hub.log(Request(method, path, self.headers.get("Range"), self.headers.get("Authorization"),
                             time.monotonic()))
        segments = [s for s in path.split("/") if s]
        if segments[:1] == ["cdn"] and len(segments) == 2:
            return self._cdn(method, segments[1])
        if segments[:1] == ["datasets"] and len(segments) >= 6 and segments[3] == "resolve":
            return self._resolve(method, f"{segments[1]}/{segments[2]}", segments[4], "/".join(segments[5:]))
        if segments[:2] == ["api", "datasets"] and len(segments) >= 4:
            query = parse_qs(parts.query)
            return self._api(f"{segments[2]}/{segments[3]}", segments[4:], query)
        self._error(404, None, f"no route for {path}")

    def _authorized_repo(self, repo_id: str) -> _Repo | None:
        """The repo, or None after answering RepoNotFound or GatedRepo."""
        repo = self.hub.repo(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
            return None
        if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(401, "GatedRepo", f"Access to dataset {repo_id} is restricted. You must be authenticated.")
            return None
        return repo

    def _commit(self, repo: _Repo, revision: str) -> str | None:
        commit = repo.branches.get(revision, revision if revision == repo.commit else None)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _resolve(self, method: str, repo_id: str, revision: str, filename: str) -> None:
        repo = self._authorized_repo(repo_id)
        if repo is None or (commit := self._commit(repo, revision)) is None:
            return
        if filename not in repo.files:
            return self._error(404, "EntryNotFound", f"{filename} does not exist on {revision}", commit=commit)
        if method == "HEAD" and self._apply_status_fault(filename, method):
            return
        data = repo.files[filename]
        if is_lfs(filename):
            sha256 = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            self.send_header("Location", f"{self.hub.cdn_url}/cdn/{sha256}")
            self.send_header("X-Repo-Commit", commit)
            self.send_header("X-Linked-Etag", f'"{sha256}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", f'"{git_blob_sha1(data)}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._body(method, filename, data, etag=git_blob_sha1(data), commit=commit)

    def _cdn(self, method: str, sha256: str) -> None:
        found = self.hub.find_blob(sha256)
        if found is None:
            return self._error(404, None, f"no blob {sha256}")
        filename, data = found
        self._body(method, filename, data, etag=sha256, commit=None)

    def _api(self, repo_id: str, rest: list[str], query: dict[str, list[str]]) -> None:
        repo = self._authorized_repo(repo_id)
        if repo is None:
            return
        if not rest or rest[0] == "revision":
            commit = self._commit(repo, rest[1] if len(rest) > 1 else "main")
            if commit is not None:
                siblings = [{"rfilename": p} for p in sorted(repo.files)]
                self._json({"id": repo_id, "sha": commit, "private": False,
                            "gated": "auto" if repo.token else False, "siblings": siblings})
            return
        if rest[0] == "tree" and len(rest) >= 2:
            commit = self._commit(repo, rest[1])
            if commit is not None:
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                entries = _tree(repo.files, "/".join(rest[2:]), recursive)
                if entries is None:
                    return self._error(404, "EntryNotFound", f"{'/'.join(rest[2:])} does not exist")
                self._json(entries)
            return
        self._error(404, None, f"no api route {rest}")

    # ---- responses ----------------------------------------------------------------------------------

    def _apply_status_fault(self, filename: str, method: str) -> bool:
        fault = self.hub.take_fault(filename, method)
        if fault is None:
            return False
        if fault.kind != "status":
            raise ValueError(f"a {fault.kind!r} fault applies to GET only")
        extra = {"Retry-After": str(fault.retry_after_s)} if fault.retry_after_s is not None else {}
        self._error(fault.status, fault.error_code, f"injected {fault.status}", **extra)
        return True

    def _body(self, method: str, filename: str, data: bytes, *, etag: str, commit: str | None) -> None:
        fault = self.hub.take_fault(filename, method) if method == "GET" else None
        if fault is not None and fault.kind == "status":
            extra = {"Retry-After": str(fault.retry_after_s)} if fault.retry_after_s is not None else {}
            return self._error(fault.status, fault.error_code, f"injected {fault.status}", **extra)
        start, end = 0, len(data)
        byte_range = self.headers.get("Range")
        if byte_range and byte_range.startswith("bytes="):
            first, _, last = byte_range[len("bytes="):].partition("-")
            start, end = int(first), (int(last) + 1 if last else len(data))
        if fault is not None and fault.kind == "corrupt":
            data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
        if fault is not None and fault.kind == "short":
            end = start + (end - start) // 2
        self.send_response(206 if byte_range else 200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Accept-Ranges", "bytes")
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        if byte_range:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if method == "HEAD":
            return
        if fault is not None and fault.kind == "cut":
            cut_at = len(data) // 2 if fault.cut_at is None else fault.cut_at
            self.wfile.write(data[start:max(start, cut_at)])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data[start:end])

    def _json(self, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str, commit: str | None = None,
               **headers: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code is not None:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)


def _tree(files: Mapping[str, bytes], prefix: str, recursive: bool) -> list[dict] | None:
    """The tree listing of ``prefix`` (a folder, "" for the root): files and folders below it."""
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    below = sorted(p for p in files if p.startswith(base))
    if base and not below:
        return None
    entries: dict[str, dict] = {}
    for path in below:
        rest = path[len(base):].split("/")
        for depth in range(1, len(rest)):
            folder = base + "/".join(rest[:depth])
            if recursive or depth == 1:
                entries.setdefault(folder, {"type": "directory", "path": folder,
                                            "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0})
        if recursive or len(rest) == 1:
            data = files[path]
            entry = {"type": "file", "path": path, "size": len(data), "oid": git_blob_sha1(data)}
            if is_lfs(path):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries[path] = entry
    return list(entries.values())


# ---- tiny FineWeb-shaped data ----------------------------------------------------------------------

FINEWEB_COLUMNS = ("text", "id", "dump", "url", "date", "file_path", "language", "language_score", "token_count")


def fineweb_parquet_bytes(texts: Sequence[str], *, row_group_size: int = 4, first_id: int = 0) -> bytes:
    """A parquet file with FineWeb's columns, one row per text, ``row_group_size`` rows per row group."""
    n = len(texts)
    table = pa.table({
        "text": pa.array(list(texts), type=pa.string()),
        "id": pa.array([f"<urn:uuid:{first_id + i:08d}>" for i in range(n)], type=pa.string()),
        "dump": pa.array(["CC-MAIN-2013-20"] * n, type=pa.string()),
        "url": pa.array([f"http://example.com/{first_id + i}" for i in range(n)], type=pa.string()),
        "date": pa.array(["2013-05-18T05:48:54Z"] * n, type=pa.string()),
        "file_path": pa.array(["s3://commoncrawl/crawl-data/x.warc.gz"] * n, type=pa.string()),
        "language": pa.array(["en"] * n, type=pa.string()),
        "language_score": pa.array([0.9] * n, type=pa.float64()),
        "token_count": pa.array([len(t) // 4 for t in texts], type=pa.int64()),
    })
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


def shard_bytes(tokens: Sequence[int], *, magic: int = 20240520, version: int = 1, count: int | None = None) -> bytes:
    """A token shard: 256 little-endian int32 header (magic, version, count), then uint16 tokens.

    ``magic``, ``version`` and ``count`` can be set wrong on purpose (a bad header).
    """
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    return header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes()


def random_documents_shard(seed: int, tokens: int) -> bytes:
    """A shard (:func:`shard_bytes`) of ``tokens`` random GPT-2 ids with a BOS (50256) first and about one every
    200 tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50256, size=tokens)
    ids[np.unique(rng.integers(0, tokens, size=tokens // 200))] = 50256
    ids[0] = 50256
    return shard_bytes(ids.tolist())
