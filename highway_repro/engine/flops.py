"""FLOPs of a training step, and the peak FLOP/s of the device, for throughput and MFU.

The trainer and the benchmarks (`bench/`) count the same way: `torch.utils.flop_counter`
(matmuls, convolutions, attention) plus the formulas it lacks on CPU, registered by `register()`:

- CPU flash attention (`_scaled_dot_product_flash_attention_for_cpu` and its backward): the
  counter's own sdpa formulas (Q K^T and P V; backward 2.5x), halved when `is_causal` (the
  masked half is never computed), so MFU is not flattered by work that is skipped.
- oneDNN RNN layers (`mkldnn_rnn_layer`, the CPU LSTM / GRU of the R-Transformer's local RNN):
  2 * T * N * G * (input + hidden) per direction and layer, G = 4H (LSTM) or 3H (GRU);
  backward twice that. cuDNN RNN calls (`_cudnn_rnn`, the GPU's) by the same formula
  (`cudnn_rnn_flops`).

Elementwise work (activations, norms, the optimizer step) is not counted, as in the MFU of
nanoGPT and PaLM. MFU = counted FLOP/s / `peak_flops(device, precision)`: the datasheet's dense
peak of a known GPU; on CPU (or an unknown GPU) there is no datasheet peak and no MFU, unless a
peak is given (`trainer.peak_flops`).
"""

from __future__ import annotations


import torch
from torch.utils import flop_counter as fc

aten = torch.ops.aten
_DONE = False

