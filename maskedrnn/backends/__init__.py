"""Every backend-specific decision and kernel, one module per backend.

As Keras' `keras/src/backend/<name>/rnn.py`, `tensorflow.py`, `jax.py` and
`torch.py` define the same functions, and the layers ask the current
backend's module (`current()`) instead of testing the backend's name:

- `options(inner, where, want_states)`: the kernels it can run one masked
  direction, best first, each with what stops it here (`None`, or a `Reason`:
  blocking when the kernel cannot run, a preference when it can but another
  is preferred);
- `describe(kernel, inner, want_states, options)`: the `kernel_info()` sentence;
- `run(kernel, inner, x, initial_state, training, steps, want_states)`: one
  direction on valid-first data;
- `layout(steps)`, `run_direction(...)`: PyTorch's kernels straight from
  the caller's order (torch only);
- `ONE_CALL_KERNELS`, `run_one_call(kernel, inners, x, steps, initial_states,
  want_states)`, `one_call_reason(inners)`: every direction of a call in one
  kernel call, no input dropout (torch and JAX; `ONE_CALL_KERNELS = ()`
  elsewhere);
- `IN_PLACE_KERNELS`, `run_one_call_in_place(kernel, inners, x, steps,
  initial_states, dropout_masks, want_states, place)`: the one-call kernels
  that read the caller's order, each direction's inputs times its own input
  dropout mask, and place their outputs themselves (JAX's tiers; `()`
  elsewhere);
- `is_concrete`, `host_readable`, `scalar`, `invert_permutation`,
  `gather_time`, `has_fused_rnn_kernel`: backend pieces of the ops and
  checks.

A call computes one `Plan` (`plan()`): the kernel of each direction (one of
`KERNELS`) and the strategy of the call (one of `STRATEGIES`); docs/design.md
describes each. `force(kernel)` makes a block run one kernel on purpose,
`record()` collects the plans a block made, and `portable()` keeps a block
to kernels every exporter converts.
"""

import contextlib
import contextvars
import importlib
import warnings

import keras

KERNELS = (
    "torch-packed",
    "torch-unpacked",
    "torch-fused",
    "jax-fused",
    "jax-tiers",
    "tf-block-lstm",
    "tf-tiers",
    "keras-unmasked",
    "keras-masked",
)
STRATEGIES = ("caller_order", "masked_loop", "one_call", "valid_first")
# PyTorch's caller's-order kernels (the plan's "caller_order" strategy).
_CALLER_ORDER_KERNELS = ("torch-packed", "torch-unpacked")

# Former names (before 0.3.0), kept one release with a DeprecationWarning.
_FORMER_STRATEGY_NAMES = {"caller_order": "torch", "one_call": "fused"}
_FORMER_CONSTANTS = {
    "WAYS": "KERNELS",
    "FUSED_WAYS": "ONE_CALL_KERNELS",
    "ROUTES": "STRATEGIES",
}

_KNOWN = ("tensorflow", "jax", "torch")
_FORCED = contextvars.ContextVar("maskedrnn_forced_kernel", default=None)
_RECORDS = contextvars.ContextVar("maskedrnn_plan_records", default=())
_PORTABLE = contextvars.ContextVar("maskedrnn_portable", default=False)
_DIRECTIONS = contextvars.ContextVar("maskedrnn_directions", default=1)
_MODULES = {}


def _deprecated(old, new):
    warnings.warn(
        f"maskedrnn.backends: {old} is deprecated; use {new}.",
        DeprecationWarning,
        stacklevel=3,
    )


def __getattr__(attr):
    if attr in _FORMER_CONSTANTS:
        _deprecated(attr, _FORMER_CONSTANTS[attr])
        if attr == "ROUTES":
            return tuple(_FORMER_STRATEGY_NAMES.get(s, s) for s in STRATEGIES)
        if attr == "FUSED_WAYS":
            return current().ONE_CALL_KERNELS
        return KERNELS
    raise AttributeError(f"module 'maskedrnn.backends' has no attribute {attr!r}")


def name():
    """The name of the Keras backend in use (`keras.backend.backend()`)."""
    return keras.backend.backend()


def current():
    """The module of this package for the Keras backend in use.

    Raises:
        NotImplementedError: for a backend maskedrnn does not support.
    """
    backend = keras.backend.backend()
    module = _MODULES.get(backend)
    if module is None:
        if backend not in _KNOWN:
            raise NotImplementedError(
                f"maskedrnn has no code for the {backend!r} backend; use "
                "tensorflow, jax or torch."
            )
        module = importlib.import_module(f"maskedrnn.backends.{backend}")
        _MODULES[backend] = module
    return module


class Declined(ValueError):
    """A forced kernel (`force`) that the backend cannot run for this layer here."""


