"""The correctness section of `scripts/gpu_check.py`: every kernel against two oracles.

For each case (LSTM and GRU x `MaskedBidirectional` and `MaskedRNN` x a
pre-padded `mask=` and a post-padded `lengths=` x with and without final
states, at the check's size and on a small edge batch with all-padding
rows, holes and an initial state), ours runs with the default plan and
with every kernel the backend offers forced (`maskedrnn.backends.force`;
a kernel declined here is recorded with its reason) and is compared with

- Keras' own layer in its masked step loop (`use_cudnn=False`, handed the
  same mask explicitly): outputs, final states, and the gradients of a
  fixed random weighting of every output with respect to the inputs, the
  initial states and every weight;
- on the torch backend, PyTorch's `nn.LSTM`/`nn.GRU` on a `PackedSequence`
  (the valid steps gathered first and scattered back): outputs, final
  states and the input gradient (not on the edge batch: PyTorch cannot
  pack an empty row).

Tolerances are asserted (`TOLERANCE`): a difference above them fails the
check. On torch the plan depends on whether gradients are recorded, so
each kernel runs twice there (inference and training); on JAX once, under
`jax.jit` (the plan is made while tracing). On JAX the oracle's jitted
function is kept per layer, case settings and shapes and reused by the
cases that share them (the `mask=` and `lengths=` cases hand it the same
mask argument): one compilation instead of one per case.
"""

import keras
import numpy as np

from maskedrnn import MaskedBidirectional, MaskedRNN, backends
from maskedrnn.bench import config
from maskedrnn.bench.timing import declined_reason
from tests.helpers import edge_mask

# Largest difference allowed, times max(1, largest magnitude of the oracle's
# tensor): float32 with TF32 off / JAX "highest" precision.
TOLERANCE = {"outputs": 5e-5, "grads": 5e-4}

CELLS = ("lstm", "gru")
LAYERS = ("bidirectional", "rnn")
HOW = ("mask_pre", "lengths_post")


EDGE_LENGTHS = np.array([7, 3, 0, 1, 5, 7], "int32")
# The edge batch's size.
EDGE = dict(batch=6, time=7, features=3, units=4)


# `--quick`: every factor's every value, in fewer cases.
# The CI rehearsal's cost is mostly one compilation per case (JAX), so two
# cases: the edge batch's every mask pattern in the second.
QUICK = (
    "main-lstm-bidirectional-lengths_post-states",
    "edge-gru-rnn-mask_pre",
)


def cases(main_size, edge_size, quick=False):
    """The cases, most telling first: `(name, settings)` (`quick`: those
    named in `QUICK`). With final states before without; each setting at
    the check's size, then on the edge batch (on JAX every case compiles
    anew, so a short budget still reaches the edge batch)."""
    found = []
    for states in (True, False):
        for layer in LAYERS:
            for cell in CELLS:
                for how in HOW:
                    for size_name, size in (("main", main_size), ("edge", edge_size)):
                        name = f"{size_name}-{cell}-{layer}-{how}"
                        name += "-states" if states else ""
                        case = dict(
                            size,
                            edge=size_name == "edge",
                            cell=cell,
                            layer=layer,
                            how=how,
                            states=states,
                        )
                        found.append((name, case))
    return [c for c in found if c[0] in QUICK] if quick else found


def case_data(case, seed):
    """`(x, mask, call_kwargs, initial_state or [])` as numpy."""
    b, t, d, u = (case[k] for k in ("batch", "time", "features", "units"))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, t, d)).astype("float32")
    if case["edge"]:
        if case["how"] == "mask_pre":  # every pattern, holes included
            mask = edge_mask()
        else:
            mask = np.arange(t)[None, :] < EDGE_LENGTHS[:, None]
        directions = 2 if case["layer"] == "bidirectional" else 1
        per = 2 if case["cell"] == "lstm" else 1
        initial = [
            rng.standard_normal((b, u)).astype("float32")
            for _ in range(directions * per)
        ]
    else:
        lengths = config.parse_lengths("uniform:0.2", b, t, seed=seed)
        padding = "pre" if case["how"] == "mask_pre" else "post"
        mask = config.make_mask(lengths, t, padding)
        initial = []
    if case["how"] == "mask_pre":
        kwargs = {"mask": mask}
    else:
        kwargs = {"lengths": mask.sum(axis=1).astype("int32")}
    return x, mask, kwargs, initial


