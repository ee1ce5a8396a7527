#!/usr/bin/env bash
# The install a Colab user makes, checked from the built wheel.
#
# Builds the wheel (python -m build), then for each profile creates a fresh
# virtual environment (no system site-packages) holding only what a Colab
# image has (TensorFlow CPU and Keras) plus the notebook runner (nbclient,
# nbformat, ipykernel), checks that maskedrnn is not importable there, and runs
# colab/01_quickstart.ipynb from a directory outside the source tree: its own
# install cell installs the wheel (MASKEDRNN_PIP_SPEC=<wheel>), exactly as it
# installs the repository on Colab. Profiles:
#   current  Keras and TensorFlow pinned in setup.cfg's `ci` extra.
#   lowest   the lowest Keras and TensorFlow setup.cfg allows (install_requires
#            keras>=X -> keras==X.*, tensorflow-cpu>=Y -> tensorflow-cpu==Y.*);
#            the core parity tests (tests/test_masked_bidirectional.py, against
#            Keras' masked Bidirectional) run there too, TensorFlow backend,
#            on the plan users get.
# Usage: bash scripts/check_wheel.sh [current] [lowest]   (default: both)
# Packages come from pip's configured index (and cache); nothing else is shared.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROFILES=("${@:-current lowest}")
PROFILES=(${PROFILES[*]})
WORK=$(mktemp -d)
# Deleting a TensorFlow venv takes over a minute on a busy disk: do it in the
# background, after this script has reported.
trap 'nohup rm -rf "$WORK" >/dev/null 2>&1 &' EXIT
START=$SECONDS
step() { echo "[check_wheel +$((SECONDS - START)) s] $*"; }
unset PYTHONPATH
export TF_CPP_MIN_LOG_LEVEL=3

# Pins read from setup.cfg, so that this check follows what the package claims.
pins() {
  python - "$ROOT/setup.cfg" "$1" <<'PY'
import configparser, re, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
extras = cfg["options.extras_require"]
def reqs(text):
    return [r.strip() for r in text.strip().splitlines() if r.strip()]
ci = reqs(extras["ci"])
runner = [r for r in ci if r.split("==")[0] in ("nbclient", "nbformat", "ipykernel")]
if sys.argv[2] == "current":
    stack = [r for r in ci if r.split("==")[0] in ("keras", "tensorflow-cpu")]
else:
    lowest = {}
    for r in reqs(cfg["options"]["install_requires"]) + reqs(extras["tensorflow-cpu"]):
        m = re.fullmatch(r"(keras|tensorflow-cpu)>=([0-9.]+)", r)
        if m:
            lowest[m.group(1)] = f"{m.group(1)}=={m.group(2)}.*"
    assert sorted(lowest) == ["keras", "tensorflow-cpu"], lowest
    stack = [lowest["keras"], lowest["tensorflow-cpu"], "pytest", "hypothesis"]
print(" ".join(stack + runner))
PY
}

step "building the wheel"
mkdir -p "$WORK/src"
# Build from a copy of the tracked and untracked (not ignored) files, so the
# checkout is left untouched (no build/ or egg-info).
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 -I{} sh -c 'test -e "{}" && printf "%s\0" "{}"' |
  tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
python -m build --wheel --outdir "$WORK/dist" "$WORK/src" > "$WORK/build.log" 2>&1 ||
  { cat "$WORK/build.log"; exit 1; }
# --wheel: the wheel is the one file in dist/.
WHEEL=$(ls "$WORK"/dist/maskedrnn-*)
step "built the wheel $(basename "$WHEEL" | sed 's/[.][^.]*$//')"

for profile in "${PROFILES[@]}"; do
  venv="$WORK/venv-$profile"
  run="$WORK/run-$profile"
  mkdir -p "$run"
  requirements=$(pins "$profile")
  step "$profile: fresh venv with $requirements"
  python -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $requirements \
    2>&1 | grep -v "^WARNING: Location" || true
  "$venv/bin/python" -c "import keras, tensorflow" ||
    { echo "$profile: the venv lacks keras or tensorflow" >&2; exit 1; }
  if (cd "$run" && "$venv/bin/python" -c "import maskedrnn" 2>/dev/null); then
    echo "$profile: maskedrnn is importable before the install cell ran" >&2
    exit 1
  fi
  versions=$("$venv/bin/python" -c \
    "import keras, tensorflow as tf; print(f'keras {keras.__version__}, tensorflow {tf.__version__}')" 2>/dev/null)
  step "$profile: $versions; running colab/01_quickstart.ipynb in $run"
  (cd "$run" && MASKEDRNN_PIP_SPEC="$WHEEL" MASKEDRNN_NOTEBOOK_SMALL=1 \
    KERAS_BACKEND=tensorflow CUDA_VISIBLE_DEVICES="" \
    "$venv/bin/python" "$ROOT/scripts/run_notebook.py" \
    "$ROOT/colab/01_quickstart.ipynb" "$run")
  if [ "$profile" = lowest ]; then
    # The plan users get (MASKEDRNN_TEST_KERNELS, tests/conftest.py): the
    # forced kernels run on the pinned Keras in the main run.
    step "$profile: core parity tests (TensorFlow backend, default plan)"
    (cd "$ROOT" && KERAS_BACKEND=tensorflow PYTHONPATH="$ROOT" MASKEDRNN_TEST_KERNELS=default \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_masked_bidirectional.py)
  fi
  step "$profile: OK ($versions)"
done
step "done"
