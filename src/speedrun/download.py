"""Stage ``speedrun download``: one file of a Hugging Face dataset, checked, to a local path.

The workflow runs one ``speedrun download`` job per remote file (workflow/rules/download.smk), so files
download in parallel and a finished file is never fetched again; each lies at
:func:`speedrun.data.hub_paths.download_path`. The download and its checks are
:func:`speedrun.data.hub_download.download_file`; ``--list`` lists a repository's files
(:func:`speedrun.data.hub.list_remote_files`). ``HF_TOKEN`` is sent when set; ``HF_ENDPOINT`` (read by
``huggingface_hub`` at import) selects the Hub.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from speedrun.data.hub import RetryPolicy, list_remote_files
from speedrun.data.hub_download import HubFile, check_arguments, download_file
from speedrun.errors import SpeedrunError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", required=True, help="dataset repository, owner/name (e.g. kjj0/fineweb10B-gpt2)")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (pin a commit; default: main)")
    parser.add_argument("--file", help="path of the file in the repository")
    parser.add_argument("--out", type=Path, help="where the checked file is written")
    parser.add_argument("--expected-size", type=int, help="bytes the file must hold")
    parser.add_argument("--sha256", help="hex sha256 the file must have")
    parser.add_argument("--list", metavar="FOLDER", nargs="?", const="",
                        help="instead of downloading, list the files (path, bytes) under FOLDER (default: all)")
    parser.add_argument("--attempts", type=int, default=RetryPolicy.attempts,
                        help=f"attempts per request on 429/5xx/connection errors (default {RetryPolicy.attempts})")
    parser.add_argument("--backoff-s", type=float, default=RetryPolicy.base_delay_s,
                        help=f"first retry delay in s, doubled each retry (default {RetryPolicy.base_delay_s})")


def main(args: argparse.Namespace) -> int:
    token = os.environ.get("HF_TOKEN") or None
    policy = RetryPolicy(attempts=args.attempts, base_delay_s=args.backoff_s)
    if args.list is not None:
        check_arguments(args.repo)
        commit, files = list_remote_files(args.repo, args.revision, args.list, token=token, policy=policy)
        print(f"# dataset {args.repo} revision {args.revision} = commit {commit}: {len(files)} files")
        for f in files:
            print(f"{f.path}\t{f.size}\t{f.sha256 or '-'}")
        return 0
    if not args.file or not args.out:
        raise SpeedrunError("--file and --out are required to download (or use --list)")
    done = download_file(HubFile(args.repo, args.revision, args.file), args.out, token=token,
                         expected_size=args.expected_size, sha256=args.sha256, policy=policy)
    print(f"downloaded {args.file} of dataset {args.repo} (commit {done.commit}) to {done.path}: "
          f"{done.size} bytes, sha256 {done.sha256}")
    return 0
