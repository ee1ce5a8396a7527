"""Every backend-specific decision and kernel, one module per backend.

As Keras' `keras/src/backend/<name>/rnn.py`, `tensorflow.py`, `jax.py` and
`torch.py` define the same functions, and the layers ask the current
backend's module (`current()`) instead of testing the backend's name:

- `options(inner, where, want_states)`: the ways it can run one masked
  direction, best first, each with what stops it here (`None`, or a `Why`:
  hard when the way cannot run, soft when it can but another is preferred);
- `describe(way, inner, want_states, options)`: the `kernel_info()` sentence;
- `run(way, inner, x, initial_state, training, steps, want_states)`: one
  direction on valid-first data;
- `layout(steps)`, `run_direction(...)`: PyTorch's kernels straight from
  the caller's order (torch only);
- `FUSED_WAYS`, `run_fused(way, inners, x, steps, initial_states, training,
  want_states)`, `fused_why(inners)`: every direction of a call in one
  kernel call (torch and JAX; `FUSED_WAYS = ()` elsewhere);
- `is_concrete`, `host_readable`, `scalar`, `invert_permutation`,
  `take_rows`, `has_fused_rnn_kernel`: backend pieces of the ops and checks.

A call computes one `Plan` (`plan()`): the way of each direction (one of
`WAYS`) and the route of the call (one of `ROUTES`); docs/design.md
describes each. `force(way)` makes a block run one way on purpose,
`record()` collects the plans a block made, and `portable()` keeps a block
to ways every exporter converts.
"""

import contextlib
import contextvars
import importlib

import keras

