"""A staged schedule (train.staged_schedule, speedrun.optim.stages) through the real training loop on a CPU:
per step the batch, windows, lr factor, momentum, MTP and prefix weights and the untie follow the schedule;
the final validation takes the extended window without a YaRN rescale."""

from __future__ import annotations

import math

import pytest
import torch

from speedrun.errors import SpeedrunError
from speedrun.optim.groups import Optimizers
from speedrun.training import loop
from speedrun.training.config import TrainConfig
from speedrun.training.loop import run_training

from synthetic_data import counting_documents, write_dataset

# Two layers (short, long window) of width 32; the full GPT-2 vocabulary, which the prefix-token table needs.
MODEL = {"n_layer": 2, "model_dim": 32, "n_head": 2, "head_dim": 16, "window_pattern": "SL",
         "window_block_size": 16, "window_short_blocks": 1, "window_long_blocks": 2, "yarn": True,
         "tie_embed_head": True, "prefix_token_loss": True}


def stage(fraction, tokens, seq, windows, lr_mul, mtp, prefix=(0.0, 0.0)):
    return {"fraction": fraction, "tokens_per_step": tokens, "max_seq_len": seq, "window_blocks": windows,
            "lr_mul": lr_mul, "mtp_weights_start": mtp[0], "mtp_weights_end": mtp[1],
            "prefix_weight_start": prefix[0], "prefix_weight_end": prefix[1]}


# 6 scheduled steps in thirds (stages start at 0, 2, 4), then 2 extension steps: 8 steps, final validation at 8.
SCHEDULE = {"scheduled_steps": 6, "extension_steps": 2, "cooldown_frac": 0.5, "lr_floor": 0.1, "untie_stage": 2,
            "final_window_long_blocks": 4, "momentum_warmup_steps": 4, "momentum_cooldown_steps": 2,
            "stages": [stage(1 / 3, 256, 64, [1, 2], 1.0, ([1.0, 0.5, 0.25], [1.0, 0.5, 0.0]), (0.5, 0.5)),
                       stage(1 / 3, 512, 128, [1, 3], 2.0, ([1.0, 0.5], [1.0, 0.0]), (0.5, 0.0)),
                       stage(1 / 3, 512, 128, [2, 3], 3.0, ([1.0], [1.0])),
                       stage(None, 512, 128, [2, 3], 1.0, ([1.0], [1.0]))]}
SETTINGS = {"preset": "tiny", "model": MODEL, "staged_schedule": SCHEDULE, "micro_batches": 2, "val_tokens": 512,
            "val_batch_tokens": 256, "val_every": 4, "embed_lr": 0.3, "head_lr": 0.02, "dtype": "float32"}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("synth"), counting_documents(600), shard_tokens=16384)


def _record(monkeypatch):
    """Spy on the loop: per training step the tokens, max_seq_len, loss weights, windows, tie state and YaRN
    scale; per lr update the factor and momentum; per validation the windows and the attention scale."""
    seen = {"train": [], "lr": [], "val": []}
    real_step, real_values, real_eval = loop.train_step, Optimizers.apply_values, loop._Run.evaluate

    def train_step(forward, model, micro_batches, *args, loss_weights=None, **kwargs):
        weights = {k: v.tolist() for k, v in (loss_weights or {}).items()}
        seen["train"].append((sum(mb[0].numel() for mb in micro_batches), args[3], weights, model.window_blocks,
                              model.tied, model.attention_scale))
        return real_step(forward, model, micro_batches, *args, loss_weights=loss_weights, **kwargs)

    def apply_values(self, step, factor, momentum, schedule):
        seen["lr"].append((step, factor, momentum))
        return real_values(self, step, factor, momentum, schedule)

    def evaluate(self, batches, world_size):
        seen["val"].append((self.model.window_blocks, self.model.attention_scale,
                            self.model.rotary_frequencies.clone()))
        return real_eval(self, batches, world_size)

    monkeypatch.setattr(loop, "train_step", train_step)
    monkeypatch.setattr(Optimizers, "apply_values", apply_values)
    monkeypatch.setattr(loop._Run, "evaluate", evaluate)
    return seen


