"""ast_t5/generation/generator.py and ast_t5/generation/checkpoints.py: decoding with a tiny
random model."""
import pytest
import torch

from ast_t5.generation.checkpoints import CheckpointError, load_checkpoint
from ast_t5.generation.generator import (AstT5Generator, GenerationOptions, fill_spans,
                                         split_spans)


PROMPTS = ["def add(a, b):\n    return a + b\n", "x = 1", "class A:\n\tpass\n\n\n# end of file"]
MAX_NEW = 12


@pytest.fixture(scope="module")
def generator(tiny_checkpoint_dir):
    return AstT5Generator.from_checkpoint(str(tiny_checkpoint_dir), device="cpu",
                                          max_new_tokens=MAX_NEW)


def manual_greedy(model, src, pad, eos, max_new):
    """Argmax decoding with the full decoder re-run every step (no cache, no SequenceGenerator);
    like fairseq: <pad> never, </s> not first, </s> forced after max_new tokens."""
    prev = torch.tensor([[eos]])
    out = []
    with torch.no_grad():
        for step in range(max_new):
            logits = model(src, None, prev)[0][0, -1].clone()
            logits[pad] = float("-inf")
            if step == 0:
                logits[eos] = float("-inf")
            token = int(logits.argmax())
            if token == eos:
                break
            out.append(token)
            prev = torch.cat([prev, torch.tensor([[token]])], dim=1)
    return out


def test_greedy_is_the_argmax_path(generator):
    codec = generator.codec
    lengths = []
    for prompt in PROMPTS:
        src = generator.encode_source(prompt)
        expected = manual_greedy(generator.model, torch.tensor([src]), codec.pad, codec.eos,
                                 MAX_NEW)
        assert generator.generate_ids([src], beam=1)[0][0] == expected
        lengths.append(len(expected))
    assert max(lengths) > 3  # not a trivial immediate </s>


def test_batched_equals_one_by_one(generator):
    sources = [generator.encode_source(p) for p in PROMPTS]
    for beam in (1, 3):
        batched = generator.generate_ids(sources, beam=beam, batch_size=3)
        single = [generator.generate_ids([s], beam=beam)[0] for s in sources]
        assert batched == single


def test_beam_returns_the_best_beams(generator):
    outs = generator.translate(PROMPTS[:2], beam=4, num_return=3)
    assert len(outs) == 2 and all(len(o) == 3 and all(isinstance(s, str) for s in o) for o in outs)
    with pytest.raises(ValueError, match="num_return=3 needs beam >= 3"):
        generator.translate(PROMPTS[0], beam=2, num_return=3)


def test_sampling_is_reproducible_with_a_seed(generator):
    opts = dict(sampling=True, num_return=3, temperature=1.0, top_p=0.95)
    first = generator.translate(PROMPTS, seed=7, **opts)
    assert generator.translate(PROMPTS, seed=7, **opts) == first
    assert generator.translate(PROMPTS, seed=8, **opts) != first
    assert all(len(samples) == 3 for samples in first)


def test_translate_decodes_the_generated_ids(generator):
    ids = generator.generate_ids([generator.encode_source(PROMPTS[0])])[0][0]
    assert generator.translate(PROMPTS[0]) == generator.codec.decode(ids)
    assert isinstance(generator.translate(PROMPTS), list)


def test_infill_keeps_the_text_around_the_hole(generator):
    filled = generator.infill("def f(x):\n\t<extra_id_0>\n    return y\r\n")
    assert filled.startswith("def f(x):\n\t") and filled.endswith("\n    return y\r\n")
    assert "<extra_id_" not in filled
    with pytest.raises(ValueError, match="at least one <extra_id_N> hole"):
        generator.infill("no hole here")


def test_fill_spans_puts_each_span_in_its_hole(generator):
    codec = generator.codec
    s0, s1 = codec.sentinel_id(0), codec.sentinel_id(1)
    source = codec.encode("if x:\n") + [s0] + codec.encode("\nelse:\n") + [s1] + [codec.eos]
    target = [s0] + codec.encode("    y = 1") + [s1] + codec.encode("    y = 2")
    assert codec.decode(fill_spans(source, target, codec)) == "if x:\n    y = 1\nelse:\n    y = 2"
    assert split_spans([7, s1, 8, s0, 9, s1, 10], codec) == {s1: [8], s0: [9]}  # first span wins
    assert codec.decode(fill_spans(source, [s1, 5], codec)).startswith("if x:\n\nelse:")


def test_complete_returns_the_continuation(generator):
    assert isinstance(generator.complete("def f(x):\n    "), str)
    samples = generator.complete(["a", "b"], sampling=True, num_return=2, seed=1)
    assert len(samples) == 2 and all(len(s) == 2 for s in samples)


def test_invalid_options_are_one_line_errors():
    for bad in (dict(beam=0), dict(top_p=1.5), dict(temperature=0), dict(max_new_tokens=0)):
        with pytest.raises(ValueError, match="invalid generation option"):
            GenerationOptions(**bad).validate()


def test_checkpoint_errors(tmp_path, tiny_checkpoint_dir, code_corpus):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(str(tmp_path / "missing"))
    with pytest.raises(CheckpointError, match="contains none of"):
        load_checkpoint(str(tmp_path))
    from ast_t5_preprocess.tokenizer import train_sentencepiece

    other = tmp_path / "other_tok"  # a different vocabulary size than the model's
    texts = [p.read_text(encoding="utf-8") for p in sorted(code_corpus.rglob("*.py"))[:3]]
    train_sentencepiece(texts, str(other), vocab_size=500, num_sentinels=8)
    with pytest.raises(CheckpointError, match="wrong tokenizer"):
        load_checkpoint(str(tiny_checkpoint_dir), tokenizer_dir=str(other))


def test_half_precision_weights(tiny_checkpoint_dir):
    generator = AstT5Generator.from_checkpoint(str(tiny_checkpoint_dir), device="cpu",
                                               dtype="bfloat16", max_new_tokens=4)
    assert next(generator.model.parameters()).dtype == torch.bfloat16
    assert isinstance(generator.translate("x = 1"), str)
    with pytest.raises(ValueError, match="dtype must be one of"):
        AstT5Generator.from_checkpoint(str(tiny_checkpoint_dir), dtype="int8")
