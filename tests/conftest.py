"""Test-wide settings: float32 means float32 on CUDA/GPU too.

The tests compare ours with oracles computed in float32: Keras' generic
masked loop (`use_cudnn=False`), PyTorch's packed `nn.LSTM/GRU`, numpy. On
NVIDIA GPUs since Ampere (A100, H100, H200) float32 matrix products may run
in TF32, which keeps 10 bits of mantissa (about 5e-4 relative error per
product): cuDNN's RNN kernels (`torch.backends.cudnn.allow_tf32`, True by
default), PyTorch's matmuls (`torch.backends.cuda.matmul.allow_tf32`) and
JAX's default matmul precision on GPU. Over 100 recurrent steps that grows
to differences of 1e-3 and more, which says nothing about our arithmetic.
So TF32 is off for the whole test run (here, before any test), and JAX's
default matmul precision is "highest" (full float32).

Tolerances against cuDNN, with TF32 off: cuDNN computes the same float32
function as Keras' loop, with its own fused gate kernels and summation
order, so results agree to float32 rounding accumulated over the sequence:
about 1e-6 absolute in outputs and states (values in [-1, 1]) and 1e-5
relative in gradients at the tests' sizes (T <= 100). The suite's usual
tolerances (atol 1e-5 on outputs; 1e-4 where gradients sum over 100 steps,
as in tests/test_bench.py) cover that with margin and stay far below the
differences a wrong mask makes (1e-1 and more, which the tests also check).
On a CPU none of this changes anything: there is no TF32 there, and XLA's
CPU matmuls are full float32 at any precision setting.

Every plan on purpose: the `kernel` fixture runs a test once with the plan
users get ("default") and once per kernel the backend has
(`maskedrnn.backends.force`, `maskedrnn.backends.KERNELS`); a kernel the backend
declines for the test's layer here (`maskedrnn.backends.Declined`: e.g.
PyTorch's packed kernel while gradients are recorded, or Keras' unmasked
layer for a generic cell) skips that run, saying why, and so does a forced
run whose first call takes the kernel the default plan takes there: it would
repeat the default run.

The `grad_mode` fixture runs a torch test twice, with gradients recorded and
without: on a CPU those are two different kernels (PyTorch's unpacked
kernel over valid-first data, and its packed kernel, which returns the final
states itself; `maskedrnn.backends.torch_direction.run_direction`).
"""

import os

# XLA compiles the tests' many small programs (every JAX layer call, and
# TensorFlow's jit_compile): at their sizes LLVM's optimization of the
# generated CPU code is most of the compile time and saves nothing at run
# time. Level 0 keeps IEEE semantics (XLA's fast math is off either way):
# the same numbers, compiled in about 20% less CPU time on the JAX suite.
# Set before any backend starts XLA; child processes inherit it. Flags of
# your own in XLA_FLAGS are kept (and an optimization level of your own
# wins).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()

import keras  # noqa: E402
import pytest  # noqa: E402

from maskedrnn import backends  # noqa: E402
from tests.helpers import JAX_CACHE_SETTINGS  # noqa: E402

GRAD_MODES = ["grad", "no_grad"] if keras.backend.backend() == "torch" else ["-"]


@pytest.fixture(params=GRAD_MODES)
def grad_mode(request):
    """On torch: the test body runs with gradients recorded ("grad") or not
    ("no_grad", inference). On other backends: once, unchanged ("-")."""
    if request.param == "-":
        yield request.param
        return
    import torch

    with torch.set_grad_enabled(request.param == "grad"):
        yield request.param


# MASKEDRNN_TEST_KERNELS (comma-separated) narrows the kernels tried, e.g. to
# "default,keras-masked" for the run on the next Keras
# (scripts/check_next_keras.sh), where what matters is Keras' own code.
_ASKED = os.environ.get("MASKEDRNN_TEST_KERNELS", "")
KERNELS_HERE = [
    w
    for w in ["default"] + list(backends.current().KERNELS)
    if not _ASKED or w in _ASKED.split(",")
]


def repeats_the_default(plans):
    """Whether forced `plans` are exactly what the default plan makes:
    every direction took the kernel the backend's own choice gives unforced
    (the strategy follows from the kernels)."""
    return all(
        d.kernel == backends._choose(d.options, None)
        for p in plans
        for d in p.directions
    )


