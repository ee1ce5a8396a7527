"""The JAX backend's fused LSTM: every direction of a masked batch in one call.

On a JAX GPU, `jax.experimental.rnn.lstm` runs cuDNN's LSTM over a batch
with per-row `seq_lengths`. On *valid-first* data (each row's valid steps
first, a padded tail after them; `maskedrnn.steps.Steps`) that one call is
the whole masked layer: cuDNN runs each row to its own length, reads the
backward direction from each row's own last valid step (it reverses each
row by its length, so no reversal gathers are needed), and returns each
row's exact final `h` and `c` (no cell-state recomputation). `lstm` wraps
that call, `pack_weights` lays Keras' weights out as it reads them, and
`why_not` says when the kernel computes a Keras layer's equations here.

Decisions:

- cuDNN fails on rows of length 0 (jax-ml/jax#17966): every row runs at
  least one step (`seq_lengths` clamped to 1) and such a row's outputs and
  final states are put back afterwards (zeros, the initial state) with a
  `where`, through which no gradient reaches the step it ran.
- `use_cudnn=False` runs `jax.experimental.rnn.lstm_ref`, JAX's reference of
  the same call (a `lax.scan` that handles ragged lengths), on any device:
  the kernel is tested on a CPU that way. It is a reference, not a fast
  path: on a CPU Keras' masked loop stays the default
  (`maskedrnn.backends.jax`).
- Mixed precision: the cuDNN call is float32 only (JAX documents no other
  dtype, and its lowering rejects float16 and bfloat16 outputs), so float16
  and bfloat16 inputs are computed in float32 and the results cast back to
  the input's dtype: the float32 results rounded once, close to Keras' own
  masked loop under the same policy (which steps in float16 / bfloat16).
  float64 does not run here (`why_not`): Keras' masked loop keeps it.
- A JAX GPU GRU has no cuDNN kernel (`jax.experimental.rnn` has an LSTM
  only): a masked GRU runs Keras' masked loop there (`why_not`).
"""

import contextlib

import jax
import jax.numpy as jnp
import keras
from jax.experimental import rnn as jax_rnn

NAME = "jax-fused-lstm"

# The compute dtypes the kernel serves (computed in float32, see above).
DTYPES = ("float32", "float16", "bfloat16")

_TANH = (keras.activations.tanh, keras.ops.tanh, jnp.tanh)
_SIGMOID = (keras.activations.sigmoid, keras.ops.sigmoid, jax.nn.sigmoid)


def pack_weights(weights):
    """Keras LSTM weights as the flat float32 vector cuDNN reads.

    The layout of `jax.experimental.rnn` (`unpack_lstm_weights`): each
    direction's `W_ih` `(4 * units, features)` and `W_hh` `(4 * units,
    units)`, forward then backward, then each direction's `b_ih` and `b_hh`
    `(4 * units,)`. `W_ih` is Keras' `kernel` transposed and `W_hh` its
    `recurrent_kernel` transposed (cuDNN's gate order i, f, g, o is Keras'
    i, f, c, o); Keras' one bias is `b_ih`, `b_hh` is zeros. Built with
    `jax.numpy` ops, so gradients reach the Keras variables.

    Args:
        weights: A sequence of one (forward) or two (forward, backward)
            `(kernel, recurrent_kernel, bias)` tuples of a Keras
            `LSTMCell`: `kernel` `(features, 4 * units)`,
            `recurrent_kernel` `(units, 4 * units)`, `bias` `(4 * units,)`
            or None (zeros). Tensors, arrays or Keras variables.

    Returns:
        A float32 vector of `jax.experimental.rnn.get_num_params_in_lstm(
        features, units, 1, len(weights) == 2)` values.

    Example:

    ```python
    cell = keras.layers.LSTM(8).cell  # built
    flat = pack_weights([(cell.kernel, cell.recurrent_kernel, cell.bias)])
    ```
    """
    if len(weights) not in (1, 2):
        raise ValueError(
            "weights must hold one (forward) or two (forward, backward) "
            f"(kernel, recurrent_kernel, bias) tuples; got {len(weights)}."
        )
    matrices, biases = [], []
    for kernel, recurrent_kernel, bias in weights:
        kernel = _float32(kernel)
        recurrent_kernel = _float32(recurrent_kernel)
        units = recurrent_kernel.shape[0]
        if recurrent_kernel.shape != (units, 4 * units) or kernel.shape[1:] != (
            4 * units,
        ):
            raise ValueError(
                "weights must be a Keras LSTM's kernel (features, 4 * units) "
                "and recurrent_kernel (units, 4 * units); got shapes "
                f"{kernel.shape} and {recurrent_kernel.shape}."
            )
        matrices += [kernel.T.ravel(), recurrent_kernel.T.ravel()]
        zeros = jnp.zeros((4 * units,), jnp.float32)
        biases += [zeros if bias is None else _float32(bias).ravel(), zeros]
    return jnp.concatenate(matrices + biases)


