"""Model FLOPs of a training step, and the GPUs' peak rates that turn them into MFU.

One count everywhere (the training log's ``tflops`` and ``mfu``, ``bench_model.py``,
``bench_train.py``), DESIGN.md section 8's made exact for an encoder-decoder, from the padded
shapes (what the hardware computes; it equals torch.utils.flop_counter's count of the eager
attention path, which tests/ast_t5/test_flops.py checks):

    6 x ((encoder params + decoder cross-attention K/V params) x B x S + other decoder params x B x T)
      + 3 x 4 x B x heads x head_dim x (encoder_layers x S^2 + decoder_layers x (T^2 + T x S))

- params: the weight matrices that multiply (every nn.Linear of the stack, and the output head,
  whose V x d counts with the decoder even when tied to the embedding); not the lookups (token
  and position embeddings, relative-position tables) nor norms and biases (no matrix product);
- the decoder's cross-attention projects the encoder's S states to keys and values, so those
  matrices multiply B x S rows, not B x T (counting them with T, as 6 x N x tokens formulas do,
  misses 8% of T5-base's step at 512/114);
- 6 = forward (2 per multiply-add) + backward (twice the forward);
- attention: q k^T and p v, 2 FLOPs per multiply-add each, forward and backward; causal
  self-attention counted in full (as nanoT5 and PaLM's MFU do), padding not subtracted.

MFU divides the achieved model FLOP/s by the dense bf16 peak of the GPU (`device_peak_tflops`):
a fraction of what the matrix units could do, independent of recomputation (activation
checkpointing adds work that does not count).
"""
from typing import Optional

import torch

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' data sheets, matched
# against torch.cuda.get_device_name() in this order (the first fragment found wins).
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("GH200", 989.0), ("H200", 989.0), ("H100", 989.0),
    ("H800", 989.0), ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L4", 121.0),
    ("A10G", 70.0), ("A10", 125.0),
)


def peak_tflops_for(name: str) -> Optional[float]:
    """The dense bf16 peak of a GPU by its name, or None when it is not in `PEAK_BF16_TFLOPS`."""
    for fragment, tflops in PEAK_BF16_TFLOPS:
        if fragment in name:
            return tflops
    return None


def device_peak_tflops(device: torch.device) -> Optional[float]:
    """The dense bf16 peak of ``device`` (a CUDA device), or None (CPU, unknown GPU)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_tflops_for(torch.cuda.get_device_name(device))


CROSS_KV_PROJECTIONS = ("kv_proj", "k_proj", "v_proj")  # Linear names under a decoder layer's encoder_attn


def _coefficients(model):
    """(encoder matrices, other decoder matrices incl. the head, cross-attention K/V matrices,
    attention width, encoder layers, decoder layers) of a model,
    computed once per model (the count is read at every training step)."""
    cached = getattr(model, "_ast_t5_flop_coefficients", None)
    if cached is not None:
        return cached
    enc = sum(m.weight.numel() for m in model.encoder.modules() if isinstance(m, torch.nn.Linear))
    dec, cross_kv = 0, 0
    for name, m in model.decoder.named_modules():
        if isinstance(m, torch.nn.Linear):
            if ".encoder_attn." in f".{name}" and name.rsplit(".", 1)[-1] in CROSS_KV_PROJECTIONS:
                cross_kv += m.weight.numel()
            else:
                dec += m.weight.numel()
    if getattr(model.decoder, "output_projection", None) is None:  # tied head: the embedding multiplies
        dec += model.decoder.embed_tokens.weight.numel()
    cfg = model.cfg
    inner = cfg.num_heads * (cfg.head_dim or cfg.embed_dim // cfg.num_heads)
    cached = (enc, dec, cross_kv, inner, cfg.encoder_layers, cfg.decoder_layers)
    object.__setattr__(model, "_ast_t5_flop_coefficients", cached)  # not a module attribute
    return cached


def training_flops(model, batch: int, src_len: int, tgt_len: int) -> float:
    """Model FLOPs of one forward + backward of ``model`` (an `AstT5Model`) on a (batch, src_len)
    source and (batch, tgt_len) target, padded shapes (module docstring)."""
    enc, dec, cross_kv, inner, enc_layers, dec_layers = _coefficients(model)
    attention_fwd = 4.0 * batch * inner * (enc_layers * src_len * src_len
                                           + dec_layers * (tgt_len * tgt_len + tgt_len * src_len))
    return 6.0 * ((enc + cross_kv) * batch * src_len + dec * batch * tgt_len) + 3.0 * attention_fwd