def build_pair(case):
    """(ours, Keras' masked oracle) with the same weights, built."""
    u, d = case["units"], case["features"]
    cls = keras.layers.LSTM if case["cell"] == "lstm" else keras.layers.GRU
    kw = dict(return_sequences=True, return_state=case["states"])
    if case["layer"] == "bidirectional":
        ref = keras.layers.Bidirectional(cls(u, use_cudnn=False, **kw))
        ours = MaskedBidirectional(cls(u, **kw))
    else:
        # Zeros at padded steps, as Keras' Bidirectional and PyTorch give.
        ref = cls(u, use_cudnn=False, zero_output_for_mask=True, **kw)
        ours = MaskedRNN(cls(u, zero_output_for_mask=True, **kw))
    ref.build((None, None, d))
    ours.build((None, None, d))
    ours.set_weights(ref.get_weights())
    return ours, ref


def output_shapes(case):
    """The shapes of the layers' outputs: the sequence, then the states."""
    b, t, u = case["batch"], case["time"], case["units"]
    directions = 2 if case["layer"] == "bidirectional" else 1
    shapes = [(b, t, directions * u)]
    if case["states"]:
        shapes += [(b, u)] * directions * (2 if case["cell"] == "lstm" else 1)
    return shapes


def flat(outputs):
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def relative_diff(actual, expected):
    """max|actual - expected| / max(1, max|expected|) over tensors."""
    worst = 0.0
    for a, e in zip(actual, expected):
        a, e = np.asarray(a, "float64"), np.asarray(e, "float64")
        if a.shape != e.shape:
            return float("inf")
        if a.size:
            scale = max(1.0, float(np.max(np.abs(e))))
            worst = max(worst, float(np.max(np.abs(a - e))) / scale)
    return worst


def compare(parts):
    """`{part: relative difference}` and whether all are within tolerance;
    `parts` maps a part's name to `(slice of got, slice of want, kind)`."""
    diffs, ok = {}, True
    for part, (a, e, kind) in parts.items():
        diff = relative_diff(a, e)
        diffs[part] = diff
        ok = ok and diff <= TOLERANCE[kind]
    return diffs, ok


class Runner:
    """Runs a layer on this backend: outputs, and with `grads` the gradients
    of `sum(outputs[k] * weights[k])` for `[x] + initial states + weights`.

    `reuse` (JAX): a key naming the layer's structure (its type and
    settings, not its weights); calls with the same key and shapes run one
    jitted function, traced on the first call's layer and given each
    call's weights as arguments.
    """

    def __init__(self, backend, device):
        self.backend = backend
        self.device = device  # "gpu" or "cpu"
        self.jitted = {}

    def __call__(self, layer, x, kwargs, initial, weights, grads, reuse=None):
        if self.backend == "torch":
            return self._torch(layer, x, kwargs, initial, weights, grads)
        return self._jax(layer, x, kwargs, initial, weights, grads, reuse)

    def planned_kernels(self, layer, x, kwargs, initial):
        """The set of kernels the default plan runs, found by tracing alone
        (`jax.eval_shape`: no compilation) on JAX; None on torch, where
        running is as cheap as tracing."""
        if self.backend != "jax":
            return None
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        fixed = [v.value for v in layer.non_trainable_variables]

        def forward(trainable, x, initial, kwargs):
            return layer.stateless_call(
                trainable, fixed, x, initial_state=initial or None, **kwargs
            )[0]

        with backends.record() as plans:
            jax.eval_shape(forward, trainable, x, initial, kwargs)
        return {d.kernel for p in plans for d in p.directions}

    def _torch(self, layer, x, kwargs, initial, weights, grads):
        import torch

        device = "cuda" if self.device == "gpu" else "cpu"

        def tensor(a, leaf=False):
            return torch.tensor(a, device=device, requires_grad=leaf)

        x = tensor(x, grads)
        kwargs = {k: tensor(v) for k, v in kwargs.items()}
        initial = [tensor(s, grads) for s in initial]
        with torch.set_grad_enabled(grads):
            outs = flat(
                layer(x, initial_state=initial or None, training=grads, **kwargs)
            )
        numpy = [o.detach().cpu().numpy() for o in outs]
        if not grads:
            return numpy, None
        loss = sum((o * tensor(w)).sum() for o, w in zip(outs, weights))
        params = [v.value for v in layer.trainable_variables]
        found = torch.autograd.grad(loss, [x] + initial + params)
        return numpy, [g.detach().cpu().numpy() for g in found]

    def _jax(self, layer, x, kwargs, initial, weights, grads, reuse=None):
        import jax

        device = jax.devices("gpu" if self.device == "gpu" else "cpu")[0]
        put = lambda a: jax.device_put(a, device)  # noqa: E731
        trainable = [v.value for v in layer.trainable_variables]
        fixed = [v.value for v in layer.non_trainable_variables]
        x, kwargs = put(x), {k: put(v) for k, v in kwargs.items()}
        initial, weights = [put(s) for s in initial], [put(w) for w in weights]
        args = (trainable, fixed, x, initial, kwargs, weights)
        key = None
        if reuse is not None:
            shapes = jax.tree_util.tree_map(lambda a: (a.shape, str(a.dtype)), args)
            key = (reuse, grads, str(jax.tree_util.tree_structure(args)), str(shapes))
        step = self.jitted.get(key) if key is not None else None
        if step is None:
            step = jax.jit(_jax_step(layer, grads))
            if key is not None:
                self.jitted[key] = step
        outs, found = step(*args)
        outs = [np.asarray(o) for o in outs]
        return outs, None if found is None else [np.asarray(g) for g in found]


