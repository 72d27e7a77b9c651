"""A training program for the multi-node tests: `speedrun train`'s library call under torchrun (or alone), then
this rank's losses at full precision as JSON (the log rounds them to 4 decimals).

    python cluster_train_losses.py SETTINGS_JSON SHARDS_DIR BOS_DIR LOG_PATH LOSSES_PATTERN
LOSSES_PATTERN holds `{rank}`.
"""

import json
import os
import sys
from pathlib import Path

from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training


def main(settings: str, shards_dir: str, bos_dir: str, log_path: str, losses_pattern: str) -> None:
    result = run_training(TrainConfig.from_dict(json.loads(settings)), variant="v", seed=0, shards_dir=shards_dir,
                          bos_dir=bos_dir, log_path=log_path)
    rank = os.environ.get("RANK", "0")
    Path(losses_pattern.format(rank=rank)).write_text(json.dumps([list(x) for x in result.losses]))


if __name__ == "__main__":
    main(*sys.argv[1:6])