def cell_weights(inner):
    """`(kernel, recurrent_kernel, bias)` of a built Keras `LSTM`, the Keras
    variables themselves (so a layer's `stateless_call` and gradients see
    them), for `lstm` and `pack_weights`."""
    cell = inner.cell
    return cell.kernel, cell.recurrent_kernel, cell.bias


def lstm(x, lengths, weights, initial_state=None, use_cudnn=None, precision=None):
    """A masked LSTM, one or both directions, in one cuDNN call.

    Each row's padded tail is never read (zeroed here) and never steps.

    Args:
        x: Float tensor `(batch, time, features)`, valid-first: row `b`'s
            valid steps are `x[b, :lengths[b]]`, in order.
        lengths: Integer tensor `(batch,)`, each row's number of valid
            steps, in `[0, time]` (the layers check them; values outside
            are clipped to it).
        weights: One (forward) or two (forward, backward) `(kernel,
            recurrent_kernel, bias)` tuples of Keras `LSTMCell`s (see
            `pack_weights`); two runs the bidirectional call.
        initial_state: None (zeros), or a list per direction of `[h, c]`,
            each `(batch, units)`.
        use_cudnn: True: `jax.experimental.rnn.lstm` (cuDNN, a GPU only);
            False: `jax.experimental.rnn.lstm_ref` (any device, for tests);
            None: cuDNN where `cudnn_present()`.
        precision: The matmul precision: None (JAX's
            `jax_default_matmul_precision`; cuDNN may then use TF32),
            `"highest"` (float32, no TF32), `"high"` (TF32), or a
            `jax.lax.Precision` (not DEFAULT: cuDNN has no bfloat16
            matmuls). Passed to the cuDNN call; `lstm_ref` runs under
            `jax.default_matmul_precision` of it.

    Returns:
        `(outputs, states)`. `outputs`: `(batch, time, directions * units)`
        in `x`'s dtype, the forward direction's first: at valid step `t`
        the forward output after steps `0..t` and the backward output after
        steps `lengths - 1` down to `t` (Keras' `Bidirectional` with a
        mask, read in valid-first order); zeros at padded steps and for a
        row of length 0. `states`: a list per direction of `[h, c]`, each
        `(batch, units)` in `x`'s dtype: the state after the row's last
        valid step in that direction's reading (step `lengths - 1` forward,
        step 0 backward), or the initial state for a row of length 0.

    Example:

    ```python
    layer = keras.layers.LSTM(8)
    layer.build((None, None, 4))
    cell = layer.cell
    y, [[h, c]] = lstm(
        x, lengths, [(cell.kernel, cell.recurrent_kernel, cell.bias)],
        use_cudnn=False,
    )
    ```
    """
    directions = len(weights)
    flat = pack_weights(weights)
    if x.ndim != 3:
        raise ValueError(f"x must be (batch, time, features); got shape {x.shape}.")
    dtype = x.dtype
    batch, time, features = x.shape
    units = weights[0][1].shape[0]
    if jnp.dtype(dtype) not in [jnp.dtype(d) for d in DTYPES]:
        raise ValueError(
            f"x must be float32, float16 or bfloat16 (computed in float32); "
            f"got {dtype}. Run float64 through Keras' masked loop."
        )
    if use_cudnn is None:
        use_cudnn = cudnn_present()
    elif use_cudnn and not cudnn_present():
        raise ValueError(
            "use_cudnn=True needs a CUDA GPU (jax.experimental.rnn.lstm runs "
            f"cuDNN only); JAX's device here is {jax.devices()[0].platform!r}. "
            "Pass use_cudnn=False (JAX's reference) or None (cuDNN where present)."
        )
    if initial_state is None:
        zeros = jnp.zeros((directions, batch, units), jnp.float32)
        h0 = c0 = zeros
    else:
        if len(initial_state) != directions or any(len(s) != 2 for s in initial_state):
            raise ValueError(
                f"initial_state must hold {directions} [h, c] pair(s), one per "
                f"direction; got {len(initial_state)} entries."
            )
        h0 = jnp.stack([_float32(h) for h, _ in initial_state])
        c0 = jnp.stack([_float32(c) for _, c in initial_state])
    if batch == 0 or time == 0:
        # Nothing steps (cuDNN rejects empty shapes): zeros, initial states.
        y = jnp.zeros((batch, time, directions * units), dtype)
        return y, _states(h0, c0, dtype)
    lengths = jnp.clip(jnp.asarray(lengths).astype(jnp.int32), 0, time)
    valid = jnp.arange(time, dtype=jnp.int32)[None, :] < lengths[:, None]
    x = jnp.where(valid[..., None], _float32(x), 0.0)
    seq_lengths = jnp.maximum(lengths, 1)
    precision = _precision(precision)
    kwargs = dict(
        input_size=features,
        hidden_size=units,
        num_layers=1,
        dropout=0.0,
        bidirectional=directions == 2,
    )
    if use_cudnn:
        y, h, c = jax_rnn.lstm(
            x, h0, c0, flat, seq_lengths, precision=precision, **kwargs
        )
    else:
        w_ih, w_hh, b_ih, b_hh = jax_rnn.unpack_lstm_weights(
            flat, features, units, 1, directions == 2
        )
        with _matmul_precision(precision):
            y, h, c = jax_rnn.lstm_ref(
                x, h0, c0, w_ih, w_hh, b_ih, b_hh, seq_lengths, **kwargs
            )
    y = jnp.where(valid[..., None], y, 0.0).astype(dtype)
    ran = (lengths > 0)[None, :, None]
    return y, _states(jnp.where(ran, h, h0), jnp.where(ran, c, c0), dtype)


