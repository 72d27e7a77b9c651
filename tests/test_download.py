"""`speedrun download` against a loopback Hub (tests/hub_server.py) with the real huggingface_hub client.

Library calls pass the server's URL as `endpoint` and record the backoff sleeps instead of sleeping; the
command-line tests run `python -m speedrun download` in a subprocess whose environment sets HF_ENDPOINT
(huggingface_hub reads it at import), HF_HUB_DISABLE_XET and a private HF_HOME.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
from hub_server import HubServer, fineweb_parquet_bytes, git_blob_sha1, shard_bytes

from speedrun.data.hub import RetryPolicy, list_remote_files
from speedrun.data.hub_download import HubFile, check_arguments, download_file, file_hashes, staging_dir
from speedrun.data.hub_paths import (
    download_path,
    fineweb_parquet_files,
    pretokenized_shard_files,
    repo_slug,
    revision_slug,
)
from speedrun.errors import SpeedrunError

REPO = "kjj0/fineweb10B-gpt2"
RAW = "HuggingFaceFW/fineweb"
VAL = "fineweb_val_000000.bin"
PARQUET = "sample/10BT/000_00000.parquet"
FAST = RetryPolicy(attempts=4, base_delay_s=0.25, max_delay_s=1.0)
SHARD = shard_bytes([50256] + [(7 * i) % 50256 for i in range(3000)])
README = b"# fineweb10B-gpt2\nGPT-2 tokens of FineWeb.\n"


@pytest.fixture
def hub():
    with HubServer() as server:
        server.add_dataset(REPO, {VAL: SHARD, "fineweb_train_000001.bin": shard_bytes([50256, 1, 2, 3]),
                                  "README.md": README})
        server.add_dataset(RAW, {PARQUET: fineweb_parquet_bytes(["A web page.", "Another one."]),
                                 "sample/10BT/001_00000.parquet": fineweb_parquet_bytes(["Third."]),
                                 "README.md": b"fineweb\n"})
        yield server


class Sleeps(list):
    """Records the backoff delays instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def _get(hub: HubServer, path: str, out: Path, **kwargs) -> object:
    kwargs.setdefault("policy", FAST)
    return download_file(HubFile(kwargs.pop("repo", REPO), kwargs.pop("revision", "main"), path, hub.url),
                         out, **kwargs)


# ---- names and policies, no server ---------------------------------------------------------------


def test_fineweb_names() -> None:
    files = fineweb_parquet_files("sample-10BT", 15)
    assert (files[0], files[-1], len(files)) == ("sample/10BT/000_00000.parquet", "sample/10BT/014_00000.parquet", 15)
    assert fineweb_parquet_files("sample-100BT", 2) == ["sample/100BT/000_00000.parquet",
                                                        "sample/100BT/001_00000.parquet"]
    assert pretokenized_shard_files(2) == ["fineweb_val_000000.bin", "fineweb_train_000001.bin",
                                           "fineweb_train_000002.bin"]
    assert pretokenized_shard_files(103)[-1] == "fineweb_train_000103.bin"
    with pytest.raises(SpeedrunError, match="default"):
        fineweb_parquet_files("default", 1)
    with pytest.raises(SpeedrunError, match="at least 1"):
        pretokenized_shard_files(0)


def test_repo_slug() -> None:
    assert repo_slug("kjj0/fineweb10B-gpt2") == "kjj0--fineweb10B-gpt2"
    for bad in ("fineweb", "a/b/c", "a--b/c", "/x"):
        with pytest.raises(SpeedrunError, match="owner/name"):
            repo_slug(bad)


def test_revision_slug() -> None:
    assert [revision_slug(r) for r in ("main", "v1.0", "a" * 40)] == ["main", "v1.0", "a" * 40]  # readable
    assert revision_slug("refs/pr/1") == "refs%2Fpr%2F1"
    assert revision_slug("..") == "%2E." and revision_slug(".hidden") == "%2Ehidden"
    revisions = ["refs/pr/1", "refs%2Fpr%2F1", "refs--pr--1", "a/b", "a%2Fb", "..", "%2E.", "v 1", "v+1", "~x"]
    slugs = [revision_slug(r) for r in revisions]
    assert len(set(slugs)) == len(revisions)  # one to one
    assert all("/" not in slug and not slug.startswith(".") for slug in slugs)
    assert [unquote(slug) for slug in slugs] == revisions  # percent-decoding inverts it
    with pytest.raises(SpeedrunError, match="revision is empty"):
        revision_slug("")


