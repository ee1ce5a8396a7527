#!/usr/bin/env bash
# Re-measures every CPU figure of docs/benchmarks.md and README's speed section:
# writes docs/results/cpu-*.json (the bench's full results; its printed table
# goes to stdout) and the plots docs/img/bench_cpu_<backend>.png. Then
# `python scripts/bench_docs.py` rewrites the pages' tables from the JSON.
#   scripts/bench_cpu.sh rnn          # only the MaskedRNN runs, left-padded
# Each run is its own process (the Keras backend and the thread pools are fixed
# at start). Takes about 45 minutes on a 2-core machine, plus the first calls
# (--first-call-repeats 3 by default: a minute or two more per run).
#   scripts/bench_cpu.sh [NAME...]     # default: all; NAME e.g. torch-lstm, jax-rnn-gru
# BENCH_ARGS, if set, is added to every run's options (scripts/bench_runs.py
# passes each round's --order-seed this way).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
SIZES=(--batch 32 --time 100 --features 64 --units 64 --lengths uniform:0.2
       --mode both --repeats 20 --warmup 3 --threads 1 --no-progress)
declare -A RUNS
for b in tensorflow jax torch; do
  RUNS[$b-lstm]="$b ${SIZES[*]} --plot docs/img/bench_cpu_$b.png"
  RUNS[$b-gru]="$b ${SIZES[*]} --cell gru"
  RUNS[$b-lstm-state]="$b ${SIZES[*]} --return-state"
done
# MaskedRNN (one direction, --layer rnn) against Keras' LSTM/GRU/SimpleRNN and
# PyTorch's bidirectional=False, left-padded (the runs with CPU targets).
RNN="--layer rnn --batch 32 --time 100 --features 64 --units 64
     --lengths uniform:0.2 --mode both --repeats 20 --warmup 3 --threads 1 --no-progress"
RNN=${RNN//$'\n'/ }
for b in tensorflow jax torch; do
  for c in lstm gru; do
    RUNS[$b-rnn-$c]="$b $RNN --padding pre --cell $c"
    RUNS[$b-rnn-$c-state]="$b $RNN --padding pre --cell $c --return-state"
  done
  # SimpleRNN (tanh; torch nn.RNN), left-padded: no target, the same comparison.
  RUNS[$b-rnn-simplernn]="$b $RNN --padding pre --cell rnn"
  RUNS[$b-rnn-simplernn-state]="$b $RNN --padding pre --cell rnn --return-state"
done
# TensorFlow's fused LSTM kernel at a larger size (B=64 T=200 D=U=128).
BIG="--batch 64 --time 200 --features 128 --units 128 --lengths uniform:0.2
     --mode both --repeats 20 --warmup 3 --threads 1 --no-progress"
BIG=${BIG//$'\n'/ }
RUNS[tensorflow-lstm-b64-t200-u128]="tensorflow $BIG"
RUNS[tensorflow-lstm-b64-t200-u128-state]="tensorflow $BIG --return-state"
# On a JAX CPU a SimpleRNN runs Keras' masked loop: its tiers timed forced.
RUNS[jax-rnn-simplernn]+=" --way jax-tiers"
RUNS[jax-rnn-simplernn-state]+=" --way jax-tiers"
# JAX's length tiers: the larger size, and the bidirectional GRU with states.
RUNS[jax-lstm-b64-t200-u128]="jax $BIG"
RUNS[jax-gru-state]="jax ${SIZES[*]} --cell gru --return-state"
names=("$@")
if [ "${names[*]:-}" = rnn ]; then
  names=()
  for b in tensorflow jax torch; do
    for c in lstm gru; do names+=("$b-rnn-$c" "$b-rnn-$c-state"); done
  done
fi
if [ ${#names[@]} = 0 ]; then
  names=(tensorflow-lstm jax-lstm torch-lstm tensorflow-gru jax-gru torch-gru
         tensorflow-lstm-state jax-lstm-state torch-lstm-state)
  for b in tensorflow jax torch; do
    for c in lstm gru; do
      names+=("$b-rnn-$c" "$b-rnn-$c-state")
    done
    names+=("$b-rnn-simplernn" "$b-rnn-simplernn-state")
  done
  names+=(tensorflow-lstm-b64-t200-u128 tensorflow-lstm-b64-t200-u128-state
          jax-lstm-b64-t200-u128 jax-gru-state)
fi
status=0
for name in "${names[@]}"; do
  spec=${RUNS[$name]:-}
  [ -n "$spec" ] || { echo "unknown run $name" >&2; exit 2; }
  backend=${spec%% *}
  args="${spec#* }${BENCH_ARGS:+ $BENCH_ARGS}"
  echo "=== $name: KERAS_BACKEND=$backend python -m maskedrnn.bench $args --json docs/results/cpu-$name.json"
  # shellcheck disable=SC2086
  err=$(mktemp)
  KERAS_BACKEND=$backend "$PY" -m maskedrnn.bench $args --json "docs/results/cpu-$name.json" \
    2> "$err" || status=1
  grep -v "^I0000\|^W0000\|^E0000\|^WARNING: All\|USDT" "$err" | tail -5
  rm -f "$err"
done
exit $status
