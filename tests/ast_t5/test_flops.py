"""The model-FLOPs count behind the training log's ``tflops``/``mfu`` and the benchmarks' MFU
(ast_t5/models/flops.py): equal to what torch.utils.flop_counter counts in a real step, and
logged by the criterion in training only."""
import numpy as np
import pytest
import torch
from fairseq import metrics
from fairseq.data import Dictionary

from ast_t5.criterions import span_cross_entropy as sce
from ast_t5.models import AstT5Model
from ast_t5.models.flops import peak_tflops_for, training_flops


def dictionary(n=60):
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"tok{i}")
    return d


@pytest.mark.parametrize("arch", ["t5_v11_tiny", "ast_t5_paper_tiny"])
@pytest.mark.parametrize("shape", [(3, 24, 10), (2, 7, 19)])
def test_count_equals_the_flop_counter_on_a_real_training_step(arch, shape):
    """Forward + backward of the eager attention path (every product is an mm/bmm the counter
    sees): untied (T5 v1.1) and tied (paper) heads, cross-attention keys from the source length,
    causal attention counted in full, target longer than the source too."""
    # imported here, not at collection: it imports triton, which must first be imported by
    # test_triton_rpe_attention under TRITON_INTERPRET=1 for its checks to run in-process
    from torch.utils.flop_counter import FlopCounterMode

    bsz, src_len, tgt_len = shape
    torch.manual_seed(0)
    d = dictionary()
    model = AstT5Model.from_dictionary(d, arch=arch, dropout=0.0, attention_dropout=0.0,
                                       attention_backend="torch").train()
    src = torch.randint(4, len(d), (bsz, src_len))
    prev = torch.randint(4, len(d), (bsz, tgt_len))
    with FlopCounterMode(display=False) as counter:
        model(src, None, prev)[0].float().logsumexp(-1).sum().backward()
    assert training_flops(model, bsz, src_len, tgt_len) == counter.get_total_flops()


def test_peaks_by_device_name():
    assert peak_tflops_for("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops_for("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops_for("NVIDIA H200") == 989.0
    assert peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops_for("NVIDIA A10G") == 70.0 and peak_tflops_for("NVIDIA A10") == 125.0
    assert peak_tflops_for("Some Future GPU") is None


class _Task:
    def __init__(self, d):
        self.target_dictionary = self.source_dictionary = d


def test_criterion_logs_model_flops_in_training_only_and_mfu_with_a_known_peak(monkeypatch):
    d = dictionary()
    torch.manual_seed(0)
    model = AstT5Model.from_dictionary(d, arch="t5_v11_tiny", dropout=0.0, attention_dropout=0.0)
    criterion = sce.SpanCrossEntropyCriterion(_Task(d), fused_cross_entropy="eager")
    src = torch.randint(4, len(d), (2, 16))
    prev = torch.randint(4, len(d), (2, 6))
    target = torch.randint(4, len(d), (2, 6))
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([16, 16]), "prev_output_tokens": prev},
              "target": target, "ntokens": 12, "nsentences": 2,
              "host": {"id": np.arange(2), "src_lengths": np.array([16, 11])}}  # the collater's copies
    monkeypatch.setattr(sce, "_DEVICE_PEAK_TFLOPS", None)
    _, _, log = criterion(model.train(), sample)
    assert log["flops"] == training_flops(model, 2, 16, 6) and log["src_tokens"] == 27
    assert sce._DEVICE_PEAK_TFLOPS == 0.0  # CPU: no peak, so no mfu
    with torch.no_grad():
        _, _, valid_log = criterion(model.eval(), sample)
    assert "flops" not in valid_log

    with metrics.aggregate(new_root=True) as agg:
        sce.SpanCrossEntropyCriterion.reduce_metrics([log])  # the first call starts the rate meter
        sce.SpanCrossEntropyCriterion.reduce_metrics([log, log])
        values = agg.get_smoothed_values()
    assert values["tflops"] > 0 and values["src_wps"] > 0 and "mfu" not in values
    assert agg["tflops"].n == pytest.approx(2 * log["flops"] / 1e12) and agg["src_wps"].n == 54

    # a known peak: mfu = rate / peak in percent (on a fake clock: 2 s between the two updates)
    from fairseq.logging import meters

    now = [100.0]  # the meters start at t = 100 s, their rates are read at t = 102 s
    monkeypatch.setattr(meters.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(sce, "_DEVICE_PEAK_TFLOPS", 1e-6)
    with metrics.aggregate(new_root=True) as agg:
        sce.SpanCrossEntropyCriterion.reduce_metrics([log])
        sce.SpanCrossEntropyCriterion.reduce_metrics([log])
        now[0] = 102.0
        mfu = agg.get_smoothed_values()["mfu"]
    assert mfu == pytest.approx(100.0 * (log["flops"] / 1e12 / 2.0) / 1e-6, abs=0.1)
    monkeypatch.undo()
    with metrics.aggregate(new_root=True) as agg:  # validation: no flops, no rate
        sce.SpanCrossEntropyCriterion.reduce_metrics([valid_log])
        assert "tflops" not in agg.get_smoothed_values()
