#!/usr/bin/env bash
# The GPU check of maskedrnn: the GPU-relevant tests on the torch and JAX
# backends, then the benchmark (LSTM and GRU, pre-padded, with and without
# --return-state, with --profile), writing JSON files and logs into OUT_DIR.
#
#   scripts/test_gpu.sh [--dry-run] [--part tests|bench|extra|probes|all] [OUT_DIR]  (OUT_DIR: $OUT)
#   scripts/test_gpu.sh --fetch-wheels    # here, with a package index (see below)
#
# The GPU machine (../shared/gpu/README.md) has Python 3.12 with CUDA builds of
# PyTorch and JAX, no TensorFlow and no package index. First, here:
#   scripts/test_gpu.sh --fetch-wheels    # keras, namex, optree (../shared/gpu/wheels.sh)
#                                         # plus pytest and its dependencies, into .whl/
# then on the GPU machine, with .whl carried, one part per command (each fits in 10 min):
#   scripts/test_gpu.sh --part tests $OUT
#   scripts/test_gpu.sh --part bench $OUT    # LSTM, GRU, pre-padded, +- --return-state
#   scripts/test_gpu.sh --part extra $OUT    # MaskedRNN (--layer rnn), --preset stacked
#   scripts/test_gpu.sh --part probes $OUT   # (torch) benchmarks/cuda_saturated_lstm.py,
#                                            # (JAX) benchmarks/jax_cudnn_seq_lengths.py
# and copy $OUT's *.json, *.txt and *.log into docs/results/.
#
# --dry-run: installs nothing and runs nothing: collects the selected tests on each
# backend (fails if one selects nothing or fails to collect) and checks that every
# bench command's options parse, printing the commands.
# BACKENDS (default "torch jax"), PYTHON (default python3) and GPU_TESTS (pytest
# arguments replacing the test selection) can be set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BACKENDS=${BACKENDS:-torch jax}
DRY=0
PART=all
OUT_DIR=${OUT:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --part) PART=$2; shift ;;
    --fetch-wheels)
      ../shared/gpu/wheels.sh || exit 1
      for spec in pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 packaging==26.2 pygments==2.20.0; do
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
          --implementation cp -d .whl "$spec" || exit 1
      done
      ls -1 .whl
      exit 0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) OUT_DIR=$1 ;;
  esac
  shift
done
case "$PART" in tests|bench|extra|probes|all) ;; *) echo "--part must be tests, bench, extra, probes or all; got $PART" >&2; exit 2 ;; esac
if [ -z "$OUT_DIR" ]; then
  echo "give an output folder (argument) or set OUT" >&2
  exit 2
fi
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/test_gpu.log"