class Reason:
    """Why a kernel does not run: a sentence built only when asked for.

    Args:
        text: A string, or a function of no arguments returning one.
        blocking: Bool: True when the kernel cannot run (forcing it
            raises `Declined`), False when it can but another is preferred.
            Defaults to `True`.
    """

    __slots__ = ("_text", "blocking")

    def __init__(self, text, blocking=True):
        self._text = text
        self.blocking = blocking

    def __str__(self):
        return self._text() if callable(self._text) else self._text


def preference(text):
    """A `Reason` that does not stop a forced kernel: the kernel runs, but another is
    preferred here."""
    return Reason(text, blocking=False)


@contextlib.contextmanager
def force(kernel=None, *, way=None):
    """Makes every plan made in the block run each direction `kernel`.

    For tests and comparisons: the parity tests run every kernel a backend
    offers against Keras' masked layer. `None` restores the default choice.
    A layer called in the block whose backend cannot run `kernel` for it (a
    blocking `Reason`) raises `Declined` saying why.

    Args:
        kernel: One of `KERNELS`, or None.
        way: Deprecated spelling of `kernel`.

    Example:

    ```python
    layer = maskedrnn.MaskedRNN(keras.layers.GRU(8))
    with maskedrnn.backends.force("keras-masked"):
        y = layer(x, mask=mask)  # Keras' masked loop on every backend
    ```
    """
    if way is not None:
        _deprecated("force(way=...)", "force(kernel=...)")
        kernel = way
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or None; got {kernel!r}.")
    token = _FORCED.set(kernel)
    try:
        yield
    finally:
        _FORCED.reset(token)


@contextlib.contextmanager
def portable():
    """Makes the plans made in the block use only kernels that export anywhere.

    For exports read by converters that know only the ops of Keras' own
    layers: LiteRT's built-in ops and tf2onnx have no
    `tf.raw_ops.BlockLSTMV2`, so in the block an LSTM on TensorFlow runs
    Keras' layer (`"keras-unmasked"` or `"keras-masked"`) instead of
    `"tf-block-lstm"`. `maskedrnn.export.export_litert` traces the model in
    this block, and whatever Keras' exporter (`model.export`) traces runs
    as in it by itself. The other
    backends have only portable kernels: the block changes nothing there.

    Example:

    ```python
    with maskedrnn.backends.portable():
        tf.saved_model.save(model, "served")  # Keras' own LSTM in the graph
    ```
    """
    token = _PORTABLE.set(True)
    try:
        yield
    finally:
        _PORTABLE.reset(token)


@contextlib.contextmanager
def running_directions(count):
    """Tells the kernels called in the block that one layer call runs
    `count` directions with them, one after another.

    A kernel whose traced graphs serve several of its calls (TensorFlow's
    step loops) shares them only where they run more than once: a graph
    called once costs more than the same ops traced in place.
    """
    token = _DIRECTIONS.set(count)
    try:
        yield
    finally:
        _DIRECTIONS.reset(token)


def directions_in_call():
    """The `count` of the innermost `running_directions` block (1 outside)."""
    return _DIRECTIONS.get()


def portable_only():
    """True inside a `portable()` block."""
    return _PORTABLE.get()


def forced():
    """The kernel `force` set for the current block, or None."""
    return _FORCED.get()


@contextlib.contextmanager
def record():
    """Collects every `Plan` made in the block, in order.

    One plan per call of a masked layer (a traced function records the
    plans of its tracing, once per compilation). Blocks nest: each one
    collects every plan made inside it.

    Yields:
        A list, filled as the block runs, of `Plan`s.

    Example:

    ```python
    with maskedrnn.backends.record() as plans:
        model.predict(x)
    for p in plans:
        print(p.strategy, p.info())  # which kernel ran each direction, and why
    ```
    """
    plans = []
    token = _RECORDS.set(_RECORDS.get() + (plans,))
    try:
        yield plans
    finally:
        _RECORDS.reset(token)


class Direction:
    """How one direction of a call runs: `key` (`"forward"`, `"backward"` or
    `"layer"`), the `inner` RNN, the chosen `kernel`, and the backend's
    `options` it was chosen from (for `sentence()`)."""

    __slots__ = ("key", "inner", "kernel", "options", "want_states", "forced")

    def __init__(self, key, inner, kernel, options, want_states, forced):
        self.key = key
        self.inner = inner
        self.kernel = kernel
        self.options = options
        self.want_states = want_states
        self.forced = forced

    @property
    def caller_order(self):
        """True when the kernel is one of PyTorch's caller's-order kernels
        (`"torch-packed"`, `"torch-unpacked"`: the plan's
        `"caller_order"` strategy)."""
        return self.kernel in _CALLER_ORDER_KERNELS

    @property
    def one_call(self):
        """True when the kernel is one of the backend's one-call kernels
        (`ONE_CALL_KERNELS`: the plan's `"one_call"` strategy)."""
        return self.kernel in current().ONE_CALL_KERNELS

    @property
    def way(self):
        """Deprecated: `kernel`."""
        _deprecated("Direction.way", "Direction.kernel")
        return self.kernel

    def sentence(self):
        """The sentence `kernel_info()` reports: what runs, and why."""
        text = current().describe(
            self.kernel, self.inner, self.want_states, self.options
        )
        if self.forced:
            text = f"forced by maskedrnn.backends.force({self.kernel!r}): {text}"
        return text