@pytest.fixture(params=KERNELS_HERE)
def kernel(request):
    """The test body runs under `maskedrnn.backends.force(kernel)`, or with
    the default plan ("default"). A forced run whose first call takes the
    kernel the default plan takes there (`repeats_the_default`) would repeat
    the default run: it is skipped at that call, before any kernel runs.
    The decision reads the test's own plan, not what other tests ran, so it
    does not depend on the order of the tests."""
    if request.param == "default":
        yield request.param
        return
    plan = backends.plan
    made = []

    def first_plan_decides(*args, **kwargs):
        result = plan(*args, **kwargs)
        made.append(result)
        if len(made) == 1 and repeats_the_default(made):
            pytest.skip(f"the default plan runs {request.param!r} here")
        return result

    with pytest.MonkeyPatch.context() as patch, backends.force(request.param):
        patch.setattr(backends, "plan", first_plan_decides)
        yield request.param


# MASKEDRNN_TEST_EVERY_BACKEND=1 runs the tests marked `on_backends` under
# every backend (what CI skips: scripts/test.sh).
EVERY_BACKEND = os.environ.get("MASKEDRNN_TEST_EVERY_BACKEND", "") == "1"


def pytest_collection_modifyitems(config, items):
    """Skips a test marked `on_backends(*names)` under another backend.

    The mark is for end-to-end checks whose code is the same on every
    backend (documentation pages, demos, bucketed training): what differs
    between backends, the layers' every kernel against Keras' masked layers,
    is tested under each backend by the other tests. Such a check runs
    where it costs least, PyTorch (eager: nothing to trace or compile;
    TensorFlow traces and JAX on a CPU compiles every new model, tens of
    seconds for a page of examples). Set `MASKEDRNN_TEST_EVERY_BACKEND=1`
    to run them under every backend.

    Then orders the test files for pytest-xdist (`_slow_files_first`).
    """
    if not EVERY_BACKEND:
        _skip_other_backends(items)
    _slow_files_first(items)


def _skip_other_backends(items):
    backend = keras.backend.backend()
    for item in items:
        marker = item.get_closest_marker("on_backends")
        if marker is not None and backend not in marker.args:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"backend-independent: runs under {', '.join(marker.args)} "
                    "(MASKEDRNN_TEST_EVERY_BACKEND=1 runs it here too)"
                )
            )


def _slow_files_first(items):
    """Files with a test marked `slow` first, then by their number of tests,
    most first (each file's own order kept).

    scripts/test.sh hands whole files to two pytest-xdist workers in this
    order (`--dist loadfile --no-loadscope-reorder`). xdist's own order
    (number of tests alone) left a file of a few long tests (torch.compile,
    the GPU check's rehearsal) to the end, where one worker ran it while
    the other had finished.
    """
    files = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    slow = {
        name
        for name, tests in files.items()
        if any(t.get_closest_marker("slow") for t in tests)
    }
    order = sorted(files, key=lambda name: (name not in slow, -len(files[name])))
    items[:] = [item for name in order for item in files[name]]


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test run with a forced `kernel` that the backend declines for its
    layer here is skipped, with the reason."""
    try:
        return (yield)
    except backends.Declined as error:
        if "kernel" not in pyfuncitem.fixturenames:
            raise
        pytest.skip(f"declined here: {error}")


def pytest_configure(config):
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
        _cache_jax_compilations(config)


def _cache_jax_compilations(config):
    """A JAX compilation cache of this test process's own.

    Eager JAX compiles the loop of every new layer call anew (a new Python
    function each time), and the tests call many layers that lower to the
    same XLA program: a persistent compilation cache compiles each program
    once per process instead. The directory is never used by two test
    processes at once (JAX writes its entries without a lock, and with its
    size limit, the lock, it rescans the directory at every write): only a
    child process the test waits for may use it meanwhile
    (`tests.helpers.jax_cache_env`).

    It is a fresh directory, removed at the end; or, with
    `MASKEDRNN_TEST_JAX_CACHE=DIR`, DIR's subdirectory named after the
    pytest-xdist worker ("gw0", ...; "main" without xdist), kept: runs one
    after the other share it (scripts/test.sh: the run on the next Keras
    reuses the programs the main run compiled, where they are the same).
    A `JAX_COMPILATION_CACHE_DIR` of your own is left as it is.
    """
    import shutil
    import tempfile

    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    root = os.environ.get("MASKEDRNN_TEST_JAX_CACHE")
    if root:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        path = os.path.join(root, worker)
        os.makedirs(path, exist_ok=True)
    else:
        path = tempfile.mkdtemp(prefix="maskedrnn-test-jax-cache-")
        config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    for name, value in JAX_CACHE_SETTINGS.items():
        jax.config.update(name.lower(), path if value is None else value)
