"""A tiny CPU stand-in for a record's train_gpt.py in the workflow tests (tests/test_script_variant.py).

It does what a record script does, at toy size: reads the shards where the records read them
(data/fineweb10B/fineweb_{val,train}_*.bin under DATA_PATH), trains a bigram table of token ids mod 64 for
NUM_ITERATIONS SGD steps from a random initialization drawn without a seed (so each run is a replicate), and
writes, on rank 0, logs/<uuid>.txt as the records do: its own code, a line of 100 '=', then step lines.
"""

import glob
import os
import sys
import time
import uuid

import numpy as np
import torch

with open(sys.argv[0]) as f:
    code = f.read()
data = os.path.join(os.environ.get("DATA_PATH", "."), "data/fineweb10B")


def tokens(path):
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.int64)) % 64


val = tokens(glob.glob(f"{data}/fineweb_val_*.bin")[0])[:4097]
train = torch.cat([tokens(p) for p in sorted(glob.glob(f"{data}/fineweb_train_*.bin"))])
steps = int(os.environ.get("NUM_ITERATIONS", "6"))
table = torch.randn(64, 64).requires_grad_()


def loss(x):
    return torch.nn.functional.cross_entropy(table[x[:-1]], x[1:])


lines, train_ms = [], 0.0
for step in range(steps + 1):
    if step in (0, steps):
        with torch.no_grad():
            lines.append(f"step:{step}/{steps} val_loss:{loss(val).item():.4f} train_time:{train_ms:.0f}ms "
                         f"step_avg:{train_ms / max(step, 1):.2f}ms")
    if step == steps:
        break
    start = time.perf_counter()
    batch = train[step * 1024:(step + 1) * 1024 + 1]
    loss(batch).backward()
    with torch.no_grad():
        table -= 20.0 * table.grad
        table.grad = None
    train_ms += 1000 * (time.perf_counter() - start)
    lines.append(f"step:{step + 1}/{steps} train_time:{train_ms:.0f}ms step_avg:{train_ms / (step + 1):.2f}ms")

if int(os.environ.get("RANK", "0")) == 0:
    os.makedirs("logs", exist_ok=True)
    with open(f"logs/{uuid.uuid4()}.txt", "w") as log:
        print(code, file=log)
        print("=" * 100, file=log)
        print(f"Running Python {sys.version.split()[0]}", file=log)
        print("=" * 100, file=log)
        print("\n".join(lines), file=log)
