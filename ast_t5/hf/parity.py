"""Logits parity between our model and a Hugging Face T5 on seeded random inputs.

Run at the end of every import and export: a config field that changes the function and was not
carried over (the decoder-output scaling, an activation, a norm epsilon) shows up as a logit
difference, and the command fails instead of writing a silently different model.
"""
from typing import Tuple

import torch

PARITY_TOLERANCE = 1e-3  # max |logit difference| relative to max(1, max |logit|); fp32 gives ~1e-6
PARITY_SEED = 0


def random_inputs(vocab_size: int, pad: int, eos: int, seed: int = PARITY_SEED,
                  batch: int = 2, src_len: int = 24, tgt_len: int = 12) -> Tuple[torch.Tensor, ...]:
    """A right-padded source batch (ids above the specials, ending in eos) and decoder inputs
    starting with eos (our decoder-start convention)."""
    g = torch.Generator().manual_seed(seed)
    low = min(4, vocab_size - 1)
    src = torch.randint(low, vocab_size, (batch, src_len), generator=g)
    prev = torch.randint(low, vocab_size, (batch, tgt_len), generator=g)
    prev[:, 0] = eos
    for row in range(batch):
        length = src_len - 5 * row  # rows of different lengths exercise the padding mask
        src[row, length - 1] = eos
        src[row, length:] = pad
    return src, prev


def logits_difference(ours_model, hf_model, vocab_size: int, pad: int, eos: int,
                      seed: int = PARITY_SEED) -> float:
    """Max |ours - Hugging Face| logit on random inputs, divided by max(1, max |logit|)."""
    src, prev = random_inputs(vocab_size, pad, eos, seed)
    ours_model = ours_model.float().cpu().eval()
    with torch.no_grad():
        a = ours_model(src, src.ne(pad).sum(1), prev)[0].float()
        b = hf_model(input_ids=src, attention_mask=src.ne(pad).long(), decoder_input_ids=prev).logits.float()
    return ((a - b).abs().max() / a.abs().max().clamp(min=1.0)).item()


def hf_logits_difference(model_a, model_b, vocab_size: int, pad: int, eos: int,
                         seed: int = PARITY_SEED) -> float:
    """The same measure between two Hugging Face models (an export and its reloaded files)."""
    src, prev = random_inputs(vocab_size, pad, eos, seed)
    with torch.no_grad():
        a = model_a(input_ids=src, attention_mask=src.ne(pad).long(), decoder_input_ids=prev).logits.float()
        b = model_b(input_ids=src, attention_mask=src.ne(pad).long(), decoder_input_ids=prev).logits.float()
    return ((a - b).abs().max() / a.abs().max().clamp(min=1.0)).item()