def test_the_loop_follows_the_staged_schedule(synthetic, tmp_path, monkeypatch):
    shards, bos = synthetic
    seen = _record(monkeypatch)
    cfg = TrainConfig.from_dict(SETTINGS)
    assert cfg.steps == 8 and cfg.tokens_per_step == 256 and cfg.max_seq_len == 64
    result = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos, log_path=tmp_path / "s.txt",
                          env={})
    assert result.status == "complete"
    train = seen["train"]
    assert [t[0] for t in train] == [256, 256, 512, 512, 512, 512, 512, 512]       # tokens per step (1 rank)
    assert [t[1] for t in train] == [64, 64, 128, 128, 128, 128, 128, 128]
    assert [t[3] for t in train] == [(1, 2)] * 2 + [(1, 3)] * 2 + [(2, 3)] * 4
    # MTP weights linear within a stage by (step - start) / length: 0 and 1/2 of each two-step stage
    want_mtp = [[1.0, 0.5, 0.25], [1.0, 0.5, 0.125], [1.0, 0.5], [1.0, 0.25], [1.0], [1.0], [1.0], [1.0]]
    for got, want in zip([t[2]["mtp_weights"] for t in train], want_mtp, strict=True):
        assert got == pytest.approx(want)
    assert [t[2]["prefix_weight"] for t in train] == pytest.approx([0.5, 0.5, 0.5, 0.25, 0, 0, 0, 0])
    # untie: stage 2 starts at 4, made odd 5 is the split step; 6 is the first step trained untied
    assert [t[4] for t in train] == [True] * 6 + [False] * 2
    # lr: the stage's multiplier before the cooldown at int(6 * 0.5) = 3, then mul*(1-t) + 0.1*t, t = (s-3)/3
    lr = {s: (f, m) for s, f, m in seen["lr"]}
    want = [1.0, 1.0, 2.0, 2.0, 3 * 2 / 3 + 0.1 / 3, 3 / 3 + 0.2 / 3, 0.1, 0.1]
    assert [lr[s][0] for s in range(8)] == pytest.approx(want)
    # momentum 0.85 -> 0.95 over 4 steps, back down over the last 2 of 8 (from step 6)
    assert [lr[s][1] for s in range(8)] == pytest.approx([0.85, 0.875, 0.9, 0.925, 0.95, 0.95, 0.95, 0.9])
    # YaRN rescales at the long window's growth (2 -> 3 blocks, step 2), not at the final validation's 3 -> 4
    scales = [t[5] for t in train]
    assert scales[0] == scales[1] and scales[2] != scales[1] and len(set(scales[2:])) == 1
    final_blocks, final_scale, final_freq = seen["val"][-1]
    before_blocks, before_scale, before_freq = seen["val"][-2]                  # step 4's validation
    assert final_blocks == (2, 4) and before_blocks == (2, 3)
    assert final_scale == before_scale and torch.equal(final_freq, before_freq)
    assert [s for s, kind, _ in result.losses if kind == "val"] == [0, 4, 8]


def test_mtp_and_prefix_weights_change_the_loss(synthetic, tmp_path):
    """The same run with next-token-only weights: the first step's train loss (same initialization and
    batch) differs by the MTP and prefix terms."""
    shards, bos = synthetic
    plain = {**SCHEDULE, "stages": [{**s, "mtp_weights_start": [1.0], "mtp_weights_end": [1.0],
                                     "prefix_weight_start": 0.0, "prefix_weight_end": 0.0} for s in SCHEDULE["stages"]]}
    losses = []
    for schedule in (SCHEDULE, plain):
        cfg = TrainConfig.from_dict({**SETTINGS, "staged_schedule": {**schedule, "scheduled_steps": 3,
                                                                     "extension_steps": 0}})
        result = run_training(cfg, variant="v", seed=0, shards_dir=shards, bos_dir=bos,
                              log_path=tmp_path / f"{len(losses)}.txt", env={})
        losses.append(next(loss for s, kind, loss in result.losses if kind == "train"))
        assert all(math.isfinite(loss) for _, _, loss in result.losses)
    assert losses[0] > losses[1] + 0.1                     # 0.5 + 0.25 more cross-entropies and a prefix term


def test_a_record_schedule_over_other_steps():
    cfg = TrainConfig.from_dict({"preset": "record89", "device": "cuda", "micro_batches": 8,
                                 "staged_schedule": {"record": "record89", "scheduled_steps": 105,
                                                     "extension_steps": 15}})
    assert cfg.steps == 120 and cfg.batch_stages() == [(0, 131072, 896), (35, 262144, 2048),
                                                      (70, 393216, 2048), (105, 393216, 2048)]
    assert cfg.untie_step() == 72 and cfg.window_blocks_at(120) == (6, 20)      # 70 | 1 = 71, then 72
    assert TrainConfig.from_dict(cfg.settings()) == cfg                          # the settings rebuild it
    assert TrainConfig.from_dict({**cfg.settings(), "steps": None}) == cfg