def _jax_step(layer, grads):
    """`step(trainable, fixed, x, initial, kwargs, weights)` -> `(outputs,
    gradients or None)` of `layer` (`Runner`): every value an argument, so
    one jitted step serves any layer of the same structure."""
    import jax
    import jax.numpy as jnp

    def forward(trainable, fixed, x, initial, kwargs):
        outs, _ = layer.stateless_call(
            trainable,
            fixed,
            x,
            initial_state=initial or None,
            training=grads,
            **kwargs,
        )
        return flat(outs)

    def loss(trainable, fixed, x, initial, kwargs, weights):
        outs = forward(trainable, fixed, x, initial, kwargs)
        return sum(jnp.sum(o * w) for o, w in zip(outs, weights)), outs

    grad = jax.value_and_grad(loss, argnums=(0, 2, 3), has_aux=True)

    def step(trainable, fixed, x, initial, kwargs, weights):
        if not grads:
            return forward(trainable, fixed, x, initial, kwargs), None
        (_, outs), (g_w, g_x, g_init) = grad(
            trainable, fixed, x, initial, kwargs, weights
        )
        return outs, [g_x, *g_init, *g_w]

    return step


def torch_packed(ref, case, x, mask, weights, device):
    """PyTorch's module on a `PackedSequence` with `ref`'s weights: outputs
    in Keras' order (sequence, then each direction's states) and the input
    gradient of the same loss."""
    import torch

    from maskedrnn.bench.harness_torch import Harness

    bidirectional = case["layer"] == "bidirectional"
    module = Harness(device == "gpu").torch_module(
        case["cell"], [ref], case["units"], bidirectional=bidirectional
    )
    dev = "cuda" if device == "gpu" else "cpu"
    order, inverse = config.valid_first_permutation(mask)
    rows = torch.arange(x.shape[0], device=dev)[:, None]
    xt = torch.tensor(x, device=dev, requires_grad=True)
    valid_first = xt[rows, torch.as_tensor(order, device=dev)]
    lengths = torch.as_tensor(mask.sum(axis=1), dtype=torch.int64)
    seq = torch.nn.utils.rnn.pack_padded_sequence(
        valid_first, lengths, batch_first=True, enforce_sorted=False
    )
    y, hidden = module(seq)
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(
        y, batch_first=True, total_length=x.shape[1]
    )
    y = y[rows, torch.as_tensor(inverse, device=dev)]
    outs = [y]
    if case["states"]:
        hidden = hidden if isinstance(hidden, tuple) else (hidden,)
        for direction in range(2 if bidirectional else 1):
            outs += [h[direction] for h in hidden]
    loss = sum((o * torch.tensor(w, device=dev)).sum() for o, w in zip(outs, weights))
    (gx,) = torch.autograd.grad(loss, [xt])
    return [o.detach().cpu().numpy() for o in outs], gx.detach().cpu().numpy()