class Plan:
    """How one call of a masked layer runs, computed once per call.

    Attributes:
        directions: Tuple of `Direction`, one per inner RNN.
        strategy: `"caller_order"`, `"masked_loop"`, `"one_call"` or `"valid_first"`
            (see the module docstring).
    """

    __slots__ = ("directions", "strategy")

    def __init__(self, directions, strategy):
        self.directions = directions
        self.strategy = strategy

    def kernel(self, index=0):
        """The kernel of direction `index`."""
        return self.directions[index].kernel

    def way(self, index=0):
        """Deprecated: `kernel(index)`."""
        _deprecated("Plan.way()", "Plan.kernel()")
        return self.kernel(index)

    @property
    def route(self):
        """Deprecated: `strategy`, under its former names (`"torch"` for
        `"caller_order"`, `"fused"` for `"one_call"`)."""
        _deprecated("Plan.route", "Plan.strategy")
        return _FORMER_STRATEGY_NAMES.get(self.strategy, self.strategy)

    @property
    def unmasked(self):
        """True when no inner RNN is handed a mask (`uses_fast_path`)."""
        return all(d.kernel != "keras-masked" for d in self.directions)

    def info(self):
        """`{key: sentence}` for each direction (`kernel_info()`)."""
        return {d.key: d.sentence() for d in self.directions}


def _choose(options, kernel):
    """The kernel to run from `options`: the first unhindered one, or `kernel`
    (forced) unless a blocking `Reason` stops it."""
    if kernel is None:
        for option, reason in options:
            if reason is None:
                return option
        raise AssertionError("a backend offered no kernel to run")  # pragma: no cover
    for option, reason in options:
        if option == kernel:
            if reason is not None and reason.blocking:
                raise Declined(f"{kernel!r} cannot run here: {reason}")
            return kernel
    raise Declined(f"the {name()} backend has no {kernel!r} kernel")


def plan(inners, where, want_states, masked=True, training=None):
    """The `Plan` of one call.

    Args:
        inners: Dict `{key: inner RNN}` in direction order.
        where: A tensor or variable whose device decides (torch), or None
            for the default device.
        want_states: Bool, whether the caller returns the final states.
        masked: Bool, whether the call has a mask or lengths (else every
            step is valid and the strategy is `"one_call"` or `"valid_first"`).
            Defaults to `True`.
        training: The call's `training`. With input dropout while training,
            two directions run one at a time on valid-first data, each on
            its own dropped inputs (one kernel call, or one read of the
            caller's order, would give both one input), unless their kernel
            is one of `IN_PLACE_KERNELS`, which take each direction's
            dropout mask; one direction keeps its kernel's strategy, its
            inputs dropped first.

    Returns:
        A `Plan`.
    """
    backend = current()
    kernel = _FORCED.get()
    directions = []
    joint = (
        backend.one_call_reason(list(inners.values()))
        if backend.ONE_CALL_KERNELS
        else None
    )
    for key, inner in inners.items():
        options = backend.options(inner, where, want_states)
        if joint is not None:
            # The directions cannot share one call: its kernels are declined.
            options = [
                (option, joint if option in backend.ONE_CALL_KERNELS else reason)
                for option, reason in options
            ]
        chosen = _choose(options, kernel)
        directions.append(
            Direction(key, inner, chosen, options, want_states, kernel is not None)
        )
    directions = tuple(directions)
    strategy = "valid_first"
    dropout = (
        training
        and len(directions) > 1
        and any(getattr(d.inner.cell, "dropout", 0) for d in directions)
    )
    in_place = all(d.kernel in backend.IN_PLACE_KERNELS for d in directions)
    if all(d.one_call for d in directions) and (in_place or not dropout):
        strategy = "one_call"
    elif masked:
        if all(d.caller_order for d in directions) and not dropout:
            strategy = "caller_order"
        elif all(d.kernel == "keras-masked" for d in directions):
            strategy = "masked_loop"
    made = Plan(directions, strategy)
    for plans in _RECORDS.get():
        plans.append(made)
    return made
