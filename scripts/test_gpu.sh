#!/usr/bin/env bash
# The GPU check's wrapper: the wheels here, the install and scripts/gpu_check.py there.
#
#   scripts/test_gpu.sh --fetch-wheels                 # here, with a package index
#   scripts/test_gpu.sh BACKEND BUDGET_S [OUT_DIR] [gpu_check.py options]
#   scripts/test_gpu.sh --dry-run BACKEND BUDGET_S [OUT_DIR] [options]
#
# The GPU machine (../shared/gpu/README.md) has Python 3.12 with CUDA builds of
# PyTorch and JAX, pytest, no TensorFlow, no keras and no package index. First,
# here: `scripts/test_gpu.sh --fetch-wheels` puts the keras, namex and optree
# wheels into the ignored folder .whl/ (../shared/gpu/wheels.sh). Then on the
# GPU machine, with .whl carried, one command per backend:
#   scripts/test_gpu.sh torch 300     # give the command about 340 s
#   scripts/test_gpu.sh jax 240       # about 280 s
# Each installs .whl/*.whl into /tmp/site (when .whl holds wheels), sets
# PYTHONPATH=/tmp/site:$PWD, PYTHONUNBUFFERED=1 and KERAS_BACKEND, and runs
#   python3 scripts/gpu_check.py --backend BACKEND --budget-s BUDGET_S --out OUT_DIR
# (OUT_DIR defaults to $OUT), which writes gpu_check-BACKEND.json, .log and
# -profile.txt there; copy them into docs/results/gpu/. Further options go to
# gpu_check.py (e.g. --device cpu --quick, its rehearsal).
# --dry-run prints the commands instead of running them. PYTHON (default
# python3) can be set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=0
case "${1:-}" in
  --fetch-wheels)
    ../shared/gpu/wheels.sh || exit 1
    ls -1 .whl
    exit 0 ;;
  -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  --dry-run) DRY=1; shift ;;
esac
if [ $# -lt 2 ]; then
  echo "usage: scripts/test_gpu.sh [--dry-run] BACKEND BUDGET_S [OUT_DIR] [options] (or --fetch-wheels, --help)" >&2
  exit 2
fi
BACKEND=$1 BUDGET=$2
shift 2
OUT_DIR=${OUT:-}
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  OUT_DIR=$1
  shift
fi
case "$BACKEND" in torch|jax) ;; *) echo "BACKEND must be torch or jax (no TensorFlow on the GPU machine); got $BACKEND" >&2; exit 2 ;; esac
if [ -z "$OUT_DIR" ]; then
  echo "give an output folder (OUT_DIR) or set OUT" >&2
  exit 2
fi
install=()
if ls .whl/*.whl >/dev/null 2>&1; then
  install=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
    --upgrade --target /tmp/site .whl/*.whl)
  SITE=/tmp/site:
else
  SITE=
fi
check=("$PY" scripts/gpu_check.py --backend "$BACKEND" --budget-s "$BUDGET" --out "$OUT_DIR" "$@")
if [ "$DRY" = 1 ]; then
  [ ${#install[@]} -gt 0 ] && echo "${install[*]}"
  echo "PYTHONPATH=$SITE$PWD PYTHONUNBUFFERED=1 KERAS_BACKEND=$BACKEND ${check[*]}"
  exit 0
fi
if [ ${#install[@]} -gt 0 ]; then
  "${install[@]}" || exit 1
fi
export PYTHONPATH=$SITE$PWD PYTHONUNBUFFERED=1 KERAS_BACKEND=$BACKEND
exec "${check[@]}"