def run_case(name, case, runner, backend, device, seed=0):
    """Checks one case; returns its record (`"ok"`: every comparison passed)."""
    x, mask, kwargs, initial = case_data(case, seed)
    with keras.device(device):
        ours, ref = build_pair(case)
    rng = np.random.default_rng(seed + 1)
    weights = [
        rng.standard_normal(shape).astype("float32") for shape in output_shapes(case)
    ]
    # The oracle's structure: the same for the mask= and lengths= cases.
    reuse = ("keras_masked", case["cell"], case["layer"], case["states"])
    ref_out, ref_grads = runner(
        ref, x, {"mask": mask}, initial, weights, grads=True, reuse=reuse
    )
    n_init = len(initial)
    record = {"name": name, "case": case, "kernels": [], "ok": True}
    packed = None
    if backend == "torch" and not case["edge"]:
        packed = torch_packed(ref, case, x, mask, weights, device)
        diffs, ok = compare(
            {
                "outputs": (packed[0][:1], ref_out[:1], "outputs"),
                "states": (packed[0][1:], ref_out[1:], "outputs"),
            }
        )
        record["torch_packed_vs_keras_masked"] = {"diffs": diffs, "ok": ok}
    elif backend == "torch":
        record["torch_packed"] = "not compared: PyTorch cannot pack an empty row"
    modes = ("infer", "train") if backend == "torch" else ("train",)
    offered = backends.current().KERNELS
    default_kernels = {}
    planned = runner.planned_kernels(ours, x, kwargs, initial)
    for kernel in ("default", *offered):
        for mode in modes:
            entry = {"kernel": kernel, "mode": mode}
            record["kernels"].append(entry)
            if kernel == "default" and planned is not None and len(planned) == 1:
                (only,) = planned
                if only in offered:
                    entry["plan_kernels"] = [only]
                    entry["skipped"] = f"the default plan runs {only!r}: checked forced"
                    continue
            ran = default_kernels.get(mode)
            if kernel != "default" and ran is not None and ran == {kernel}:
                entry["skipped"] = "default plan ran this kernel for every direction"
                continue
            forced = None if kernel == "default" else kernel
            train = mode == "train"
            try:
                with backends.force(forced), backends.record() as plans:
                    out, grads = runner(ours, x, kwargs, initial, weights, grads=train)
            except backends.Declined as error:
                entry["declined"] = declined_reason(error)
                continue
            kernels = {d.kernel for p in plans for d in p.directions}
            entry["plan_kernels"] = sorted(kernels)
            if kernel == "default":
                default_kernels[mode] = kernels
            parts = {
                "outputs": (out[:1], ref_out[:1], "outputs"),
                "states": (out[1:], ref_out[1:], "outputs"),
            }
            if train:
                parts["grad_inputs"] = (grads[:1], ref_grads[:1], "grads")
                parts["grad_initial_state"] = (
                    grads[1 : 1 + n_init],
                    ref_grads[1 : 1 + n_init],
                    "grads",
                )
                parts["grad_weights"] = (
                    grads[1 + n_init :],
                    ref_grads[1 + n_init :],
                    "grads",
                )
            entry["diffs"], entry["ok"] = compare(parts)
            if packed is not None:
                p_parts = {
                    "outputs": (out[:1], packed[0][:1], "outputs"),
                    "states": (out[1:], packed[0][1:], "outputs"),
                }
                if train:
                    p_parts["grad_inputs"] = (grads[:1], [packed[1]], "grads")
                diffs, ok = compare(p_parts)
                entry["diffs_torch_packed"] = diffs
                entry["ok"] = entry["ok"] and ok
            record["ok"] = record["ok"] and entry["ok"]
    return record
