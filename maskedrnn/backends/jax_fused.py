"""The JAX backend's fused LSTM: every direction of a masked batch in one call.

On a GPU, `jax.experimental.rnn.lstm` over valid-first data is the whole
masked layer, both directions in one call with exact final states
(docs/design.md, "Kernels, one per backend"). Every row runs all steps, as
in Keras' unmasked call: a flag column appended to the inputs saturates the
input gate to 0 and the forget gate to 1 over each row's padded tail, so the
forward direction's `c` is held there (its `h` is read at the last valid
step) and the backward direction, which reads the tail first, keeps its zero
state until its first valid step. cuDNN's per-row `seq_lengths` would do the
same but take its variable-length path, whose backward pass launches many
more, smaller kernels; it still runs a backward direction given an initial
state, which the tail would not keep. The call is float32 only, so float16
and bfloat16 are computed in float32; `use_cudnn=False` runs JAX's reference
`lstm_ref` on any device.
"""

import contextlib

import jax
import jax.numpy as jnp
import keras
from jax.experimental import rnn as jax_rnn

NAME = "jax-fused-lstm"

DTYPES = ("float32", "float16", "bfloat16")

# The flag's weight: dwarfs any |x @ W_ih + h @ W_hh + b| in float32, so the
# saturated gates are exactly 0 and 1 (their derivatives exactly 0).
_SATURATION = 1e15
# Input widths that are multiples of this keep cuDNN's tensor cores.
ALIGN = 8

_TANH = (keras.activations.tanh, keras.ops.tanh, jnp.tanh)
_SIGMOID = (keras.activations.sigmoid, keras.ops.sigmoid, jax.nn.sigmoid)


def pack_weights(weights):
    """Keras LSTM weights as the flat float32 vector cuDNN reads.

    Both gate orders are i, f, g, o: the matrices are transposed, Keras'
    one bias is `b_ih` and `b_hh` is zero; gradients reach the variables.

    Args:
        weights: One (forward) or two (forward, backward) `(kernel,
            recurrent_kernel, bias)` tuples of a Keras `LSTMCell`, shapes
            `(features, 4 * units)`, `(units, 4 * units)`, `(4 * units,)`;
            `bias` may be None.

    Returns:
        A float32 vector of `jax.experimental.rnn.get_num_params_in_lstm(
        features, units, 1, len(weights) == 2)` values.

    Example:

    ```python
    cell = keras.layers.LSTM(8).cell  # built
    flat = pack_weights([(cell.kernel, cell.recurrent_kernel, cell.bias)])
    ```
    """
    _check_weights(weights)
    matrices, biases = [], []
    for kernel, recurrent_kernel, bias in weights:
        kernel = _float32(kernel)
        recurrent_kernel = _float32(recurrent_kernel)
        units = recurrent_kernel.shape[0]
        matrices += [kernel.T.ravel(), recurrent_kernel.T.ravel()]
        zeros = jnp.zeros((4 * units,), jnp.float32)
        biases += [zeros if bias is None else _float32(bias).ravel(), zeros]
    return jnp.concatenate(matrices + biases)


def _check_weights(weights):
    """Raises unless `weights` are one or two Keras LSTM weight tuples."""
    if len(weights) not in (1, 2):
        raise ValueError(
            "weights must hold one (forward) or two (forward, backward) "
            f"(kernel, recurrent_kernel, bias) tuples; got {len(weights)}."
        )
    for kernel, recurrent_kernel, _ in weights:
        kernel_shape = tuple(kernel.shape)
        recurrent_shape = tuple(recurrent_kernel.shape)
        units = recurrent_shape[0]
        if recurrent_shape != (units, 4 * units) or kernel_shape[1:] != (4 * units,):
            raise ValueError(
                "weights must be a Keras LSTM's kernel (features, 4 * units) "
                "and recurrent_kernel (units, 4 * units); got shapes "
                f"{kernel_shape} and {recurrent_shape}."
            )


def cell_weights(inner):
    """`(kernel, recurrent_kernel, bias)` variables of a built Keras `LSTM`."""
    cell = inner.cell
    return cell.kernel, cell.recurrent_kernel, cell.bias


