"""ast_t5/tasks/seq2seq_finetuning.py and ast_t5/generation/scoring.py, in process (no training)."""
import dataclasses
import math

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.logging import metrics
from omegaconf import OmegaConf

from ast_t5.eval.metrics import text_metrics
from ast_t5.generation.checkpoints import TOKENIZER_STATE_KEY
from ast_t5.generation.scoring import generation_stats, log_generation_metrics
from ast_t5.tasks.seq2seq_finetuning import (Seq2SeqFinetuningConfig, Seq2SeqFinetuningTask,
                                             freeze_parameters)


TINY = {"_name": "t5_v11_tiny", "family": "t5_v11", "embed_dim": 32, "ffn_dim": 64, "num_heads": 4,
        "head_dim": 8, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0,
        "attention_dropout": 0.0}


def make_task(data, tokenizer, **overrides):
    cfg = dataclasses.replace(Seq2SeqFinetuningConfig(), data=str(data), tokenizer=str(tokenizer),
                              max_source_positions=64, max_target_positions=16,
                              eval_max_new_tokens=6, **overrides)
    return Seq2SeqFinetuningTask.setup_task(cfg)


def build(task):
    torch.manual_seed(0)
    return task.build_model(OmegaConf.create(dict(TINY)))


def test_task_loads_splits_and_stores_its_tokenizer(seq2seq_data, tokenizer_dir):
    task = make_task(seq2seq_data, tokenizer_dir)
    task.load_dataset("valid")
    assert len(task.datasets["valid"]) == 8
    assert len(task.source_dictionary) == task.codec.vocab_size
    assert task.state_dict()[TOKENIZER_STATE_KEY]["num_sentinels"] == 32
    with pytest.raises(FileNotFoundError, match="nope.jsonl not found"):
        task.load_dataset("nope")


def test_config_errors_are_one_line(tmp_path, tokenizer_dir):
    with pytest.raises(ValueError, match="no such directory"):
        make_task(tmp_path / "missing", tokenizer_dir)
    with pytest.raises(ValueError, match="leaves nothing to train"):
        make_task(tmp_path, tokenizer_dir, freeze_encoder=True, freeze_decoder=True,
                  freeze_embeddings=True)
    with pytest.raises(FileNotFoundError, match="not a tokenizer directory"):
        make_task(tmp_path, tmp_path)


@pytest.mark.parametrize("flags", [dict(freeze_encoder=True), dict(freeze_decoder=True),
                                   dict(freeze_embeddings=True),
                                   dict(freeze_encoder=True, freeze_embeddings=True)])
def test_freezing_selects_the_right_parameters(seq2seq_data, tokenizer_dir, flags):
    model = build(make_task(seq2seq_data, tokenizer_dir, **flags))
    for name, p in model.named_parameters():
        if name == "encoder.embed_tokens.weight":
            expected_frozen = flags.get("freeze_embeddings", False)
        else:
            expected_frozen = flags.get(f"freeze_{name.split('.')[0]}", False)
        assert p.requires_grad != expected_frozen, name
    assert any(p.requires_grad for p in model.parameters())


def test_freezing_everything_is_refused(seq2seq_data, tokenizer_dir):
    model = build(make_task(seq2seq_data, tokenizer_dir))
    with pytest.raises(ValueError, match="every parameter is frozen"):
        freeze_parameters(model, True, True, True)


def test_valid_step_logs_exact_match_and_bleu(seq2seq_data, tokenizer_dir, monkeypatch):
    task = make_task(seq2seq_data, tokenizer_dir)
    model = build(task)
    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    halves = [ds.collater([ds[i] for i in range(4)]), ds.collater([ds[i] for i in range(4, 8)])]
    real = task.generate_texts(halves[0])
    assert len(real) == 4 and all(isinstance(h, str) for h in real)
    # a "model" that gets every other example right, so both metrics are informative
    fake = {id(b): [t if i % 2 == 0 else t + " wrong" for i, t in enumerate(b["target_text"])]
            for b in halves}
    monkeypatch.setattr(task, "generate_texts", lambda sample: fake[id(sample)])
    logs = [task.valid_step(b, model, criterion)[2] for b in halves]
    assert all(math.isfinite(float(log["loss"])) for log in logs)
    with metrics.aggregate(new_root=True) as agg:
        for log in logs:  # fairseq reduces every validation batch separately
            task.reduce_metrics([log], criterion)
        values = agg.get_smoothed_values()
    hyps = fake[id(halves[0])] + fake[id(halves[1])]
    refs = halves[0]["target_text"] + halves[1]["target_text"]
    expected = text_metrics(hyps, [refs])
    assert values["exact_match"] == pytest.approx(50.0)
    assert values["bleu"] == pytest.approx(expected["bleu"], abs=0.01) and values["bleu"] > 0
    assert "loss" in values and "_em_hits" not in values


def test_generation_stats_sum_to_corpus_metrics():
    hyps = ["def f ( x ) : return x", "a = b + c", "x", "print ( 'hi' )", "", "same"]
    refs = ["def f(x): return x", "a = b - c", "y", "print('hello')", "nonempty", "same"]
    with metrics.aggregate(new_root=True) as agg:
        log_generation_metrics([generation_stats(hyps[:2], refs[:2]),
                                generation_stats(hyps[2:], refs[2:])])
        values = agg.get_smoothed_values()
    expected = text_metrics(hyps, [refs])
    assert values["bleu"] == pytest.approx(expected["bleu"], abs=0.01)
    assert values["exact_match"] == pytest.approx(expected["exact_match"], abs=0.01)
    for tokenize in ("13a", "none"):
        stats = generation_stats(hyps, refs, bleu_tokenize=tokenize)
        with metrics.aggregate(new_root=True) as agg:
            log_generation_metrics([stats])
            assert agg.get_smoothed_values()["bleu"] == pytest.approx(
                text_metrics(hyps, [refs], tokenize=tokenize)["bleu"], abs=0.01)


def test_training_logs_have_no_generation_metrics():
    with metrics.aggregate(new_root=True) as agg:
        log_generation_metrics([{"loss": 1.0}])
        assert "bleu" not in agg.get_smoothed_values()


def test_task_limits_must_fit_the_model(seq2seq_data, tokenizer_dir):
    task = make_task(seq2seq_data, tokenizer_dir)
    task.cfg.max_target_positions = 4096
    with pytest.raises(ValueError, match="task.max_target_positions=4096 exceeds model"):
        build(task)
