"""A tiny CPU stand-in for a record's train_gpt.py (tests/test_run_script.py): no torch, a log in the records'
format. It reads its shards where the records read them (data/fineweb10B/fineweb_{val,train}_*.bin under
DATA_PATH, else the working directory), its companion file beside it, and writes, on rank 0 only,
logs/<uuid>.txt: its own code and the companion's section, a line of 100 '=', system lines, another, then
val and train lines whose val_loss is computed from the validation shard's tokens (so the test can check it).
"""

import glob
import os
import sys
import uuid

with open(sys.argv[0]) as f:
    code = f.read()
with open(os.path.join(os.path.dirname(sys.argv[0]), "helper.py")) as f:
    code += f"\n\n{'-' * 40}\n# helper.py\n{'-' * 40}\n\n" + f.read()

sys.path.insert(0, os.path.dirname(sys.argv[0]))
from helper import mean_token  # noqa: E402

data = os.path.join(os.environ.get("DATA_PATH", "."), "data/fineweb10B")
val = sorted(glob.glob(os.path.join(data, "fineweb_val_*.bin")))
train = sorted(glob.glob(os.path.join(data, "fineweb_train_*.bin")))
assert len(val) == 1 and train, (val, train)
assert os.environ["TORCHINDUCTOR_CACHE_DIR"] and os.environ["TRITON_CACHE_DIR"]
steps = int(os.environ.get("NUM_ITERATIONS", "4"))
world = int(os.environ["WORLD_SIZE"])
if int(os.environ["RANK"]) == 0:
    base = mean_token(val[0]) / 10000.0          # val_loss of the last step, known to the test
    os.makedirs("logs", exist_ok=True)
    with open(f"logs/{uuid.uuid4()}.txt", "w") as log:
        print(code, file=log)
        print("=" * 100, file=log)
        print(f"Running Python {sys.version}", file=log)
        print(f"world_size {world} train_shards {len(train)}", file=log)
        print("=" * 100, file=log)
        for step in range(steps + 1):
            loss = base + (steps - step) * 0.5
            if step:
                print(f"step:{step}/{steps} train_time:{100 * step}ms step_avg:100.00ms", file=log)
            if step in (0, steps):
                avg = 100 * step / max(step, 1)
                print(f"step:{step}/{steps} val_loss:{loss:.4f} train_time:{100 * step}ms step_avg:{avg:.2f}ms",
                      file=log)
        print("peak memory allocated: 1 MiB reserved: 2 MiB", file=log)