def _states(h, c, dtype):
    """`[[h, c]]` per direction from `(directions, batch, units)` stacks."""
    return [[h[d].astype(dtype), c[d].astype(dtype)] for d in range(h.shape[0])]


def _float32(value):
    """A JAX float32 array of a tensor, array or Keras variable."""
    return jnp.asarray(keras.ops.convert_to_tensor(value)).astype(jnp.float32)


def _precision(precision):
    """`precision` as a `jax.lax.Precision` (None stays None).

    Raises:
        ValueError: for an unknown one, or DEFAULT (bfloat16 matmuls, which
            the cuDNN call does not implement).
    """
    if precision is None:
        return None
    if isinstance(precision, (tuple, list)):
        precision = precision[0]
    try:
        precision = jax.lax.Precision(precision)
    except ValueError:
        raise ValueError(
            "precision must be None, 'high', 'highest' or a jax.lax.Precision; "
            f"got {precision!r}."
        ) from None
    if precision == jax.lax.Precision.DEFAULT:
        raise ValueError(
            "precision DEFAULT (bfloat16 matmuls) is not implemented by the "
            "cuDNN LSTM; pass 'high' (TF32) or 'highest' (float32)."
        )
    return precision


def _matmul_precision(precision):
    """A `jax.default_matmul_precision` block for a `jax.lax.Precision`
    (None: none)."""
    if precision is None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(precision.name.lower())


def cudnn_present():
    """True when JAX's default device is a CUDA GPU, where
    `jax.experimental.rnn.lstm` runs cuDNN."""
    device = jax.devices()[0]
    if device.platform not in ("gpu", "cuda"):
        return False
    return "rocm" not in str(getattr(device.client, "platform_version", "")).lower()


def equations_why(inner):
    """None when this kernel computes the equations of the Keras RNN
    `inner` (so it may stand in for it, on any device with
    `use_cudnn=False`), else a sentence saying why not.

    Keras' LSTM with tanh and sigmoid activations, a bias, no recurrent
    dropout (input dropout is the caller's: it drops `x` before the call),
    not unrolled, no activity regularizer (applied by Keras' call), and a
    compute dtype in `DTYPES`.
    """
    kind = type(inner)
    if kind is keras.layers.GRU:
        return (
            "jax.experimental.rnn has a cuDNN LSTM only (a GRU runs Keras' "
            "layer)"
        )
    if kind is not keras.layers.LSTM:
        return f"{kind.__name__} is not an LSTM (jax.experimental.rnn has an LSTM only)"
    cell = inner.cell
    if getattr(inner, "use_cudnn", "auto") is False:
        return "the inner layer has use_cudnn=False, which asks for Keras' loop"
    if cell.activation not in _TANH or cell.recurrent_activation not in _SIGMOID:
        return "activation must be tanh and recurrent_activation sigmoid (cuDNN's)"
    if not cell.use_bias:
        return "use_bias=False (Keras' cuDNN paths need a bias)"
    if cell.recurrent_dropout:
        return "recurrent_dropout > 0 (cuDNN has none)"
    if inner.unroll:
        return "unroll=True asks for Keras' unrolled loop"
    if inner.activity_regularizer is not None:
        return "the inner layer has an activity_regularizer (applied by Keras' call)"
    if cell.compute_dtype not in DTYPES:
        return (
            f"compute dtype {cell.compute_dtype}: jax.experimental.rnn's cuDNN "
            "call is float32 (float16 and bfloat16 are computed in float32)"
        )
    return None


def why_not(inner):
    """None when `lstm` runs cuDNN for the Keras RNN `inner` here, else the
    sentence saying why not (`equations_why`, or no CUDA GPU)."""
    why = equations_why(inner)
    if why is not None:
        return why
    if not cudnn_present():
        return "no CUDA GPU: jax.experimental.rnn.lstm runs cuDNN only"
    return None


def available(inner):
    """True when `lstm` runs cuDNN for the Keras RNN `inner` here."""
    return why_not(inner) is None