def test_two_revisions_of_one_repo_land_in_two_paths(hub: HubServer, tmp_path: Path) -> None:
    """The reported bug: a config at another revision reran the job of the same path and deleted main's file."""
    assert download_path(REPO, "main", "fineweb_train_000001.bin") == (
        "results/download/kjj0--fineweb10B-gpt2/main/fineweb_train_000001.bin")
    assert download_path(RAW, "refs/pr/1", PARQUET) == (
        "results/download/HuggingFaceFW--fineweb/refs%2Fpr%2F1/sample/10BT/000_00000.parquet")
    main, v99 = (tmp_path / download_path(REPO, revision, VAL) for revision in ("main", "v99"))
    assert main != v99
    _get(hub, VAL, main)
    with pytest.raises(SpeedrunError, match="revision not found"):
        _get(hub, VAL, v99, revision="v99")
    assert main.read_bytes() == SHARD and not v99.exists()


def test_retry_delays() -> None:
    policy = RetryPolicy(attempts=8, base_delay_s=2.0, max_delay_s=60.0, max_retry_after_s=600.0)
    assert [policy.delay_s(k) for k in range(1, 8)] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert policy.delay_s(1, retry_after_s=30) == 30.0  # the server asks for longer than the backoff
    assert policy.delay_s(6, retry_after_s=5) == 60.0  # the backoff is already longer
    assert policy.delay_s(1, retry_after_s=10_000) == 600.0  # bounded
    with pytest.raises(SpeedrunError, match="attempts must be >= 1, got 0"):
        RetryPolicy(attempts=0)
    with pytest.raises(SpeedrunError, match="delays must be >= 0"):
        RetryPolicy(base_delay_s=-1)


def test_file_hashes(tmp_path: Path) -> None:
    path = tmp_path / "hello"
    path.write_bytes(b"hello\n")
    # `echo hello | git hash-object --stdin` and `echo hello | sha256sum`
    assert file_hashes(path) == ("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",
                                 "ce013625030ba8dba906f756967f9e9ca394464a")


# ---- downloads ------------------------------------------------------------------------------------


def test_download_lfs_file(hub: HubServer, tmp_path: Path) -> None:
    out = tmp_path / "shards" / VAL
    done = _get(hub, VAL, out)
    assert out.read_bytes() == SHARD
    assert done.sha256 == hashlib.sha256(SHARD).hexdigest() and done.size == len(SHARD)
    assert done.commit == hub.repo(REPO).commit
    assert not staging_dir(out).exists()
    assert [p.name for p in out.parent.iterdir()] == [VAL]
    assert all(r.authorization is None for r in hub.requests)  # no HF_TOKEN, no header


def test_download_git_file_in_a_folder(hub: HubServer, tmp_path: Path) -> None:
    out = tmp_path / "README.md"
    _get(hub, "README.md", out)
    assert out.read_bytes() == README
    parquet = tmp_path / "raw" / PARQUET
    _get(hub, PARQUET, parquet, repo=RAW)
    assert parquet.read_bytes() == hub.repo(RAW).files[PARQUET]


def test_pinned_commit(hub: HubServer, tmp_path: Path) -> None:
    commit = hub.repo(REPO).commit
    done = _get(hub, VAL, tmp_path / VAL, revision=commit)
    assert done.commit == commit


def test_server_error_then_success(hub: HubServer, tmp_path: Path) -> None:
    hub.fail(VAL, "status", status=500)
    sleeps = Sleeps()
    _get(hub, VAL, tmp_path / VAL, sleep=sleeps)
    assert (tmp_path / VAL).read_bytes() == SHARD
    assert sleeps == [FAST.delay_s(1)]
    assert len(hub.gets(VAL)) == 2


def test_rate_limit_honors_retry_after(hub: HubServer, tmp_path: Path) -> None:
    hub.fail(VAL, "status", status=429, retry_after_s=3, methods=("HEAD",))
    sleeps = Sleeps()
    _get(hub, VAL, tmp_path / VAL, sleep=sleeps)
    assert sleeps == [3.0]  # Retry-After beats the 0.25 s backoff
    assert (tmp_path / VAL).read_bytes() == SHARD


def test_server_errors_exhaust_retries(hub: HubServer, tmp_path: Path) -> None:
    hub.fail(VAL, "status", status=503, times=10)
    sleeps = Sleeps()
    with pytest.raises(SpeedrunError, match="gave up after 4 attempts") as err:
        _get(hub, VAL, tmp_path / VAL, sleep=sleeps)
    assert REPO in str(err.value) and VAL in str(err.value) and "main" in str(err.value)
    assert sleeps == [0.25, 0.5, 1.0]
    assert not (tmp_path / VAL).exists()


