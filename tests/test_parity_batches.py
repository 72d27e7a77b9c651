"""The parity benchmark trains both sides on the same batches: our BOS-aligned loader, fed by benchmarks/parity.sh's
data (speedrun tokenize --pretokenized of the files laid out for the records), gives every micro-batch of the
parity schedule exactly as record #88's own ``distributed_data_generator`` does from those files (inputs,
targets, document boundaries), over all 120 steps: both batch-size stage changes, the extension and seven shard
boundaries. So a difference of the
parity runs' losses is the model's and the optimizer's, not the data's.

The record's loader is read from ../shared/reference-code/record88/train_gpt.py at test time (its functions
``_load_data_shard``, ``Shard``, ``distributed_data_generator`` and the constants they use, executed on the CPU:
``device="cuda"`` and ``pin_memory=True`` are rewritten in its syntax tree, its loading threads finish before it
reads, as on a GPU, see :class:`_FinishedThread`); skipped where ../shared is absent.
"""

from __future__ import annotations

import glob
import math
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import yaml

from speedrun.data.loader import BosAlignedBatches, validation_batches
from speedrun.training.config import TrainConfig
from speedrun.training.data import load_training_data

from record_code import OnTheCpu, record_definitions

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DD = SHARED / "corpora" / "debian-docs"
TOOLS = SHARED / "reference-code" / "tools"
RECORD88 = SHARED / "reference-code" / "record88" / "train_gpt.py"
LOADER_NAMES = {"_load_data_shard", "Shard", "distributed_data_generator", "next_multiple_of_n", "BOS_ID",
                "TRAIN_MAX_NUM_DOCS"}
STEPS = 120                 # 131,072 tokens (documents cut at 896) to step 34, 262,144 and 2,048 to 69, then 393,216
COPIES = 12                 # parity.sh's: the loaders cut documents at max_seq_len, so 4 copies feed only 79 steps

pytestmark = pytest.mark.skipif(not (DD / "debiandocs_train_000001.bin").exists() or not RECORD88.exists()
                                or not (TOOLS / "lay_out_data.py").exists(),
                                reason="needs ../shared/corpora/debian-docs and ../shared/reference-code")


class _FinishedThread:
    """A thread whose target has run by the time ``start`` returns. The record's ``Shard`` plans from a BOS index
    of the shard's first 6M tokens until a thread has scanned the whole shard; on a GPU that scan ends long
    before the first step, but here the loader can pass 6M tokens first (at step 9 of this schedule, under
    load: the record's loader then leaves the shard early), so its threads run synchronously."""

    def __init__(self, target, args=(), kwargs=None):
        self._run = lambda: target(*args, **(kwargs or {}))

    def start(self) -> None:
        self._run()

    def join(self, timeout=None) -> None:
        pass


def _records_loader() -> dict:
    """Record #88's loader functions and constants, from its script, in a namespace of their imports."""
    namespace = {"torch": torch, "Tensor": torch.Tensor, "Path": Path, "glob": glob, "math": math,
                 "threading": SimpleNamespace(Thread=_FinishedThread, Event=threading.Event), "dist": dist,
                 "args": SimpleNamespace(bigram_vocab_size=50304 * 15), "get_bigram_hash": lambda x: x}
    return record_definitions(RECORD88, LOADER_NAMES, namespace, transformer=OnTheCpu())


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory) -> tuple[Path, Path]:
    """COPIES copies of debian-docs' train shard as the records read them, and our shards and BOS index of those
    very files (parity.sh's prepare_ours, by its commands)."""
    root = tmp_path_factory.mktemp("parity")
    run = lambda *cmd: subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)  # noqa: E731
    run(sys.executable, str(TOOLS / "lay_out_data.py"), str(DD / "debiandocs_val_000000.bin"),
        str(DD / "debiandocs_train_000001.bin"), str(root / "data"), "--copies", str(COPIES))
    files = root / "data" / "data" / "fineweb10B"
    run(sys.executable, "-m", "speedrun", "tokenize", "--pretokenized", str(files / "fineweb_val_000000.bin"),
        *sorted(str(f) for f in files.glob("fineweb_train_*.bin")), "--allow-repeats",
        "--out-dir", str(root / "ours" / "shards"), "--dataset", "debiandocs")
    run(sys.executable, "-m", "speedrun", "bos-index", "--shards-dir", str(root / "ours" / "shards"),
        "--out-dir", str(root / "ours" / "bos"))
    return files, root / "ours"


