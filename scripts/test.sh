#!/usr/bin/env bash
# Installs maskedrnn with its CI extras, lints, and runs pytest once per Keras backend,
# each in its own process (the backend is fixed at import time); then the core tests
# on the next Keras (scripts/check_next_keras.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e ".[ci]"
# tf-keras (Keras 2) only for the legacy CuDNN tests; --no-deps keeps tensorflow-cpu
# (its metadata asks for the full tensorflow package).
python -m pip install -q --no-deps tf-keras==2.21.0
python -m ruff check .
status=0
# The wheel, installed in fresh venvs by a Colab notebook's own install cell,
# at the pinned and at the lowest Keras/TensorFlow setup.cfg allows
# (scripts/check_wheel.sh; 652 s on a heavily loaded 2-core machine, about
# half of it pip installs, see docs/results/check_wheel.txt): it runs in the
# background while pytest runs; its log is printed at the end.
wheel_log=$(mktemp)
# One JAX compilation cache for the JAX runs here, one directory per pytest
# worker (tests/conftest.py): the run on the next Keras reuses the programs
# the main run compiled.
MASKEDRNN_TEST_JAX_CACHE=$(mktemp -d)
export MASKEDRNN_TEST_JAX_CACHE
trap 'rm -rf "$MASKEDRNN_TEST_JAX_CACHE"' EXIT
bash scripts/check_wheel.sh > "$wheel_log" 2>&1 &
wheel_pid=$!
# colab/01_quickstart.ipynb runs in the wheel check, from the installed
# wheel at the pinned and at the lowest Keras: not a third time here.
for backend in tensorflow jax torch; do
  echo "=== KERAS_BACKEND=$backend ==="
  KERAS_BACKEND=$backend python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
    --no-loadscope-reorder \
    --deselect "tests/test_notebooks.py::test_notebook_runs[01_quickstart]" \
    --durations=15 "$@" || status=1
done
echo "=== scripts/check_next_keras.sh ==="
bash scripts/check_next_keras.sh || status=1
echo "=== scripts/check_wheel.sh ==="
wait "$wheel_pid" || status=1
grep -v "^\[IPKernelApp\] WARNING" "$wheel_log" || true
rm -f "$wheel_log"
exit $status