@pytest.mark.parametrize("extra, message", [
    ({"steps": 60}, "train.staged_schedule and train.steps are both given"),
    ({"window_schedule": [[1, 2]]}, "train.staged_schedule and train.window_schedule are both given"),
    ({"cooldown_frac": 0.6}, "train.staged_schedule and train.cooldown_frac are both given"),
    ({"model": {**MODEL, "prefix_token_loss": False}}, r"stages\[0\] has a prefix_weight > 0, which needs "
                                                       "model.prefix_token_loss"),
    ({"model": {**MODEL, "tie_embed_head": False}}, "train.staged_schedule.untie_stage needs"),
    ({"model": {**MODEL, "window_pattern": "", "yarn": False}}, "train.staged_schedule sets attention windows"),
    ({"staged_schedule": {"record": "record89", "steps": 3}}, "train.staged_schedule.steps is not a setting"),
])
def test_refusals_name_the_setting(extra, message):
    with pytest.raises(SpeedrunError, match=message):
        TrainConfig.from_dict({**SETTINGS, **extra})


# A record89-style model at toy size: every switch of HEAD's model on (sublayer residual form, MUDD and its
# gates, XSA, DC on the last layer, bigram table, prefix-token table), FP8 and fused kernels off on the CPU.
RECORD89_TINY = {"model_dim": 24, "n_head": 2, "head_dim": 12, "bigram_vocab_size": 30, "window_block_size": 8,
                 "attention_backend": "reference", "cross_entropy": "full", "rotary_kernel": "torch",
                 "mlp_kernel": "torch", "fp8_head": False, "fp8_mlp": False, "fp8_attention": False}
STAGED_TINY = {**SCHEDULE, "scheduled_steps": 6, "extension_steps": 1,
               "stages": [{**s, "tokens_per_step": 256, "max_seq_len": 64} for s in SCHEDULE["stages"]]}
RECORD_SETTINGS = {"preset": "record89", "model": RECORD89_TINY, "staged_schedule": STAGED_TINY, "device": "cpu",
                   "micro_batches": 2, "val_tokens": 512, "val_batch_tokens": 128, "val_every": 3,
                   "dtype": "float32", "muon_lr": 0.023, "normuon_beta2": 0.9, "weight_decay": 1.2,
                   "cautious_weight_decay": True, "head_lr": 0.008, "embed_lr": 0.6, "adam_every": 2,
                   "muon_qk_block_heads": 1, "adam_eps": 1e-10, "adam_eps_units": "micro_batch_sum",
                   "loss_units": "micro_batch_sum"}


@pytest.mark.slow
@pytest.mark.parametrize("weights, tolerance", [({}, 1e-5),
                                                ({"dtype": "bfloat16", "weight_dtype": "bfloat16"}, 2e-3)])
def test_two_gloo_ranks_equal_one_rank_with_two_accumulation_steps_record89(synthetic, tmp_path, weights,
                                                                            tolerance):
    """Issue 20: a 2-rank gloo run equals one rank with 2 accumulation steps with every new switch on (MUDD,
    gates, XSA, DC, prefix and MTP losses, the staged schedule with its untie, Adam on odd steps only: its
    gradients kept over the even steps and averaged over the ranks at the odd ones, Muon's q and k in blocks
    of one head, the records' gradient units); in fp32, and with the records' bf16 weights and products, where
    the two differ by bf16 rounding only (one rank adds its two micro-batches' bf16 gradients, two ranks
    reduce them in bf16)."""
    from test_train import _run_ranks

    shards, bos = synthetic
    settings = {**RECORD_SETTINGS, **weights}
    cfg = TrainConfig.from_dict(settings)
    model = cfg.model_config()
    assert model.mudd and model.mudd_gates and model.xsa_layers and model.dc_layers and model.prefix_token_loss
    assert model.residual_form == "sublayer" and cfg.untie_step() == 6 and cfg.steps == 7
    one = _run_ranks(1, {**settings, "world_size": 1}, shards, bos, tmp_path / "one.txt")[0]
    two = _run_ranks(2, {**settings, "world_size": 2}, shards, bos, tmp_path / "two.txt")
    assert two[0] == two[1]
    assert [(s, k) for s, k, _ in one] == [(s, k) for s, k, _ in two[0]] and len(one) == 7 + 4
    for (_, _, a), (_, _, b) in zip(one, two[0]):
        assert math.isfinite(a) and a == pytest.approx(b, abs=tolerance)
