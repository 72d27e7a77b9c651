#!/usr/bin/env bash
# FlashAttention 4 (PyPI flash-attn-4, CuTe DSL) onto a GPU machine that downloads nothing and takes at most
# 64 MiB per call (working tree included), then the attention benchmark against FlexAttention and varlen
# (issue 23). Its CUDA library wheel, nvidia-cutlass-dsl-libs-cu13 (88 MiB, does not compress), travels in
# parts over consecutive calls of one warm lease, which keeps /tmp between calls (../shared/docs/gpu-notes.md).
#
# Here (network, from the repository root):
#   bash benchmarks/fa4_carry.sh fetch
#       1. pip-downloads the pinned wheels below (Python 3.12, manylinux x86_64, --no-deps) into .carry/fa4/wheels
#          (git-ignored: never committed);
#       2. writes their sha256 to .carry/fa4/SHA256SUMS (whole wheels, the `sha256sum -c` format);
#       3. splits each wheel over 60 MiB into NAME.part-00, -01, ... (split -b 60m; smaller parts when the
#          working tree leaves a call less room);
#       4. packs the pieces, largest first, into .carry/fa4/call1, call2, ... so that each call's folder plus
#          the working tree stays under 64 MiB; every call folder holds SHA256SUMS and PIECES (piece -> call);
#       5. prints the calls to make (the `carry` path and the command of each).
#   bash benchmarks/fa4_carry.sh dry-run
#       receives every call folder into a temporary stage, joins, checks the sha256, installs with pip into a
#       temporary --target and checks the installed files; then damages one piece and checks that the sha256
#       check refuses it. Needs no GPU.
# On the GPU machine, one call per call folder, consecutive, while the lease stays warm (each call carries
# its own folder: carry [".carry/fa4/callN"]):
#   bash benchmarks/fa4_carry.sh receive N          # calls 1..N-1: copy the carried pieces to $FA4_STAGE
#   bash benchmarks/fa4_carry.sh receive N && { bash benchmarks/fa4_carry.sh install; \
#       bash benchmarks/fa4_carry.sh bench --out $OUT/attention_backends.jsonl; }    # the last call
#       (bench runs even when install fails: flex and varlen are measured, fa4's line says what failed)
#   PYTHONPATH=$(bash benchmarks/fa4_carry.sh pythonpath):src python3 -m pytest -q -m gpu \
#       tests/test_attention_flash.py tests/test_attention.py        # a further call: FA3/FA4 vs the reference
#   install: joins the parts under $FA4_STAGE, checks every wheel against SHA256SUMS (refuses on a missing
#       piece, naming its call, or a wrong sum), and runs pip install --no-index --no-deps --target $FA4_SITE,
#       then imports flash_attn.cute, cutlass and quack and prints their versions.
#   bench [ARGS]: benchmarks/attention_backends.py (flex, varlen, fa3, fa4; ARGS passed on) with $FA4_SITE
#       on the path; `bash benchmarks/fa4_carry.sh pythonpath` prints that path for other commands (tests).
# Environment: PYTHON (default python3), PIP_TARGET_FLAGS (extra `pip install` flags; dry-run sets the
# Python 3.12 manylinux ones), FA4_STAGE (default /tmp/fa4-carry), FA4_SITE (default /tmp/fa4-site),
# CARRY (default .carry/fa4), CALL_MIB (what one call may carry, default 64), MARGIN_MIB (left free for the
# working tree to grow, default 3). Run fetch in the checkout that makes the device calls (its tree travels).
# The GPU image already has torch, einops, typing-extensions, cuda-bindings and protobuf (the other
# Requires-Dist of these wheels; KINDS.md's package list), so they are not carried; nor is
# nvidia-cutlass-dsl-libs-cu12 (a hard Requires-Dist of nvidia-cutlass-dsl, unused on the CUDA 13 machine:
# cutlass loads the cu13 flavour it finds). cutlass-dsl adds its dsl_packages folder to sys.path through a .pth
# file, which a --target folder on PYTHONPATH does not run: the path printed by `pythonpath` names it too.
set -euo pipefail

PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.carry/fa4}
FA4_STAGE=${FA4_STAGE:-/tmp/fa4-carry}
FA4_SITE=${FA4_SITE:-/tmp/fa4-site}
CALL_MIB=${CALL_MIB:-64}
MARGIN_MIB=${MARGIN_MIB:-3}     # room for the working tree to grow (merges) between fetch and the calls
PART_BYTES=$((60 * 1024 * 1024))      # split -b 60m, or less when the working tree leaves less room
WHEELS=(
    flash-attn-4==4.0.0b36
    nvidia-cutlass-dsl==4.8.1
    nvidia-cutlass-dsl-libs-base==4.8.1
    nvidia-cutlass-dsl-libs-core==4.8.1
    nvidia-cutlass-dsl-libs-cu13==4.8.1
    quack-kernels==0.6.5
    apache-tvm-ffi==0.1.15.post2
    torch-c-dlpack-ext==0.1.5
)
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"