# The GPU-relevant tests: parity with Keras' masked layer (layer, ops, execution
# modes, mixed precision), the kernel spies and profiles, training parity,
# GPU -> CPU save/load, the bench's own checks; on torch, the native-kernel tests.
TESTS=${GPU_TESTS:-"tests/test_masked_bidirectional.py tests/test_masked_rnn.py
  tests/test_ops.py tests/test_execution_modes.py
  tests/test_precision.py tests/test_backends.py tests/test_bench_kernels.py
  tests/test_training.py tests/test_gpu_to_cpu.py tests/test_bench.py"}
if [ -z "${GPU_TESTS:-}" ] && "$PY" -c "import hypothesis" 2>/dev/null; then
  TESTS="$TESTS tests/test_properties.py"
fi

if [ "$DRY" = 0 ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  fi
  "$PY" -c "import pytest" 2>/dev/null || {
    echo "pytest is not importable: run scripts/test_gpu.sh --fetch-wheels where there is a package index, and carry .whl" >&2
    exit 1
  }
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    "$PY" -c "import sys; print('python', sys.version)"
  } >> "$LOG"
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

status=0
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  for backend in $BACKENDS; do
    files=$TESTS
    [ "$backend" = torch ] && files="$files tests/test_torch_kernels.py"
    if [ "$DRY" = 1 ]; then
      out=$(KERAS_BACKEND=$backend "$PY" -m pytest --collect-only -q -p no:cacheprovider $files 2>&1)
      rc=$?
      count=$(printf '%s\n' "$out" | grep -c '::')
      echo "KERAS_BACKEND=$backend: $count tests selected (pytest --collect-only exit $rc)"
      if [ "$rc" != 0 ] || [ "$count" = 0 ]; then
        printf '%s\n' "$out" | tail -20 >&2
        status=1
      fi
      continue
    fi
    echo "=== tests, KERAS_BACKEND=$backend ===" | tee -a "$LOG"
    KERAS_BACKEND=$backend "$PY" -m pytest -q -p no:cacheprovider -rs --durations=15 $files \
      2>&1 | tee -a "$LOG" "$OUT_DIR/test_gpu-$backend.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi

RUNS=()
if [ "$PART" = bench ] || [ "$PART" = all ]; then
  for cell in lstm gru; do
    for state in "" --return-state; do
      RUNS+=("$cell-pre${state:+-state}|--preset gpu --padding pre --cell $cell $state")
    done
  done
fi
if [ "$PART" = extra ] || [ "$PART" = all ]; then
  for cell in lstm gru; do
    RUNS+=("rnn-$cell-pre|--preset gpu --layer rnn --padding pre --cell $cell")
  done
  RUNS+=("stacked-lstm-pre|--preset stacked --padding pre --cell lstm")
fi
if [ ${#RUNS[@]} -gt 0 ]; then
  commands=()
  for backend in $BACKENDS; do
    for run in "${RUNS[@]}"; do
      name="gpu-$backend-${run%%|*}"
      # shellcheck disable=SC2206
      args=(${run#*|} --mode both --profile --no-progress --json "$OUT_DIR/$name.json")
      if [ "$DRY" = 1 ]; then
        echo "KERAS_BACKEND=$backend $PY -m maskedrnn.bench ${args[*]}"
        commands+=("${args[*]}")
        continue
      fi
      echo "=== bench $name ===" | tee -a "$LOG"
      KERAS_BACKEND=$backend "$PY" -m maskedrnn.bench "${args[@]}" \
        > "$OUT_DIR/$name.txt" 2>&1
      rc=$?
      cat "$OUT_DIR/$name.txt" >> "$LOG"
      [ "$rc" = 0 ] || { echo "bench $name failed (exit $rc)" | tee -a "$LOG"; status=1; }
    done
  done
  if [ "$DRY" = 1 ]; then
    # Every command's options parse (one process: importing Keras is slow).
    "$PY" -c "
import shlex, sys
from maskedrnn.bench.config import build_parser
for line in sys.argv[1:]:
    build_parser().parse_args(shlex.split(line))
print(f'{len(sys.argv) - 1} bench commands parse')" "${commands[@]}" || status=1
  fi
fi
# The probes: scripts that measure a candidate GPU path before the layers take
# it. `probe BACKEND NAME` runs benchmarks/<NAME with _>.py on that backend (when it
# is in BACKENDS) into $OUT_DIR/NAME.txt.
probe() {
  local backend=$1 name=$2 script
  script=benchmarks/${2//-/_}.py
  [[ " $BACKENDS " == *" $backend "* ]] || return 0
  if [ "$DRY" = 1 ]; then
    echo "KERAS_BACKEND=$backend $PY $script"
    return 0
  fi
  echo "=== probe $name ===" | tee -a "$LOG"
  KERAS_BACKEND=$backend "$PY" "$script" > "$OUT_DIR/$name.txt" 2>&1
  local rc=$?
  cat "$OUT_DIR/$name.txt" >> "$LOG"
  [ "$rc" = 0 ] || { echo "probe $name failed (exit $rc)" | tee -a "$LOG"; status=1; }
}
if [ "$PART" = probes ] || [ "$PART" = all ]; then
  # Would the saturated padding (an LSTM's exact final c from the fused kernel
  # itself, as on a torch CPU) pay on cuDNN too? Exactness with TF32 off and
  # on, and its time against the layers' current GPU path.
  probe torch cuda-saturated-lstm
  # Would one cuDNN call with per-row seq_lengths (jax.experimental.rnn.lstm,
  # the call behind Keras' fused Bidirectional) serve the masked layers on a
  # JAX GPU? Exactness against Keras' masked layer, time against the current
  # path.
  probe jax jax-cudnn-seq-lengths
fi
if [ "$DRY" = 1 ]; then
  echo "test_gpu.sh --dry-run: exit $status"
else
  echo "test_gpu.sh: exit $status" | tee -a "$LOG"
fi
exit $status