def lstm(x, lengths, weights, initial_state=None, use_cudnn=None, precision=None):
    """A masked LSTM, one or both directions, in one cuDNN call.

    Args:
        x: Float tensor `(batch, time, features)`, valid-first.
        lengths: Integer tensor `(batch,)`, clipped to `[0, time]`.
        weights: One or two `(kernel, recurrent_kernel, bias)` tuples, as
            `pack_weights`; two runs both directions.
        initial_state: None (zeros), or a list per direction of `[h, c]`,
            each `(batch, units)`.
        use_cudnn: True: cuDNN (a GPU only); False: JAX's `lstm_ref` (any
            device); None: cuDNN where `cudnn_present()`.
        precision: Matmul precision: None (JAX's default; cuDNN may use
            TF32), `"highest"`, `"high"` (TF32), or a `jax.lax.Precision`
            other than DEFAULT.

    Returns:
        `(outputs, states)`: outputs `(batch, time, directions * units)` in
        `x`'s dtype, forward first, as Keras' masked `Bidirectional` in
        valid-first order, zeros at padded steps; states, a list per
        direction of `[h, c]` `(batch, units)` after each row's last valid
        step in that direction, the initial state for a row of length 0.

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
    _check_weights(weights)
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
    hold = directions == 1 or initial_state is None
    if hold:
        # Every row runs every step; the flag holds the state over the tail.
        flag = jnp.logical_not(valid)[..., None].astype(jnp.float32)
        extra = -(features + 1) % ALIGN
        x = jnp.concatenate([x, flag, jnp.zeros((batch, time, extra))], axis=2)
        flat = pack_weights([_with_flag_rows(w, extra) for w in weights])
        seq_lengths = jnp.full((batch,), time, jnp.int32)
    else:
        flat = pack_weights(weights)
        # cuDNN fails on rows of length 0: they run one step, put back below.
        seq_lengths = jnp.maximum(lengths, 1)
    precision = _precision(precision)
    kwargs = dict(
        input_size=x.shape[2],
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
            flat, x.shape[2], units, 1, directions == 2
        )
        with _matmul_precision(precision):
            y, h, c = jax_rnn.lstm_ref(
                x, h0, c0, w_ih, w_hh, b_ih, b_hh, seq_lengths, **kwargs
            )
    y = jnp.where(valid[..., None], y, 0.0)
    if hold:
        # The forward h after the last valid step is that step's output (the
        # kernel's own h ran on over the tail); c was held, as was the whole
        # backward state before the first valid step it reads.
        last = jnp.maximum(lengths - 1, 0)
        h_forward = jnp.take_along_axis(y[..., :units], last[:, None, None], axis=1)
        h = h.at[0].set(h_forward[:, 0])
    ran = (lengths > 0)[None, :, None]
    states = _states(jnp.where(ran, h, h0), jnp.where(ran, c, c0), dtype)
    return y.astype(dtype), states


def _with_flag_rows(weights, extra):
    """`(kernel, recurrent_kernel, bias)` with the flag's row and `extra`
    zero rows appended to the kernel: the flag drives the input gate to 0
    and the forget gate to 1 (gate order i, f, g, o)."""
    kernel, recurrent_kernel, bias = weights
    kernel = _float32(kernel)
    units = kernel.shape[1] // 4
    flag = jnp.concatenate(
        [
            jnp.full((units,), -_SATURATION),
            jnp.full((units,), _SATURATION),
            jnp.zeros((2 * units,)),
        ]
    ).astype(jnp.float32)
    rows = jnp.concatenate([flag[None], jnp.zeros((extra, 4 * units))], axis=0)
    return jnp.concatenate([kernel, rows], axis=0), recurrent_kernel, bias


def _states(h, c, dtype):
    """`[[h, c]]` per direction from `(directions, batch, units)` stacks."""
    return [[h[d].astype(dtype), c[d].astype(dtype)] for d in range(h.shape[0])]


def _float32(value):
    """A JAX float32 array of a tensor, array or Keras variable."""
    return jnp.asarray(keras.ops.convert_to_tensor(value)).astype(jnp.float32)


def _precision(precision):
    """`precision` as a `jax.lax.Precision`; DEFAULT (bfloat16) raises."""
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
    """A `jax.default_matmul_precision` block, or none for None."""
    if precision is None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(precision.name.lower())


def cudnn_present():
    """True when JAX's default device is a CUDA GPU."""
    device = jax.devices()[0]
    if device.platform not in ("gpu", "cuda"):
        return False
    return "rocm" not in str(getattr(device.client, "platform_version", "")).lower()


def equations_reason(inner):
    """None when this kernel computes `inner`'s equations, else why not."""
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


def decline_reason(inner):
    """None when `lstm` runs cuDNN for `inner` here, else why not."""
    reason = equations_reason(inner)
    if reason is not None:
        return reason
    if not cudnn_present():
        return "no CUDA GPU: jax.experimental.rnn.lstm runs cuDNN only"
    return None


def available(inner):
    """True when `lstm` runs cuDNN for the Keras RNN `inner` here."""
    return decline_reason(inner) is None
