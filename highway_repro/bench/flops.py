"""FLOP formulas torch.utils.flop_counter lacks on CPU, registered for the benchmarks only.

- CPU flash attention (`_scaled_dot_product_flash_attention_for_cpu` and its backward): the
  counter's own sdpa formulas (Q K^T and P V; backward 2.5x), halved when `is_causal` (the
  masked half is never computed), so MFU is not flattered by work that is skipped.
- oneDNN RNN layers (`mkldnn_rnn_layer`, the CPU LSTM / GRU of the R-Transformer's local RNN):
  2 * T * N * G * (input + hidden) per direction and layer, G = 4H (LSTM) or 3H (GRU);
  backward twice that.
"""

from __future__ import annotations

import torch
from torch.utils import flop_counter as fc

aten = torch.ops.aten
_DONE = False


def _shape(t):
    return tuple(t.shape)


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
