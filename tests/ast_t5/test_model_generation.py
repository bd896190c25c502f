"""Incremental decoding of the ast_t5 model: cached == uncached, and fairseq's SequenceGenerator."""
import pytest
import torch
from fairseq.models import FairseqDecoder, FairseqEncoderDecoderModel
from fairseq.sequence_generator import SequenceGenerator

from ast_t5.models import AstT5Model

from .test_model import FAMILIES, PAD, make_batch, make_dictionary  # noqa: F401


class UncachedDecoder(FairseqDecoder):
    """Hides incremental decoding: SequenceGenerator then re-runs the whole prefix every step."""

    def __init__(self, inner):
        super().__init__(inner.dictionary)
        self.inner = inner

    def forward(self, prev_output_tokens, encoder_out=None, **kwargs):
        return self.inner(prev_output_tokens, encoder_out=encoder_out)

    def max_positions(self):
        return self.inner.max_positions()


def build(arch, backend="torch", seed=0):
    torch.manual_seed(seed)
    return AstT5Model.from_dictionary(make_dictionary(), arch=arch, attention_backend=backend).eval()


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_cached_decoding_matches_full_forward(arch, backend):
    model = build(arch, backend)
    src, prev, _ = make_batch(len(model.decoder.dictionary), tgt_len=9)
    with torch.no_grad():
        encoder_out = model.encoder(src, src.ne(PAD).sum(1))
        full = model.decoder(prev, encoder_out=encoder_out)[0]
        state, steps = {}, []
        for t in range(prev.size(1)):
            logits = model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)[0]
            assert logits.shape == (prev.size(0), 1, full.size(-1))  # only the new step is computed
            assert model.decoder.layers[0].self_attn.cached_length(state) == t + 1
            steps.append(logits)
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


@pytest.mark.parametrize("arch", FAMILIES)
def test_beam_search_with_cache_equals_beam_search_without(arch):
    """Beam search reorders the cache (reorder_incremental_state); results must not change."""
    model = build(arch)
    uncached = FairseqEncoderDecoderModel(model.encoder, UncachedDecoder(model.decoder)).eval()
    d = model.decoder.dictionary
    src, _, _ = make_batch(len(d), bsz=3)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(PAD).sum(1)}}
    results = []
    for m in (model, uncached):
        generator = SequenceGenerator([m], d, beam_size=4, max_len_a=0, max_len_b=10)
        with torch.no_grad():
            results.append(generator.generate([m], sample))
    for cached_hyps, plain_hyps in zip(*results):
        assert len(cached_hyps) == 4
        for a, b in zip(cached_hyps, plain_hyps):
            assert torch.equal(a["tokens"], b["tokens"])
            assert abs(a["score"].item() - b["score"].item()) < 1e-4
    assert any(len(h[0]["tokens"]) > 2 for h in results[0])  # not a trivial immediate </s>
