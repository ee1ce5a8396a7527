"""The TensorFlow harness: a `tf.function` per step (no XLA).

Each step also returns a scalar that depends on every output (sum of the
outputs, or of the loss and every gradient); reading that scalar with
`.numpy()` waits for the device, so only 4 bytes cross to the host.
"""

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
