"""The PyTorch harness: eager (forward under `torch.no_grad()` for
`"infer"`); timing waits with `torch.cuda.synchronize()` on CUDA (CPU ops
are synchronous). Also builds PyTorch's own `nn.LSTM/GRU(bidirectional=True)`
with the Keras layer's weights (`torch_packed`, `torch_unpacked`)."""

import contextlib


def gpu_available():
    import torch

    return torch.cuda.is_available()


def set_threads(threads):
    import torch

    torch.set_num_threads(threads)
    return f"{threads} intra-op thread(s) (torch.set_num_threads)"


def auto_threads():
    """The CPU thread count when `--threads` is not given: the demo's rule
    (`maskedrnn.backends.torch_threads`): `OMP_NUM_THREADS` if set, else 1 for
    small models. Returns `(count, source)`."""
    from maskedrnn.backends.torch_threads import resolve_threads

    return resolve_threads(None)


def default_threads_note(gpu=False):
    if gpu:
        return (
            "PyTorch's own intra-op thread pool: on CUDA the host only "
            "launches kernels (--threads N to set it)"
        )
    count, source = auto_threads()
    return (
        f"{count} intra-op thread(s) ({source}), chosen by the bench on CPU "
        "(torch.set_num_threads): PyTorch's advice for small models; a pool "
        "as wide as the machine spins against other load (--threads N to "
        "change)"
    )


class Harness:
    """Eager PyTorch; syncs with torch.cuda.synchronize() on CUDA."""

    def __init__(self, gpu):
        import torch

        self.torch = torch
        self.gpu = gpu
        self.device = torch.device("cuda" if gpu else "cpu")

    def tensor(self, array):
        return self.torch.as_tensor(array, device=self.device)

    def _step(self, forward, params, mode, x, w):
        torch = self.torch
        if mode == "infer":

            def step():
                with torch.no_grad():
                    return forward(x)

            return step

        def step():
            x_leaf = x.detach().requires_grad_(True)
            y = forward(x_leaf)
            loss = (y * w).sum()
            grads = torch.autograd.grad(loss, [x_leaf] + params)
            return y, list(grads)

        return step

    def keras_step(self, layer, mode, x, w, kwargs, post=None):
        params = [v.value for v in layer.trainable_variables]
        training = mode == "train"
        post = post or (lambda y: y)
        return self._step(
            lambda x: post(layer(x, training=training, **kwargs)), params, mode, x, w
        )

    def torch_module(self, cell, keras_layers, units, bidirectional=True):
        """nn.LSTM/GRU/RNN(num_layers=len(keras_layers)) with the weights of
        the stacked Keras `Bidirectional` (or, `bidirectional=False`,
        LSTM/GRU/SimpleRNN) layers (`cell` as `--cell`)."""
        from maskedrnn.convert import keras_to_torch_state_dict

        torch = self.torch
        first = keras_layers[0]
        first = first.forward_layer if bidirectional else first
        features = first.cell.kernel.shape[0]
        from maskedrnn.bench.config import CELLS

        cls = getattr(torch.nn, CELLS[cell]["torch"])
        module = cls(
            features,
            units,
            num_layers=len(keras_layers),
            batch_first=True,
            bidirectional=bidirectional,
        )
        state = keras_to_torch_state_dict([k.get_weights() for k in keras_layers])
        module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        return module.to(self.device)

    def torch_step(
        self,
        module,
        packed,
        mode,
        x,
        w,
        lengths,
        return_state=False,
        order=None,
        directions=2,
    ):
        """A step of PyTorch's module; `order` (from
        `config.valid_first_permutation`, for pre-padded data or holes) makes the
        packed module gather each row's valid steps first and scatter its
        outputs back, inside the timed step, as a PyTorch user must."""
        torch = self.torch
        pack = torch.nn.utils.rnn.pack_padded_sequence
        unpack = torch.nn.utils.rnn.pad_packed_sequence
        # pack_padded_sequence wants the lengths on the CPU (it copies them
        # there otherwise): made once, outside the timed region, as are the
        # index tensors.
        lengths_cpu = torch.as_tensor(lengths, dtype=torch.int64)
        total = x.shape[1]
        if packed and order is not None:
            rows = torch.arange(x.shape[0], device=self.device)[:, None]
            gather = torch.as_tensor(order[0], device=self.device)
            scatter = torch.as_tensor(order[1], device=self.device)

        def forward(x):
            if not packed:
                y, hidden = module(x)
            else:
                if order is not None:
                    x = x[rows, gather]
                seq = pack(x, lengths_cpu, batch_first=True, enforce_sorted=False)
                y, hidden = module(seq)
                y, _ = unpack(y, batch_first=True, total_length=total)
                if order is not None:
                    y = y[rows, scatter]
            if not return_state:
                return y
            from maskedrnn.bench.layers import states_into_sequence

            # PyTorch's states are (directions * layers, batch, units) per
            # kind (h, and c for an LSTM), the last layer's last: forward,
            # backward, as ours' order.
            hidden = hidden if isinstance(hidden, tuple) else (hidden,)
            if directions == 1:
                return states_into_sequence(y, *[h[-1] for h in hidden], directions=1)
            return states_into_sequence(
                y, *[h[-2] for h in hidden], *[h[-1] for h in hidden]
            )

        return self._step(forward, list(module.parameters()), mode, x, w)

    def fresh_compilation(self):
        """Eager: nothing is compiled; new layers and modules suffice."""
        return contextlib.nullcontext()

    def fresh_description(self):
        return "new layers (and PyTorch modules) per call, eager"

    def block(self, result):
        if self.gpu:
            self.torch.cuda.synchronize()

    def payload(self, result):
        return result

    def numpy(self, tensor):
        return tensor.detach().cpu().numpy()

    def describe_device(self):
        if not self.gpu:
            return "cpu"
        return f"cuda: {self.torch.cuda.get_device_name(0)}"

    def versions(self):
        torch = self.torch
        versions = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
        if torch.cuda.is_available():
            versions["cudnn"] = torch.backends.cudnn.version()
            versions["cuda_device_name"] = torch.cuda.get_device_name()
            versions["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
            versions["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
        return versions

    def profile(self, step):
        from maskedrnn.bench import kernels

        return kernels.profile_torch(step, self.block, self.gpu)