WAYS = (
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
ROUTES = ("torch", "masked_loop", "fused", "valid_first")
# PyTorch's caller's-order ways (the plan's "torch" route).
_CALLER_ORDER_WAYS = ("torch-packed", "torch-unpacked")

_KNOWN = ("tensorflow", "jax", "torch")
_FORCED = contextvars.ContextVar("maskedrnn_forced_way", default=None)
_RECORDS = contextvars.ContextVar("maskedrnn_plan_records", default=())
_PORTABLE = contextvars.ContextVar("maskedrnn_portable", default=False)
_MODULES = {}


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
    """A forced way (`force`) that the backend cannot run for this layer here."""


class Why:
    """Why a way does not run: a sentence built only when asked for.

    Args:
        text: A string, or a function of no arguments returning one.
        hard: Bool: True when the way cannot run (forcing it raises
            `Declined`), False when it can but another is preferred.
            Defaults to `True`.
    """

    __slots__ = ("_text", "hard")

    def __init__(self, text, hard=True):
        self._text = text
        self.hard = hard

    def __str__(self):
        return self._text() if callable(self._text) else self._text


def soft(text):
    """A `Why` that does not stop a forced way: the way runs, but another is
    preferred here."""
    return Why(text, hard=False)


@contextlib.contextmanager
def force(way):
    """Makes every plan made in the block run each direction `way`.

    For tests and comparisons: the parity tests run every way a backend
    offers against Keras' masked layer. `None` restores the default choice.
    A layer called in the block whose backend cannot run `way` for it (a
    hard `Why`) raises `Declined` saying why.

    Args:
        way: One of `WAYS`, or None.

    Example:

    ```python
    layer = maskedrnn.MaskedRNN(keras.layers.GRU(8))
    with maskedrnn.backends.force("keras-masked"):
        y = layer(x, mask=mask)  # Keras' masked loop on every backend
    ```
    """
    if way is not None and way not in WAYS:
        raise ValueError(f"way must be one of {WAYS} or None; got {way!r}.")
    token = _FORCED.set(way)
    try:
        yield
    finally:
        _FORCED.reset(token)


@contextlib.contextmanager
def portable():
    """Makes the plans made in the block use only ways that export anywhere.

    For exports read by converters that know only the ops of Keras' own
    layers: LiteRT's built-in ops and tf2onnx have no
    `tf.raw_ops.BlockLSTMV2`, so in the block an LSTM on TensorFlow runs
    Keras' layer (`"keras-unmasked"` or `"keras-masked"`) instead of
    `"tf-block-lstm"`. `maskedrnn.export.export_litert` traces the model in
    this block, and whatever Keras' exporter (`model.export`) traces runs
    as in it by itself. The other
    backends have only portable ways: the block changes nothing there.

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


def portable_only():
    """True inside a `portable()` block."""
    return _PORTABLE.get()


def forced():
    """The way `force` set for the current block, or None."""
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
        print(p.route, p.info())  # which way ran each direction, and why
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
    `"layer"`), the `inner` RNN, the chosen `way`, and the backend's
    `options` it was chosen from (for `reason()`)."""

    __slots__ = ("key", "inner", "way", "options", "want_states", "forced")

    def __init__(self, key, inner, way, options, want_states, forced):
        self.key = key
        self.inner = inner
        self.way = way
        self.options = options
        self.want_states = want_states
        self.forced = forced

    @property
    def torch(self):
        """True when the way is one of PyTorch's caller's-order kernels
        (`"torch-packed"`, `"torch-unpacked"`: the plan's `"torch"`
        route)."""
        return self.way in _CALLER_ORDER_WAYS

    @property
    def fused(self):
        """True when the way is one of the backend's one-call ways
        (`FUSED_WAYS`: the plan's `"fused"` route)."""
        return self.way in current().FUSED_WAYS

    def reason(self):
        """The sentence `kernel_info()` reports: what runs, and why."""
        text = current().describe(self.way, self.inner, self.want_states, self.options)
        if self.forced:
            text = f"forced by maskedrnn.backends.force({self.way!r}): {text}"
        return text


class Plan:
    """How one call of a masked layer runs, computed once per call.

    Attributes:
        directions: Tuple of `Direction`, one per inner RNN.
        route: `"torch"`, `"masked_loop"`, `"fused"` or `"valid_first"`
            (see the module docstring).
    """

    __slots__ = ("directions", "route")

    def __init__(self, directions, route):
        self.directions = directions
        self.route = route

    def way(self, index=0):
        """The way of direction `index`."""
        return self.directions[index].way

    @property
    def unmasked(self):
        """True when no inner RNN is handed a mask (`uses_fast_path`)."""
        return all(d.way != "keras-masked" for d in self.directions)

    def info(self):
        """`{key: sentence}` for each direction (`kernel_info()`)."""
        return {d.key: d.reason() for d in self.directions}


def _choose(options, way):
    """The way to run from `options`: the first unhindered one, or `way`
    (forced) unless a hard `Why` stops it."""
    if way is None:
        for option, why in options:
            if why is None:
                return option
        raise AssertionError("a backend offered no way to run")  # pragma: no cover
    for option, why in options:
        if option == way:
            if why is not None and why.hard:
                raise Declined(f"{way!r} cannot run here: {why}")
            return way
    raise Declined(f"the {name()} backend has no {way!r} way")


def plan(inners, where, want_states, masked=True, training=None):
    """The `Plan` of one call.

    Args:
        inners: Dict `{key: inner RNN}` in direction order.
        where: A tensor or variable whose device decides (torch), or None
            for the default device.
        want_states: Bool, whether the caller returns the final states.
        masked: Bool, whether the call has a mask or lengths (else every
            step is valid and the route is `"fused"` or `"valid_first"`).
            Defaults to `True`.
        training: The call's `training` (input dropout while training runs
            PyTorch's kernels, and the one-call ways one direction per call,
            on valid-first data, where it is applied).

    Returns:
        A `Plan`.
    """
    backend = current()
    way = _FORCED.get()
    directions = []
    joint = backend.fused_why(list(inners.values())) if backend.FUSED_WAYS else None
    for key, inner in inners.items():
        options = backend.options(inner, where, want_states)
        if joint is not None:
            # The directions cannot share one call: its ways are declined.
            options = [
                (option, joint if option in backend.FUSED_WAYS else why)
                for option, why in options
            ]
        chosen = _choose(options, way)
        directions.append(
            Direction(key, inner, chosen, options, want_states, way is not None)
        )
    directions = tuple(directions)
    route = "valid_first"
    dropout = training and any(
        getattr(d.inner.cell, "dropout", 0) for d in directions
    )
    if all(d.fused for d in directions) and not dropout:
        route = "fused"
    elif masked:
        if all(d.torch for d in directions) and not dropout:
            route = "torch"
        elif all(d.way == "keras-masked" for d in directions):
            route = "masked_loop"
    made = Plan(directions, route)
    for plans in _RECORDS.get():
        plans.append(made)
    return made