die() { echo "fa4_carry: $*" >&2; exit 1; }

fetch() {
    local budget
    rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"
    # shellcheck disable=SC2086
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
        -d "$CARRY/wheels" "${WHEELS[@]}"
    [ "$(ls "$CARRY/wheels" | wc -l)" -eq ${#WHEELS[@]} ] || die "expected ${#WHEELS[@]} wheels in $CARRY/wheels"
    (cd "$CARRY/wheels" && sha256sum -- *.whl > ../SHA256SUMS)
    mkdir -p "$CARRY/pieces"
    budget=$(call_budget)
    local part=$((budget < PART_BYTES ? budget : PART_BYTES))
    echo "each call may carry $budget bytes of pieces; parts of $part bytes"
    for wheel in "$CARRY"/wheels/*.whl; do
        if [ "$(stat -c %s "$wheel")" -gt $part ]; then
            split -b $part -d -a 2 "$wheel" "$CARRY/pieces/$(basename "$wheel").part-"
        else
            cp "$wheel" "$CARRY/pieces/"
        fi
    done
    pack
    rm -rf "$CARRY/pieces"
    echo "wheels and sums: $CARRY/wheels, $CARRY/SHA256SUMS"
    calls
}

call_budget() {   # bytes of pieces one call may carry: CALL_MIB minus the working tree and MARGIN_MIB
    local tree
    tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true) |
           awk '{s += $1} END {print s + 0}')
    echo $(((CALL_MIB - MARGIN_MIB) * 1024 * 1024 - tree))
}

pack() {   # first fit, largest piece first, into calls of $budget bytes
    local -a sizes=() names=()
    local name size i placed
    while read -r size name; do
        [ "$size" -le "$budget" ] || die "$name ($size bytes) does not fit one call ($budget bytes)"
        placed=""
        for i in "${!sizes[@]}"; do
            if [ $((sizes[i] + size)) -le "$budget" ]; then placed=$i; break; fi
        done
        if [ -z "$placed" ]; then placed=${#sizes[@]}; sizes+=(0); fi
        sizes[placed]=$((sizes[placed] + size))
        mkdir -p "$CARRY/call$((placed + 1))"
        mv "$CARRY/pieces/$name" "$CARRY/call$((placed + 1))/"
        names+=("$name call$((placed + 1))")
    done < <(cd "$CARRY/pieces" && stat -c '%s %n' -- * | sort -k1,1nr -k2)
    printf '%s\n' "${names[@]}" | sort > "$CARRY/PIECES"
    for i in "${!sizes[@]}"; do
        cp "$CARRY/SHA256SUMS" "$CARRY/PIECES" "$CARRY/call$((i + 1))/"
    done
}

calls() {   # the device calls to make, from the call folders
    local n
    n=$(ls -d "$CARRY"/call* | wc -l)
    echo "GPU calls, consecutive, in one warm lease ($n):"
    for i in $(seq 1 "$n"); do
        local size cmd="bash benchmarks/fa4_carry.sh receive $i"
        size=$(du -sb "$CARRY/call$i" | cut -f1)
        if [ "$i" -eq "$n" ]; then
            cmd="$cmd && { bash benchmarks/fa4_carry.sh install;"
            cmd="$cmd bash benchmarks/fa4_carry.sh bench --out \$OUT/attention_backends.jsonl; }"
        fi
        echo "  call $i: carry [\"$CARRY/call$i\"] ($size bytes); command: $cmd"
    done
    echo "  then, same lease, carrying nothing: PYTHONPATH=\$(bash benchmarks/fa4_carry.sh pythonpath):src" \
         "python3 -m pytest -q -m gpu tests/test_attention_flash.py tests/test_attention.py"
}

receive() {   # receive N: this call's pieces into the stage under /tmp
    local n=${1:?receive N}
    local from="${SRC:-$CARRY}/call$n"
    [ -d "$from" ] || die "$from is missing: carry it in this call (carry [\"$CARRY/call$n\"])"
    mkdir -p "$FA4_STAGE"
    cp -- "$from"/* "$FA4_STAGE/"
    echo "call $n: $(ls "$from" | grep -v -e '^SHA256SUMS$' -e '^PIECES$' | wc -l) pieces into $FA4_STAGE"
}

join_and_check() {   # every piece present, parts joined, every wheel's sha256 right
    [ -f "$FA4_STAGE/PIECES" ] && [ -f "$FA4_STAGE/SHA256SUMS" ] ||
        die "$FA4_STAGE holds no PIECES/SHA256SUMS: no call was received in this lease (start again at call 1)"
    local missing="" name call
    while read -r name call; do
        [ -f "$FA4_STAGE/$name" ] || missing="$missing $name ($call)"
    done < "$FA4_STAGE/PIECES"
    [ -z "$missing" ] || die "missing pieces:$missing; the lease went cold or a call was skipped: start again at call 1"
    local wheel parts
    for wheel in $(awk '{print $2}' "$FA4_STAGE/SHA256SUMS"); do
        parts=$(ls "$FA4_STAGE/$wheel".part-* 2> /dev/null || true)
        if [ -n "$parts" ]; then          # joined afresh each time: a stale join never hides the parts
            # shellcheck disable=SC2086
            cat $parts > "$FA4_STAGE/$wheel.joining" && mv "$FA4_STAGE/$wheel.joining" "$FA4_STAGE/$wheel"
        fi
    done
    (cd "$FA4_STAGE" && sha256sum --quiet -c SHA256SUMS) || die "sha256 check failed in $FA4_STAGE"
    echo "joined and checked: $(wc -l < "$FA4_STAGE/SHA256SUMS") wheels"
}

install() {
    join_and_check
    local -a wheels=()
    mapfile -t wheels < <(awk -v d="$FA4_STAGE" '{print d "/" $2}' "$FA4_STAGE/SHA256SUMS")
    # shellcheck disable=SC2086
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$FA4_SITE" \
        ${PIP_TARGET_FLAGS:-} "${wheels[@]}"
    echo "installed into $FA4_SITE"
    [ "${1:-}" = "--files-only" ] && { check_files; return; }
    PYTHONPATH="$(pythonpath)${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c '
import importlib.metadata as m
import cutlass, flash_attn.cute, quack, tvm_ffi
print({n: m.version(n) for n in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi")})'
}

check_files() {   # what the import would need, checked without importing (no GPU)
    local f
    for f in flash_attn/cute/interface.py flash_attn/cute/flash_fwd_sm90.py flash_attn/cute/flash_bwd_sm90.py \
             quack/__init__.py tvm_ffi/__init__.py nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py \
             nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so; do
        [ -f "$FA4_SITE/$f" ] || die "not installed: $FA4_SITE/$f"
    done
    ls "$FA4_SITE"/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.*.so > /dev/null ||
        die "not installed: the cu13 _cutlass_ir library"
    echo "installed files present"
}

pythonpath() { echo "$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages"; }

bench() {
    PYTHONPATH="$(pythonpath):src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
        "$PYTHON" benchmarks/attention_backends.py --backends flex,varlen,fa3,fa4 "$@"
}

dry_run() {
    [ -f "$CARRY/PIECES" ] || die "run fetch first"
    local n
    tmp=$(mktemp -d)              # global: the EXIT trap removes it after this function has returned
    trap 'rm -rf "$tmp"' EXIT
    n=$(ls -d "$CARRY"/call* | wc -l)
    for i in $(seq 1 "$n"); do FA4_STAGE=$tmp/stage receive "$i"; done
    # this machine's Python may not be 3.12: pip installs the 3.12 wheels into the --target all the same
    FA4_STAGE=$tmp/stage FA4_SITE=$tmp/site PIP_TARGET_FLAGS="--only-binary=:all: --python-version 3.12
        --implementation cp $PLATFORMS" install --files-only
    cmp "$tmp/stage/$(basename "$(ls "$CARRY"/wheels/nvidia_cutlass_dsl_libs_cu13-*.whl)")" \
        "$(ls "$CARRY"/wheels/nvidia_cutlass_dsl_libs_cu13-*.whl)" && echo "joined wheel equals the downloaded one"
    # a damaged piece must be refused: a fresh stage, one byte of the last part changed
    for i in $(seq 1 "$n"); do FA4_STAGE=$tmp/bad receive "$i" > /dev/null; done
    local part
    part=$(ls "$tmp"/bad/*.part-* | tail -1)
    printf 'X' | dd of="$part" bs=1 seek=1000 conv=notrunc status=none
    if (FA4_STAGE=$tmp/bad join_and_check) 2> "$tmp/err"; then die "a damaged piece was not refused"; fi
    echo "damaged piece refused: $(tail -1 "$tmp/err")"
    # a missing call must be refused, naming it
    rm -rf "$tmp/bad" && FA4_STAGE=$tmp/bad receive "$n" > /dev/null
    if (FA4_STAGE=$tmp/bad join_and_check) 2> "$tmp/err"; then die "a missing call was not refused"; fi
    echo "missing call refused: $(tail -1 "$tmp/err")"
    echo "dry run passed"
}

case "${1:-}" in
    fetch) fetch ;;
    calls) calls ;;
    receive) receive "${2:-}" ;;
    install) install ;;
    bench) shift; bench "$@" ;;
    pythonpath) pythonpath ;;
    dry-run) dry_run ;;
    *) die "usage: $0 fetch | calls | dry-run | receive N | install | bench [ARGS] | pythonpath" ;;
esac
