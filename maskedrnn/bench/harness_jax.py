"""The JAX harness: `jax.jit` of `layer.stateless_call` (and of
`jax.value_and_grad` of it); timing waits with `jax.block_until_ready`."""

import contextlib
import os

import numpy as np


def gpu_available():
    import jax

    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def set_threads(threads):
    """Makes XLA's CPU backend single-threaded (the only count it can take
    from Python), which must happen before JAX starts its backends."""
    from jax._src import xla_bridge

    if threads != 1:
        raise SystemExit(
            f"--threads {threads}: on the JAX backend only --threads 1 is "
            "supported (XLA sizes its CPU thread pool itself)."
        )
    if xla_bridge.backends_are_initialized():
        raise SystemExit(
            "--threads 1 on JAX must be set before JAX starts; run the bench "
            "in a fresh process, or set XLA_FLAGS='--xla_cpu_multi_thread_eigen"
            "=false intra_op_parallelism_threads=1' yourself."
        )
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()
    return "1 XLA CPU thread (--threads 1: XLA_FLAGS)"


def default_threads_note(gpu=False):
    return (
        "XLA's own CPU thread pool (pass --threads 1 on a shared machine, in "
        "a fresh process)"
    )


class Harness:
    """jax.jit of stateless_call (and of its value_and_grad)."""

    def __init__(self, gpu):
        import jax

        self.jax = jax
        self.gpu = gpu
        self.device = jax.devices("gpu" if gpu else "cpu")[0]

    def tensor(self, array):
        return self.jax.device_put(array, self.device)

    def keras_step(self, layer, mode, x, w, kwargs, post=None):
        jax = self.jax
        import jax.numpy as jnp

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]
        training = mode == "train"

        def forward(trainable, x, kwargs):
            y, _ = layer.stateless_call(
                trainable, non_trainable, x, training=training, **kwargs
            )
            return y if post is None else post(y)

        if mode == "infer":
            step = jax.jit(forward)
            return lambda: step(trainable, x, kwargs)

        def loss_fn(x, trainable, kwargs):
            y = forward(trainable, x, kwargs)
            return jnp.sum(y * w), y

        grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)

        @jax.jit
        def step(x, trainable, kwargs):
            (_, y), (gx, gw) = grad_fn(x, trainable, kwargs)
            return y, [gx] + list(gw)

        return lambda: step(x, trainable, kwargs)

    @contextlib.contextmanager
    def fresh_compilation(self):
        """Nothing compiled before is reused inside: JAX's in-memory caches
        (traces, lowerings, executables; keyed by function identity and
        shapes) are cleared first. A step's own `jax.jit` is new anyway
        (`keras_step` makes one per call)."""
        self.jax.clear_caches()
        yield

    def fresh_description(self):
        return "new layers and a new jax.jit per call, after jax.clear_caches()"

    def block(self, result):
        self.jax.block_until_ready(result)

    def payload(self, result):
        return result

    def numpy(self, tensor):
        return np.asarray(tensor)

    def describe_device(self):
        if self.device.platform == "cpu":
            return "cpu"
        return f"{self.device.platform}: {self.device.device_kind}"

    def versions(self):
        import jaxlib

        return {
            "jax": self.jax.__version__,
            "jaxlib": jaxlib.__version__,
            "jax_devices": [
                f"{d.platform}: {d.device_kind}" for d in self.jax.devices()
            ],
        }

    def profile(self, step):
        from maskedrnn.bench import kernels

        return kernels.profile_jax(step, self.block, self.gpu)
