#!/usr/bin/env bash
# Re-measures every CPU figure of docs/benchmarks.md and README's speed section:
# writes docs/results/cpu-*.json (the bench's full results) and cpu-*.txt (its
# printed table), and the plots docs/img/bench_cpu_<backend>.png.
#   scripts/bench_cpu.sh rnn          # only the MaskedRNN runs, left-padded
#   scripts/bench_cpu.sh rnn-post     # only the MaskedRNN runs, right-padded (*-post)
# Each run is its own process (the Keras backend and the thread pools are fixed
# at start). Takes well over half an hour on a 2-core machine.
#   scripts/bench_cpu.sh [NAME...]     # default: all; NAME e.g. torch-lstm, jax-gru-full-small
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
# JAX GRU: Keras' unmasked GRU kernel (backend.gru) against its generic step loop
# (keras_masked, all-True mask) and ours (generic loop, no mask): full rows.
JAX_GRU="--cell gru --lengths full --mode both --repeats 20 --warmup 3 --threads 1 --no-progress"
RUNS[jax-gru-full-small]="jax $JAX_GRU --batch 16 --time 50 --features 32 --units 32"
RUNS[jax-gru-full-large]="jax $JAX_GRU --batch 64 --time 200 --features 128 --units 128"
# MaskedRNN (one direction, --layer rnn) against Keras' LSTM/GRU and PyTorch's
# bidirectional=False, left-padded (issue 11's CPU targets).
RNN="--layer rnn --batch 32 --time 100 --features 64 --units 64
     --lengths uniform:0.2 --mode both --repeats 20 --warmup 3 --threads 1 --no-progress"
RNN=${RNN//$'\n'/ }
for b in tensorflow jax torch; do
  for c in lstm gru; do
    RUNS[$b-rnn-$c]="$b $RNN --padding pre --cell $c"
    RUNS[$b-rnn-$c-state]="$b $RNN --padding pre --cell $c --return-state"
    # Right-padded: where the time goes (mask= gathers vs lengths=, which has none)
    RUNS[$b-rnn-$c-post]="$b $RNN --padding post --cell $c"
    RUNS[$b-rnn-$c-state-post]="$b $RNN --padding post --cell $c --return-state"
  done
  # SimpleRNN (tanh; torch nn.RNN), left-padded: no issue-11 target, measured as
  # the same comparison.
  RUNS[$b-rnn-simplernn]="$b $RNN --padding pre --cell rnn"
  RUNS[$b-rnn-simplernn-state]="$b $RNN --padding pre --cell rnn --return-state"
done
names=("$@")
if [ "${names[*]:-}" = rnn ] || [ "${names[*]:-}" = rnn-post ]; then
  suffix=${names[0]#rnn}
  names=()
  for b in tensorflow jax torch; do
    for c in lstm gru; do names+=("$b-rnn-$c$suffix" "$b-rnn-$c-state$suffix"); done
  done
fi
if [ ${#names[@]} = 0 ]; then
  names=(tensorflow-lstm jax-lstm torch-lstm tensorflow-gru jax-gru torch-gru
         tensorflow-lstm-state jax-lstm-state torch-lstm-state
         jax-gru-full-small jax-gru-full-large)
  for b in tensorflow jax torch; do
    for c in lstm gru; do
      names+=("$b-rnn-$c" "$b-rnn-$c-state" "$b-rnn-$c-post" "$b-rnn-$c-state-post")
    done
    names+=("$b-rnn-simplernn" "$b-rnn-simplernn-state")
  done
fi
status=0
for name in "${names[@]}"; do
  spec=${RUNS[$name]:-}
  [ -n "$spec" ] || { echo "unknown run $name" >&2; exit 2; }
  backend=${spec%% *}
  args="${spec#* }${BENCH_ARGS:+ $BENCH_ARGS}"
  echo "=== $name: KERAS_BACKEND=$backend python -m maskedrnn.bench $args --json docs/results/cpu-$name.json"
  # shellcheck disable=SC2086
  KERAS_BACKEND=$backend "$PY" -m maskedrnn.bench $args --json "docs/results/cpu-$name.json" \
    > "docs/results/cpu-$name.txt" 2> "docs/results/cpu-$name.err" || status=1
  grep -v "^I0000\|^W0000\|^E0000\|^WARNING: All\|USDT" "docs/results/cpu-$name.err" | tail -5
  rm -f "docs/results/cpu-$name.err"
  tail -3 "docs/results/cpu-$name.txt"
done
exit $status
