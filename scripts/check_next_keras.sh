#!/usr/bin/env bash
# The next Keras, tried before users do: the core parity tests (not those
# marked slow) on the Keras nightly pinned below, on the TensorFlow, JAX and
# torch backends, each in its own process. The parity tests run the plan
# users get (MASKEDRNN_TEST_KERNELS=default; tests/conftest.py), which hands
# the mask to Keras' masked loop wherever that is what runs; every forced
# kernel is tried on the pinned Keras by the main run (keeps CI short). On
# JAX the runs share one compilation cache (MASKEDRNN_TEST_JAX_CACHE, set
# by scripts/test.sh): a program the main run compiled is not compiled
# again.
#
# The nightly is installed on its own (`--no-deps`: its dependencies are
# those of the Keras release already installed) into a folder put first on
# PYTHONPATH, and the tests run with the same interpreter as the main run.
# So it shadows that Keras there and nowhere else, and the check works the
# same from a virtual environment, a conda environment or a bare
# interpreter: everything else (TensorFlow, JAX, torch, optree, pytest) is
# what that interpreter already imports. The tests import the source tree
# (PYTHONPATH).
# Usage: bash scripts/check_next_keras.sh [pytest args...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
step() { echo "[check_next_keras +$((SECONDS - START)) s] $*"; }

# The nightly to try; move it forward when a newer one is worth trying.
PIN=keras-nightly==3.16.0.dev2026102704
step "$PIN into $WORK/next (nothing else)"
python -m pip install -q --disable-pip-version-check --no-deps --target "$WORK/next" "$PIN" \
  2>&1 | grep -v "^WARNING: Location" || true
version=$(PYTHONPATH="$WORK/next" TF_CPP_MIN_LOG_LEVEL=3 python -c "import keras; print(keras.__version__)")
[ "keras-nightly==$version" = "$PIN" ] ||
  { echo "PYTHONPATH=$WORK/next imports Keras $version, not $PIN" >&2; exit 1; }

CORE=(tests/test_masked_bidirectional.py tests/test_masked_rnn.py
      tests/test_mask_propagation.py tests/test_losses.py tests/test_ctc.py
      tests/test_convert_model.py tests/test_training.py tests/test_keras_private.py)
status=0
for backend in tensorflow jax torch; do
  step "Keras $version, KERAS_BACKEND=$backend: core parity tests"
  (cd "$ROOT" && KERAS_BACKEND=$backend PYTHONPATH="$WORK/next:$ROOT" TF_CPP_MIN_LOG_LEVEL=3 \
    MASKEDRNN_TEST_KERNELS=default \
    python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
    -m "not slow" \
    "${CORE[@]}" "$@") || status=1
done
step "done (status $status)"
exit $status
