"""maskedrnn._checks: argument checks that hold inside compiled graphs.

Oracles: numpy (`(lengths < 0) | (lengths > time)`, `np.clip`, `np.where`)
and, for the run-time shape check, the requirement that a mismatch raises
instead of broadcasting.
"""

import numpy as np
import pytest
from keras import ops

from maskedrnn import _checks
from tests.helpers import BACKEND, to_np

LENGTHS = np.array([3, -1, 6, 0, 5, -7], "int32")
TIME = 5


def compiled(fn):
    """`fn` compiled the kernel each backend compiles a Keras step."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    pytest.skip("torch.compile is exercised in test_execution_modes (slow).")


def test_invalid_and_clamped_lengths_match_numpy():
    np.testing.assert_array_equal(
        to_np(_checks.invalid_lengths(LENGTHS, TIME)),
        (LENGTHS < 0) | (LENGTHS > TIME),
    )
    clamped = _checks.clamp_lengths(LENGTHS, TIME)
    np.testing.assert_array_equal(to_np(clamped), np.clip(LENGTHS, 0, TIME))
    assert "int32" in str(clamped.dtype)


def test_invalid_and_clamped_lengths_compiled():
    def fn(lengths, x):
        time = ops.shape(x)[1]
        return _checks.invalid_lengths(lengths, time), _checks.clamp_lengths(
            lengths, time
        )

    bad, clamped = compiled(fn)(LENGTHS, np.zeros((6, TIME, 1), "float32"))
    np.testing.assert_array_equal(to_np(bad), (LENGTHS < 0) | (LENGTHS > TIME))
    np.testing.assert_array_equal(to_np(clamped), np.clip(LENGTHS, 0, TIME))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_poison_rows_matches_numpy(dtype):
    rng = np.random.default_rng(0)
    seq = rng.standard_normal((6, 4, 3)).astype("float32")
    state = rng.standard_normal((6, 3)).astype("float32")
    bad = (LENGTHS < 0) | (LENGTHS > TIME)
    out_seq, out_state = _checks.poison_rows(
        [ops.cast(seq, dtype), ops.cast(state, dtype)], ops.convert_to_tensor(bad)
    )
    for got, x in ((out_seq, seq), (out_state, state)):
        assert dtype in str(got.dtype)
        got = to_np(ops.cast(got, "float32"))
        assert np.all(np.isnan(got[bad]))
        expected = to_np(ops.cast(ops.cast(x, dtype), "float32"))
        np.testing.assert_array_equal(got[~bad], expected[~bad])


def test_poison_rows_keeps_structure_and_rejects_integers():
    bad = ops.convert_to_tensor(np.array([True, False]))
    out = _checks.poison_rows((np.ones((2, 1), "float32"),), bad)
    assert isinstance(out, tuple) and len(out) == 1
    with pytest.raises(TypeError, match="floating"):
        _checks.poison_rows(np.ones((2, 1), "int32"), bad)


@pytest.mark.parametrize("upstream", ["finite", "nan"])
def test_poison_rows_gradient_is_zero_on_bad_rows_and_finite(upstream):
    """A poisoned row gives a NaN loss but no gradient into it, also when the
    gradient arriving there is NaN (training: the loss of a NaN row is NaN,
    and so is its gradient). Numpy oracle: for loss = sum(f(poison(x))), the
    gradient is where(bad, 0, f'(x)) with f(p) = p * w or p ** 2 / 2 * w."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 3)).astype("float32")
    w = rng.standard_normal((6, 3)).astype("float32")
    bad_np = (LENGTHS < 0) | (LENGTHS > TIME)
    bad = ops.convert_to_tensor(bad_np)

    def loss(xv):
        p = _checks.poison_rows(xv, bad)
        if upstream == "nan":
            p = p * p / 2  # d/dp = p: NaN on bad rows
        return ops.sum(p * ops.convert_to_tensor(w))

    if BACKEND == "tensorflow":
        import tensorflow as tf

        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            value = loss(xt)
        grad = tape.gradient(value, xt).numpy()
    elif BACKEND == "jax":
        import jax

        value, grad = jax.value_and_grad(loss)(x)
    else:
        import torch

        xt = torch.tensor(x, requires_grad=True)
        value = loss(xt)
        (grad,) = torch.autograd.grad(value, xt)
        grad = grad.numpy()
    assert np.isnan(float(to_np(value)))
    slope = w if upstream == "finite" else x * w
    np.testing.assert_allclose(
        np.asarray(grad), np.where(bad_np[:, None], 0, slope), rtol=1e-6
    )


def test_match_leading_dims_static():
    x = np.zeros((3, 5, 2), "float32")
    lengths = np.array([1, 2, 3], "int32")
    np.testing.assert_array_equal(
        to_np(_checks.match_leading_dims(lengths, x, 1, "lengths")), lengths
    )
    with pytest.raises(ValueError, match="lengths has 1 along axis 0 but inputs"):
        _checks.match_leading_dims(lengths[:1], x, 1, "lengths")
    with pytest.raises(ValueError, match="mask has 4 along axis 1"):
        _checks.match_leading_dims(np.ones((3, 4), bool), x, 2, "mask")
    with pytest.raises(ValueError, match="mask must have rank 2"):
        _checks.match_leading_dims(np.ones((3, 5, 1), bool), x, 2, "mask")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="None dims exist only in TF")
