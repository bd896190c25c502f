"""Tests of the ast_t5_pretraining task on real preprocessed data: validation at load, samples,
batches, determinism, DataLoader workers, mixture, and the optimizers/schedules configs select."""
import shutil

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import ast_t5  # noqa: F401
from ast_t5.data.loading import DataError, mixture_probabilities
from ast_t5.data.sentinels import reconstruct
from ast_t5.tasks.ast_t5_pretraining import AstT5PretrainingConfig, AstT5PretrainingTask
from ast_t5_preprocess.formats import IndexedReader, IndexedWriter


def make_task(data, **overrides):
    cfg = OmegaConf.structured(AstT5PretrainingConfig(data=str(data), seed=3, **overrides))
    return AstT5PretrainingTask.setup_task(cfg)


def test_samples_reconstruct_and_batches_follow_the_decoder_convention(pretrain_data):
    task = make_task(pretrain_data)
    task.load_dataset("train")
    ds = task.datasets["train"]
    assert set(ds.language_names) >= {"python", "rust", "go"}
    for i in range(0, len(ds), max(1, len(ds) // 40)):
        item = ds[i]
        k, j = ds.index[i]
        original = ds.datasets[k].tokens[int(j)].numpy()
        np.testing.assert_array_equal(reconstruct(item["source"], item["target"], task.sentinels), original)
        assert item["target"].max() < len(task.dictionary)
    batch = ds.collater([ds[i] for i in range(4)])
    prev, tgt = batch["net_input"]["prev_output_tokens"], batch["target"]
    assert (prev[:, 0] == task.dictionary.eos()).all()
    lengths = tgt.ne(task.dictionary.pad()).sum(1)
    for row in range(4):
        n = int(lengths[row])
        assert torch.equal(prev[row, 1:n], tgt[row, : n - 1])
    assert batch["language"].shape == (4,)


def test_same_seed_epoch_index_same_sample_new_epoch_new_masks(pretrain_data):
    task = make_task(pretrain_data)
    task.load_dataset("train")
    inner = task.datasets["train"].datasets[task.datasets["train"].language_names.index("python")]
    a, b = inner.corrupt(5, epoch=1), inner.corrupt(5, epoch=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = inner.corrupt(5, epoch=2)
    assert not np.array_equal(a[0], c[0])


def test_dataloader_workers_give_the_same_batches(pretrain_data):
    task = make_task(pretrain_data)
    task.load_dataset("train")
    ds = task.datasets["train"]
    idx = list(range(0, min(len(ds), 64)))
    load = lambda n: [b["net_input"]["src_tokens"] for b in torch.utils.data.DataLoader(
        torch.utils.data.Subset(ds, idx), batch_size=8, collate_fn=ds.collater, num_workers=n)]
    for x, y in zip(load(0), load(2)):
        assert torch.equal(x, y)


def test_per_language_validation_subsets(pretrain_data):
    task = make_task(pretrain_data)
    task.load_dataset("valid")
    task.load_dataset("valid_python")
    assert 0 < len(task.datasets["valid_python"]) <= len(task.datasets["valid"])
    with pytest.raises(DataError, match="no valid data for rust"):
        task.load_dataset("valid_rust")


def test_mixture_follows_probabilities_and_temperature():
    probs = mixture_probabilities({"python": 0.8, "java": 0.2}, temperature=1.0)
    assert probs == pytest.approx({"python": 0.8, "java": 0.2})
    flat = mixture_probabilities({"python": 0.8, "java": 0.2}, temperature=1e6)
    assert flat["java"] == pytest.approx(0.5, abs=1e-3)
    with pytest.raises(DataError):
        mixture_probabilities({"python": 1.0}, temperature=0)


@pytest.mark.parametrize("field,value,word", [("mask_prob", 1.5, "mask_prob"),
                                               ("threshold_ub", 2, "threshold_ub"),
                                               ("mask_multiple_length", 1, "mask_multiple_length"),
                                               ("noise_density", 0.0, "noise_density")])
def test_bad_objective_values_are_one_line_errors(pretrain_data, field, value, word):
    with pytest.raises(ValueError, match=word) as err:
        make_task(pretrain_data, **{field: value})
    assert "\n" not in str(err.value)


def _copy(data, tmp_path):
    dst = tmp_path / "data"
    shutil.copytree(data, dst)
    return dst


def test_mismatched_token_and_ast_datasets_name_the_files(pretrain_data, tmp_path):
    data = _copy(pretrain_data, tmp_path)
    prefix = str(data / "python" / "train.ast")
    items = list(IndexedReader(prefix))
    w = IndexedWriter(prefix, np.int32)
    for it in items[:-1]:  # one item short
        w.add(it)
    w.close()
    task = make_task(data)
    with pytest.raises(DataError, match=r"python/train\.idx has \d+ items but .*train\.ast\.idx has"):
        task.load_dataset("train")


def test_out_of_range_ast_spans_are_caught(pretrain_data, tmp_path):
    data = _copy(pretrain_data, tmp_path)
    prefix = str(data / "rust" / "train.ast")
    items = [it.copy() for it in IndexedReader(prefix)]
    items[0][4] = 10_000  # an end far past the segment
    w = IndexedWriter(prefix, np.int32)
    for it in items:
        w.add(it)
    w.close()
    task = make_task(data, ast_check="full")
    with pytest.raises(DataError, match=r"rust/train\.ast item 0"):
        task.load_dataset("train")


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        make_task(tmp_path)


@pytest.mark.parametrize("optimizer,scheduler", [("t5_adafactor", "inverse_sqrt"), ("adamw_scale", "cosine"),
                                                 ("adam", "polynomial_decay")])
def test_optimizers_and_schedules_are_selectable(optimizer, scheduler):
    from fairseq import optim
    from fairseq.dataclass.utils import merge_with_parent
    from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY
    from fairseq.optim.lr_scheduler import LR_SCHEDULER_DATACLASS_REGISTRY, build_lr_scheduler

    model = torch.nn.Linear(4, 3)
    extra = {"tpu": False} if optimizer == "adam" else {}  # adam reads common.tpu
    ocfg = merge_with_parent(OPTIMIZER_DATACLASS_REGISTRY[optimizer](), OmegaConf.create(
        {"_name": optimizer, "lr": [0.01], **extra}))
    opt = optim.build_optimizer(ocfg, list(model.parameters()))
    scfg = merge_with_parent(LR_SCHEDULER_DATACLASS_REGISTRY[scheduler](), OmegaConf.create(
        {"_name": scheduler, "lr": [0.01], "warmup_updates": 2, "max_update": 10, "total_num_update": 10}),
        remove_missing=True)
    sched = build_lr_scheduler(scfg, opt)
    before = model.weight.detach().clone()
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        sched.step_update(step + 1)
    assert not torch.equal(before, model.weight)


def test_adamw_scale_step_is_relative_to_the_parameter_rms():
    from ast_t5.optim.adamw_scale import AdamWScale

    small, big = torch.nn.Parameter(torch.full((4,), 0.01)), torch.nn.Parameter(torch.full((4,), 10.0))
    opt = AdamWScale([small, big], lr=0.1)
    small.grad, big.grad = torch.ones(4), torch.ones(4)
    opt.step()
    # first Adam step is lr * rms(p) * sign(g): 0.1 * max(1e-3, 0.01) and 0.1 * 10
    assert torch.allclose(0.01 - small.detach(), torch.full((4,), 0.001), atol=1e-6)
    assert torch.allclose(10.0 - big.detach(), torch.full((4,), 1.0), atol=1e-4)


def test_language_labels_name_the_right_language_when_a_split_lacks_one(pretrain_data, tmp_path):
    """share_<lang> labels index the task's full language list, even when the valid mixture
    drops a language (here: the first one, whose valid files are removed)."""
    import os

    data = tmp_path / "data"
    shutil.copytree(pretrain_data, data)
    task = make_task(data)
    dropped = task.languages[0]
    for ext in (".bin", ".idx", ".ast.bin", ".ast.idx"):
        if os.path.exists(data / dropped / f"valid{ext}"):
            os.remove(data / dropped / f"valid{ext}")
    task = make_task(data)
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    assert dropped not in ds.language_names and ds.language_names
    # the mixture's own position of a language differs from its index in the task's list
    assert any(task.languages.index(l) != k for k, l in enumerate(ds.language_names))
    for i in range(len(ds)):
        k, _ = ds.index[i]
        assert task.languages[ds[i]["language"]] == ds.language_names[k]
    other = ds.language_names[-1]
    task.load_dataset(f"valid_{other}")
    assert {task.languages[task.datasets[f"valid_{other}"][i]["language"]]
            for i in range(len(task.datasets[f"valid_{other}"]))} == {other}
