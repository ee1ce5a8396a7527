"""The TensorFlow harness: a `tf.function` per step (no XLA).

Each step also returns a scalar that depends on every output (sum of the
outputs, or of the loss and every gradient); reading that scalar with
`.numpy()` waits for the device, so only 4 bytes cross to the host.
"""

import contextlib
import sys

import numpy as np


def gpu_available():
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def set_threads(threads):
    """Sizes TensorFlow's intra/inter-op pools; returns a note for the report.

    Raises SystemExit when TensorFlow already ran an op in this process (it
    cannot resize its pools then).
    """
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError as e:
        raise SystemExit(
            f"--threads {threads}: TensorFlow has already started in this "
            f"process and cannot resize its thread pools ({e}); run the bench "
            "in a fresh process."
        ) from e
    return f"{threads} intra-op and {threads} inter-op threads (--threads)"


def default_threads_note(gpu=False):
    return (
        "TensorFlow's own thread pools (pass --threads 1 on a shared machine: "
        "spinning pools skew the timings)"
    )


class Harness:
    """tf.function per step; syncs by reading a scalar that depends on all."""

    def __init__(self, gpu):
        import tensorflow as tf

        self.tf = tf
        self.gpu = gpu

    def tensor(self, array):
        # tf.identity copies onto the device of the enclosing keras.device.
        return self.tf.identity(self.tf.constant(array))

    def keras_step(self, layer, mode, x, w, kwargs, post=None):
        tf = self.tf
        post = post or (lambda y: y)
        if mode == "infer":

            @tf.function
            def step(x, kwargs):
                y = post(layer(x, training=False, **kwargs))
                return y, tf.reduce_sum(y)

        else:

            @tf.function
            def step(x, kwargs):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = post(layer(x, training=True, **kwargs))
                    loss = tf.reduce_sum(y * w)
                grads = tape.gradient(loss, [x] + layer.trainable_variables)
                token = tf.add_n([loss] + [tf.reduce_sum(g) for g in grads])
                return (y, grads), token

        return lambda: step(x, kwargs)

    def module_functions(self):
        """`(module, name, function)` of every `tf.function` a maskedrnn
        module keeps at module level (traced once per input signature and
        process, not once per step)."""
        found = []
        for module_name, module in sorted(sys.modules.items()):
            if module is None or not module_name.startswith("maskedrnn."):
                continue
            for name, value in sorted(vars(module).items()):
                if isinstance(value, self.tf.types.experimental.PolymorphicFunction):
                    found.append((module, name, value))
        return found

    @contextlib.contextmanager
    def fresh_compilation(self):
        """Nothing traced before is reused inside: the module-level
        `tf.function`s of `module_functions` are swapped for new copies
        (same options) and put back after. A step's own `tf.function` is
        new anyway (`keras_step` makes one per call)."""
        swapped = self.module_functions()
        # New tf.functions of the same Python step, made on purpose: TF's
        # "triggered tf.function retracing" warning would say otherwise.
        logger = self.tf.get_logger()
        level = logger.level
        logger.setLevel("ERROR")
        for module, name, function in swapped:
            # Function._clone: the only way to copy a tf.function with all
            # of its options (reduce_retracing, input_signature, ...).
            setattr(module, name, function._clone(None))
        try:
            yield
        finally:
            logger.setLevel(level)
            for module, name, function in swapped:
                setattr(module, name, function)

    def fresh_description(self):
        names = [f"{m.__name__}.{n}" for m, n, _ in self.module_functions()]
        kept = f" (module-level tf.functions copied anew: {', '.join(names)})"
        return "new layers and a new tf.function per call" + (kept if names else "")

    def block(self, result):
        result[1].numpy()

    def payload(self, result):
        return result[0]

    def numpy(self, tensor):
        return np.asarray(tensor)

    def describe_device(self):
        if not self.gpu:
            return "cpu"
        details = self.tf.config.experimental.get_device_details(
            self.tf.config.list_physical_devices("GPU")[0]
        )
        return f"gpu: {details.get('device_name', 'unknown')}"

    def versions(self):
        return {"tensorflow": self.tf.__version__}

    def profile(self, step):
        from maskedrnn.bench import kernels

        return kernels.no_profiler("tensorflow")