def test_our_parity_batches_are_record88s_own(laid_out):
    files, ours = laid_out
    settings = yaml.safe_load((ROOT / "benchmarks" / "configs" / "parity-record88.yaml").read_text())["train"]
    config = TrainConfig.from_dict({**settings, "device": "cpu", "compile": False, "model": {}})  # the schedule
    accumulation = config.micro_batches
    assert accumulation == 8 and config.batch_at(0) == (131072, 896) and config.batch_at(35) == (262144, 2048)
    assert config.batch_at(70) == config.batch_at(119) == (393216, 2048) and config.steps == STEPS

    record = _records_loader()
    tokens, seq_len = config.batch_at(0)
    theirs = record["distributed_data_generator"](str(files / "fineweb_train_*.bin"), tokens, seq_len,
                                                  grad_accum_steps=accumulation)
    data = load_training_data(ours / "shards", ours / "bos")
    assert len(data.train_shards) == COPIES
    loader = BosAlignedBatches(data.train_shards, data.train_bos, tokens // accumulation, seq_len)
    shard_of_step = []
    for step in range(STEPS):
        send = None
        if config.batch_at(step) != (tokens, seq_len):                # the record's advance_schedule
            tokens, seq_len = config.batch_at(step)
            send = (tokens, seq_len, accumulation)
            loader.set_batch(tokens // accumulation, seq_len)
        mine = loader.next_step(accumulation, 0, 1)
        for m, mb in enumerate(mine):
            inputs, targets, cum_lengths, _, _ = theirs.send(send)
            where = f"step {step}, micro-batch {m}"
            assert np.array_equal(mb.inputs, inputs.numpy()), where
            assert np.array_equal(mb.targets, targets.numpy()), where
            padded = cum_lengths.numpy()                               # [0, ends..., T, T, ...] (max_num_docs)
            n = len(mb.cu_seqlens)
            assert np.array_equal(mb.cu_seqlens, padded[:n]) and (padded[n:] == tokens // accumulation).all(), where
        shard_of_step.append(loader._planner.shard)                  # the copy this step read
    assert loader.steps_drawn == STEPS
    assert shard_of_step[0] == 0 and shard_of_step[-1] == 7     # seven shard boundaries crossed


def test_our_parity_validation_scores_record88s_own_chunks(laid_out):
    """The parity schedule's validation (1,048,576 tokens in 8 chunks of 131,072 on one GPU: the record's
    val_steps = 8 x val_tokens / val_batch_size) reads the same tokens with the same document starts; the
    record lists a chunk's leading BOS as a document start of its own (an empty first document)."""
    files, ours = laid_out
    settings = yaml.safe_load((ROOT / "benchmarks" / "configs" / "parity-record88.yaml").read_text())["train"]
    val_tokens, val_batch = settings["val_tokens"], settings["val_batch_tokens"]
    assert (val_tokens, val_batch) == (1048576, 131072)
    record = _records_loader()
    theirs = record["distributed_data_generator"](str(files / "fineweb_val_*.bin"), val_tokens, -1,
                                                  grad_accum_steps=8, align_to_bos=False)
    data = load_training_data(ours / "shards", ours / "bos")
    mine = validation_batches(data.val_tokens, data.val_bos, val_tokens, val_batch, 0, 1)
    assert len(mine) == 8
    for c, mb in enumerate(mine):
        inputs, targets, cum_lengths, _, _ = next(theirs)
        assert np.array_equal(mb.inputs, inputs.numpy()) and np.array_equal(mb.targets, targets.numpy()), c
        starts = sorted(set(cum_lengths.numpy().tolist()))            # the record's 0, 0 and its T padding once
        assert mb.cu_seqlens.tolist() == starts, c