@pytest.mark.parametrize("jit_compile", [False, True])
def test_match_leading_dims_unknown_batch_fails_instead_of_broadcasting(
    jit_compile,
):
    """With a `None` batch a 1-row `lengths` would broadcast over the batch
    (silently wrong numbers); the check makes it an error, at run time in a
    graph and at compile time under XLA, and passes matching shapes."""
    import tensorflow as tf

    fn = tf.function(
        lambda x, lengths: _checks.match_leading_dims(lengths, x, 1, "lengths"),
        input_signature=[
            tf.TensorSpec((None, None, 2)),
            tf.TensorSpec((None,), tf.int32),
        ],
        jit_compile=jit_compile,
    )
    x = np.zeros((3, 5, 2), "float32")
    np.testing.assert_array_equal(fn(x, np.array([1, 2, 3], "int32")), [1, 2, 3])
    # In a graph the failing node names the argument; XLA reports the shapes.
    pattern = "Shapes of all inputs must match"
    if not jit_compile:
        pattern = "lengths_must_match_inputs"
    for rows in (1, 2, 4):
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            fn(x, np.arange(rows, dtype="int32"))


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit tracing is JAX only")
def test_match_leading_dims_under_jax_jit_raises_at_trace_time():
    import jax

    fn = jax.jit(lambda x, m: _checks.match_leading_dims(m, x, 2, "mask"))
    with pytest.raises(ValueError, match="mask has 1 along axis 0"):
        fn(np.zeros((3, 5, 2), "float32"), np.ones((1, 5), bool))


class _OnAnAccelerator:
    """A stand-in for a concrete lengths tensor held by a GPU: TensorFlow's
    `device` string, JAX's `devices()`."""

    device = "/job:localhost/replica:0/task:0/device:GPU:0"

    def numpy(self):
        raise AssertionError("read on the host")

    def devices(self):
        class Device:
            platform = "gpu"

        return {Device()}


@pytest.mark.skipif(BACKEND == "torch", reason="torch: tests/test_torch_fused.py")
def test_lengths_on_an_accelerator_are_not_read_on_the_host():
    """`host_readable`: lengths the host holds are read there (the eager
    error); lengths on a GPU are not (a device sync each call): the
    compiled-mode check runs instead."""
    from maskedrnn import backends

    backend = backends.current()
    assert backend.host_readable(ops.convert_to_tensor(np.array([3, 1], "int32")))
    assert not backend.host_readable(_OnAnAccelerator())