# Dense peak FLOP/s of NVIDIA GPUs (datasheets, without sparsity), by a part of torch.cuda.get_device_name(); the
# first match counts, so the specific names come first. "fp32" is the plain FP32 rate, "tf32" the tensor-core rate
# that fp32 matmuls get when torch.backends.cuda.matmul.allow_tf32 is on (off by default).
PEAK_FLOPS = {
    "H100 NVL": {"bf16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H100 PCIe": {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H100": {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12},  # SXM
    "H200 NVL": {"bf16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H200": {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12},  # SXM
    "A100": {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}


def _shape(t):
    return tuple(t.shape)


def cudnn_rnn_flops(inp_shape, weights, stride: int, batch_sizes=()) -> int:
    """FLOPs of one cuDNN RNN call (`aten._cudnn_rnn`): 2 * tokens * G * (in + hidden) per layer and direction,
    tokens = T * N (or the packed length). `weights`: the flat list, `stride` tensors per layer and direction
    with w_ih, w_hh first."""
    tokens = int(inp_shape[0]) if len(batch_sizes) else int(inp_shape[0]) * int(inp_shape[1])
    total = 0
    for i in range(0, len(weights) - stride + 1, stride):
        w_ih, w_hh = weights[i], weights[i + 1]
        total += 2 * tokens * int(w_ih.shape[0]) * (int(w_ih.shape[1]) + int(w_hh.shape[1]))
    return total


def register() -> None:
    global _DONE
    if _DONE:
        return
    _DONE = True

    sdpa_fwd = aten._scaled_dot_product_flash_attention_for_cpu
    sdpa_bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if sdpa_fwd not in fc.flop_registry:
        @fc.register_flop_formula(sdpa_fwd, get_raw=True)
        def _sdpa_cpu(query, key, value, dropout_p=0.0, is_causal=False, *args, out_val=None, **kwargs) -> int:
            n = fc.sdpa_flop_count(_shape(query), _shape(key), _shape(value))
            return n // 2 if is_causal else n

    if sdpa_bwd not in fc.flop_registry:
        @fc.register_flop_formula(sdpa_bwd, get_raw=True)
        def _sdpa_cpu_bwd(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False, *args,
                          out_val=None, **kwargs) -> int:
            n = fc.sdpa_backward_flop_count(_shape(grad_out), _shape(query), _shape(key), _shape(value))
            return n // 2 if is_causal else n

    def rnn_flops(inp, w_ih, w_hh, batch_first) -> int:
        t, n = (inp.shape[1], inp.shape[0]) if batch_first else (inp.shape[0], inp.shape[1])
        g, i = w_ih.shape
        return 2 * t * n * g * (i + w_hh.shape[1])

    rnn_fwd, rnn_bwd = aten.mkldnn_rnn_layer, aten.mkldnn_rnn_layer_backward
    if rnn_fwd not in fc.flop_registry:
        @fc.register_flop_formula(rnn_fwd, get_raw=True)
        def _rnn(inp, w0, w1, w2, w3, hx, cx, reverse, batch_sizes, mode, hidden_size, num_layers, has_biases,
                 bidirectional, batch_first, train, *args, out_val=None, **kwargs) -> int:
            return rnn_flops(inp, w0, w1, batch_first)

    if rnn_bwd not in fc.flop_registry:
        @fc.register_flop_formula(rnn_bwd, get_raw=True)
        def _rnn_bwd(inp, w1, w2, w3, w4, hx, cx, output, hy, cy, grad_output, grad_hy, grad_cy, reverse, mode,
                     hidden_size, num_layers, has_biases, train, bidirectional, batch_sizes, batch_first, workspace,
                     *args, out_val=None, **kwargs) -> int:
            return 2 * rnn_flops(inp, w1, w2, batch_first)

    cudnn_fwd, cudnn_bwd = getattr(aten, "_cudnn_rnn", None), getattr(aten, "_cudnn_rnn_backward", None)
    if cudnn_fwd is not None and cudnn_fwd not in fc.flop_registry:
        @fc.register_flop_formula(cudnn_fwd, get_raw=True)
        def _cudnn_rnn(*args, out_val=None, **kwargs) -> int:
            # input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden, proj, layers, batch_first,
            # dropout, train, bidirectional, batch_sizes, ...
            sizes = args[14] if len(args) > 14 else kwargs.get("batch_sizes", ())
            return cudnn_rnn_flops(args[0].shape, args[1], int(args[2]), sizes or ())

    if cudnn_bwd is not None and cudnn_bwd not in fc.flop_registry:
        @fc.register_flop_formula(cudnn_bwd, get_raw=True)
        def _cudnn_rnn_backward(*args, out_val=None, **kwargs) -> int:
            # input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy, grad_cy,
            # mode, hidden, proj, layers, batch_first, dropout, train, bidirectional, batch_sizes, ...
            sizes = args[18] if len(args) > 18 else kwargs.get("batch_sizes", ())
            return 2 * cudnn_rnn_flops(args[0].shape, args[1], int(args[2]), sizes or ())


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The datasheet peak FLOP/s of `device` at `precision` ("fp32" or "bf16"); None on CPU and unknown GPUs."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        precision = "tf32"
    for part, peaks in PEAK_FLOPS.items():
        if part in name:
            return peaks.get(precision)
    return None


def _shapes(obj):
    if torch.is_tensor(obj):
        return tuple(obj.shape)
    if isinstance(obj, (list, tuple)):
        return tuple(_shapes(o) for o in obj)
    return obj


class StepFlops:
    """FLOPs of forward + backward of training steps, counted on the first step of each shape of the inputs.

        step_flops = StepFlops()
        with step_flops.count(batch, mems) as step:  # counts when these shapes are new
            loss = ...
            loss.backward()                          # (or step.cancel(): a skipped step)
        step.flops                                   # the FLOPs of a step of these shapes

    Steps of one shape do the same work, so each shape is counted once (an empty and a full memory of
    Transformer-XL are two shapes); counting slows that one step down and changes no number it computes.
    """

    def __init__(self):
        register()
        self.by_shape: dict = {}

    def count(self, *inputs) -> "_Count":
        return _Count(self.by_shape, _shapes(inputs))


class _Count:
    def __init__(self, by_shape: dict, key):
        self.by_shape, self.key, self.cancelled = by_shape, key, False
        self.mode = None if key in by_shape else fc.FlopCounterMode(display=False)

    @property
    def counting(self) -> bool:
        """Whether this step is counted (the first of its shapes)."""
        return self.mode is not None

    def __enter__(self) -> "_Count":
        if self.mode is not None:
            self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode is not None:
            self.mode.__exit__(*exc)
            if exc[0] is None and not self.cancelled:
                self.by_shape[self.key] = int(self.mode.get_total_flops())

    def cancel(self) -> None:
        """The step was not completed (no backward): do not keep its count."""
        self.cancelled = True

    @property
    def flops(self) -> int:
        return 0 if self.cancelled else self.by_shape.get(self.key, 0)