def test_unreachable_hub_is_retried_then_named(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    sleeps = Sleeps()
    policy = RetryPolicy(attempts=2, base_delay_s=0.25)
    with pytest.raises(SpeedrunError, match="gave up after 2 attempts; last error: ConnectError"):
        download_file(HubFile(REPO, "main", VAL, endpoint), tmp_path / VAL, policy=policy, sleep=sleeps)
    assert sleeps == [0.25] and not (tmp_path / VAL).exists()


@pytest.mark.parametrize("kind, options", [("status", {"status": 503}), ("short", {})])
def test_failed_download_leaves_no_staging_folder(hub: HubServer, tmp_path: Path, kind, options) -> None:
    out = tmp_path / "dl" / "cut.bin"
    hub.fail(VAL, kind, times=10, **options)
    with pytest.raises(SpeedrunError, match="gave up after 4 attempts"):
        _get(hub, VAL, out, sleep=Sleeps())
    assert len(hub.gets(VAL)) >= 4  # the body was requested (and staged) on every attempt
    assert not staging_dir(out).exists() and list(out.parent.iterdir()) == []


def test_body_cut_short_is_redone(hub: HubServer, tmp_path: Path) -> None:
    hub.fail(VAL, "cut")
    _get(hub, VAL, tmp_path / VAL, sleep=Sleeps())
    assert (tmp_path / VAL).read_bytes() == SHARD
    assert len(hub.gets(VAL)) == 2


def test_short_body_never_taken_as_complete(hub: HubServer, tmp_path: Path) -> None:
    """A body shorter than the Hub's size fails every attempt; nothing lies at the output; a rerun works."""
    out = tmp_path / VAL
    hub.fail(VAL, "short", times=4)
    with pytest.raises(SpeedrunError, match="gave up after 4 attempts"):
        _get(hub, VAL, out, sleep=Sleeps())
    assert not out.exists()
    assert not list(tmp_path.rglob("*.incomplete"))
    _get(hub, VAL, out, sleep=Sleeps())
    assert out.read_bytes() == SHARD


def test_corrupt_body_fails_the_hash_check(hub: HubServer, tmp_path: Path) -> None:
    hub.fail(VAL, "corrupt")
    with pytest.raises(SpeedrunError, match="sha256") as err:
        _get(hub, VAL, tmp_path / VAL)
    assert hashlib.sha256(SHARD).hexdigest() in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_corrupt_git_file_fails_the_blob_id_check(hub: HubServer, tmp_path: Path) -> None:
    hub.fail("README.md", "corrupt")
    with pytest.raises(SpeedrunError, match=git_blob_sha1(README)):
        _get(hub, "README.md", tmp_path / "README.md")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("repo, revision, path, message", [
    (REPO, "main", "fineweb_train_000999.bin", "no such file"),
    ("kjj0/no-such-repo", "main", VAL, "repository not found"),
    (REPO, "v9", VAL, "revision not found"),
])
def test_missing_is_a_clear_error(hub: HubServer, tmp_path: Path, repo, revision, path, message) -> None:
    sleeps = Sleeps()
    with pytest.raises(SpeedrunError, match=message) as err:
        _get(hub, path, tmp_path / "x", repo=repo, revision=revision, sleep=sleeps)
    assert repo in str(err.value) and revision in str(err.value) and path in str(err.value)
    assert sleeps == []  # never retried
    assert not (tmp_path / "x").exists()


def test_gated_repo_needs_the_token(hub: HubServer, tmp_path: Path) -> None:
    hub.add_dataset("org/gated", {VAL: SHARD}, token="hf_secret")
    with pytest.raises(SpeedrunError, match="gated"):
        _get(hub, VAL, tmp_path / VAL, repo="org/gated")
    _get(hub, VAL, tmp_path / VAL, repo="org/gated", token="hf_secret")
    assert (tmp_path / VAL).read_bytes() == SHARD
    resolve = [r for r in hub.requests if "/resolve/" in r.path and r.authorization]
    assert resolve and all(r.authorization == "Bearer hf_secret" for r in resolve)


def test_expected_size_and_sha256(hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(SpeedrunError, match=f"holds {len(SHARD)} bytes, expected 200001024"):
        _get(hub, VAL, tmp_path / VAL, expected_size=200_001_024)
    assert hub.gets(VAL) == []  # refused before downloading
    with pytest.raises(SpeedrunError, match="--sha256"):
        _get(hub, VAL, tmp_path / VAL, sha256="0" * 64)
    _get(hub, VAL, tmp_path / VAL, expected_size=len(SHARD), sha256=hashlib.sha256(SHARD).hexdigest().upper())
    assert (tmp_path / VAL).read_bytes() == SHARD


def test_bad_arguments_are_refused_before_any_request(hub: HubServer, tmp_path: Path) -> None:
    (tmp_path / "dl").mkdir()
    bad = [({"repo": "kjj0"}, "--repo 'kjj0': expected a dataset repository 'owner/name'"),
           ({"sha256": "deadbeef"}, "--sha256 'deadbeef': expected the file's sha256 as 64 hex digits, got 8"),
           ({"sha256": "g" * 64}, "--sha256 'ggg"),
           ({"out": tmp_path / "dl"}, f"--out {tmp_path / 'dl'}: is an existing folder; expected the path of the "
                                      f"file to write (e.g. --out {tmp_path / 'dl' / VAL})")]
    for kwargs, message in bad:
        out = kwargs.pop("out", tmp_path / "dl" / VAL)
        with pytest.raises(SpeedrunError, match=f"^{re.escape(message)}"):
            _get(hub, VAL, out, **kwargs)
        with pytest.raises(SpeedrunError, match=f"^{re.escape(message)}"):
            check_arguments(kwargs.get("repo", REPO), file=VAL, out=out, sha256=kwargs.get("sha256"))
    assert hub.requests == []
    assert list(tmp_path.iterdir()) == [tmp_path / "dl"] and list((tmp_path / "dl").iterdir()) == []
    check_arguments(REPO, file=VAL, out=tmp_path / "dl" / VAL, sha256="AB" * 32)  # upper-case hex is fine


def test_list_remote_files(hub: HubServer) -> None:
    commit, files = list_remote_files(RAW, "main", "sample/10BT", endpoint=hub.url)
    assert commit == hub.repo(RAW).commit
    data = hub.repo(RAW).files
    assert [(f.path, f.size, f.sha256) for f in files] == [
        (p, len(data[p]), hashlib.sha256(data[p]).hexdigest())
        for p in ("sample/10BT/000_00000.parquet", "sample/10BT/001_00000.parquet")]
    _, everything = list_remote_files(REPO, "main", endpoint=hub.url)
    assert [(f.path, f.sha256 is None) for f in everything] == [
        ("README.md", True), ("fineweb_train_000001.bin", False), (VAL, False)]
    with pytest.raises(SpeedrunError, match="repository not found"):
        list_remote_files("kjj0/nothing", "main", endpoint=hub.url)


# ---- the command, in a subprocess ------------------------------------------------------------------


def _cli(hub: HubServer, tmp_path: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf-home"))
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "speedrun", "download", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_command_uses_hf_endpoint_and_token(hub: HubServer, tmp_path: Path) -> None:
    hub.add_dataset("org/gated", {VAL: SHARD}, token="hf_secret")
    out = tmp_path / "dl" / VAL
    args = ("--repo", "org/gated", "--revision", "main", "--file", VAL, "--out", str(out), "--backoff-s", "0.1")
    refused = _cli(hub, tmp_path, *args)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("speedrun download: error: ")
    assert "gated" in refused.stderr and "org/gated" in refused.stderr and not out.exists()
    done = _cli(hub, tmp_path, *args, token="hf_secret")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == SHARD
    assert hashlib.sha256(SHARD).hexdigest() in done.stdout


@pytest.mark.parametrize("option, value, message", [
    ("--sha256", "deadbeef", "--sha256 'deadbeef': expected the file's sha256 as 64 hex digits"),
    ("--out", "{dl}", "--out {dl}: is an existing folder; expected the path of the file to write (e.g. --out {val})"),
    ("--repo", "kjj0", "--repo 'kjj0': expected a dataset repository 'owner/name'"),
])
def test_command_refuses_bad_arguments_before_any_request(hub: HubServer, tmp_path: Path,
                                                          option, value, message) -> None:
    work = tmp_path / "work"
    (work / "dl").mkdir(parents=True)
    value, message = (text.format(dl=work / "dl", val=work / "dl" / VAL) for text in (value, message))
    args = {"--repo": REPO, "--file": VAL, "--out": str(work / "dl" / VAL), option: value}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf-home"))
    proc = subprocess.run([sys.executable, "-m", "speedrun", "download", *(a for kv in args.items() for a in kv)],
                          env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"speedrun download: error: {message}")
    assert hub.requests == []
    assert [p.name for p in work.iterdir()] == ["dl"] and list((work / "dl").iterdir()) == []


def test_command_lists_files(hub: HubServer, tmp_path: Path) -> None:
    proc = _cli(hub, tmp_path, "--repo", RAW, "--list", "sample/10BT")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines() if not line.startswith("#")]
    data = hub.repo(RAW).files
    assert [(p, int(n)) for p, n, _ in rows] == [(p, len(data[p])) for p in sorted(data) if p.startswith("sample/")]
