"""Cross-entropy for span corruption, with the metrics pre-training logs.

Besides the loss it logs the accuracy of the decoder on the masked tokens (target positions that
are neither a sentinel nor ``</s>``) and, when the batch says which language each sample comes
from, each language's share of the batch's target tokens (``share_<lang>``). All logged values
are sums over samples, so they can be summed across workers.

In training it also logs the model's FLOP rate, ``tflops`` (per process, DESIGN.md section 8's
count made exact: `ast_t5.models.flops`), on a GPU whose peak is known ``mfu``: that rate over the
device's dense bf16 peak, in percent (model-FLOPs utilization), and ``src_wps``: non-pad source
tokens per second over all processes (fairseq's ``wps`` counts the target tokens, ``ntokens``).

No value is read back to the host inside the update: every logged count stays a device tensor
(fairseq reads them when it reduces the logs at the end of the update), so the CPU keeps queueing
the backward while the forward runs.

Two ways to compute the loss (``fused_cross_entropy``):

- ``eager`` (the CPU path): the decoder's logits, fp32 log-probabilities over the vocabulary
  (B x T x V x 4 bytes), negative log-likelihood;
- ``liger``: liger-kernel's fused linear cross-entropy (Triton, CUDA only) takes the decoder's
  final features and the output matrix and computes the loss, its gradient and the arg-max
  chunk by chunk, so neither the logits nor their fp32 log-probabilities exist in memory. It is
  an optional import (``pip install liger-kernel``), used with label_smoothing 0 (it cannot also
  give the unsmoothed nll that is logged).
- ``auto`` (default): ``liger`` when the model is on a CUDA device, liger-kernel imports and
  label_smoothing is 0; ``eager`` otherwise. ``liger`` demands it and fails in one line if it
  cannot run. ``self.last_path`` says which ran.
"""
import logging
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..models.flops import device_peak_tflops, training_flops

logger = logging.getLogger(__name__)

FUSED_CE_CHOICES = ("auto", "eager", "liger")


def liger_fused_linear_ce():
    """liger-kernel's LigerFusedLinearCrossEntropyLoss class, or None with the reason."""
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except Exception as e:  # ImportError, or triton failing to initialize
        return None, f"liger-kernel is not importable ({type(e).__name__}: {e})"
    return LigerFusedLinearCrossEntropyLoss, ""


@dataclass
class SpanCrossEntropyConfig(FairseqDataclass):
    label_smoothing: float = field(default=0.0, metadata={"help": "epsilon for label smoothing"})
    fused_cross_entropy: ChoiceEnum(list(FUSED_CE_CHOICES)) = field(default="auto", metadata={
        "help": "auto: liger-kernel's fused linear cross-entropy on CUDA when installed and "
                "label_smoothing=0, else eager; eager: logits then log-softmax; liger: demand the fused one"})


@register_criterion("ast_t5_span_cross_entropy", dataclass=SpanCrossEntropyConfig)
class SpanCrossEntropyCriterion(FairseqCriterion):
    def __init__(self, task, label_smoothing: float = 0.0, fused_cross_entropy: str = "auto"):
        super().__init__(task)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1)")
        fused_cross_entropy = str(fused_cross_entropy)
        if fused_cross_entropy not in FUSED_CE_CHOICES:
            raise ValueError(f"fused_cross_entropy must be one of {FUSED_CE_CHOICES}, got {fused_cross_entropy!r}")
        if fused_cross_entropy == "liger" and label_smoothing > 0:
            raise ValueError("criterion.fused_cross_entropy=liger needs label_smoothing=0 "
                             "(the fused kernel cannot also give the logged nll)")
        self.eps = label_smoothing
        self.fused_choice = fused_cross_entropy
        self._fused_fn = None
        self._fused_logged = False
        self.last_path = None
        sentinels = getattr(task, "sentinels", None)
        self.first_sentinel = sentinels.first_sentinel if sentinels is not None else None
        self.eos = task.target_dictionary.eos()

    def forward(self, model, sample, reduce=True):
        target = sample["target"]  # (B, T)
        if self._use_fused(model):
            loss, nll, predicted = self._fused_loss(model, sample, target)
        else:
            loss, nll, predicted = self._eager_loss(model, sample, target)
        ntokens = sample["ntokens"]
        log = {"loss": loss.data, "nll_loss": nll.data, "ntokens": ntokens,
               "nsentences": sample["nsentences"], "sample_size": ntokens}
        log.update(self._accuracy(predicted, target))
        log.update(self._language_shares(sample, target))
        if model.training:
            log.update(self._model_flops(model, sample))
        return loss, ntokens, log

    def _model_flops(self, model, sample):
        """This step's model FLOPs (host arithmetic on the batch's padded shapes: no sync), and,
        once per process, the device's peak that turns their rate into MFU."""
        global _DEVICE_PEAK_TFLOPS
        src, prev = sample["net_input"]["src_tokens"], sample["net_input"]["prev_output_tokens"]
        try:
            flops = training_flops(model, src.size(0), src.size(1), prev.size(1))
        except AttributeError:  # not an AstT5Model (no encoder/decoder/cfg): nothing to count
            return {}
        if _DEVICE_PEAK_TFLOPS is None:
            _DEVICE_PEAK_TFLOPS = device_peak_tflops(src.device) or 0.0
        out = {"flops": flops}
        host = sample.get("host")
        if host is not None and "src_lengths" in host:  # the collater's numpy copy: no device read
            out["src_tokens"] = int(host["src_lengths"].sum())
        return out

    def _eager_loss(self, model, sample, target):
        self.last_path = "eager"
        net_output = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True).float()  # (B, T, V)
        flat = lprobs.view(-1, lprobs.size(-1))
        nll = F.nll_loss(flat, target.view(-1), ignore_index=self.padding_idx, reduction="sum")
        loss = nll
        if self.eps > 0:
            keep = target.view(-1).ne(self.padding_idx)
            smooth = -flat.sum(-1)[keep].sum() / flat.size(-1)
            loss = (1 - self.eps) * nll + self.eps * smooth
        with torch.no_grad():
            predicted = lprobs.argmax(-1)
        return loss, nll, predicted

    def _use_fused(self, model) -> bool:
        if self.fused_choice == "eager":
            return False
        if self._fused_fn is not None:
            return True
        reason = ""
        decoder = getattr(model, "decoder", None)
        weight = output_weight(decoder) if decoder is not None else None
        if weight is None:
            reason = "the model's decoder has no output matrix to fuse with"
        elif weight.device.type != "cuda":
            reason = f"the model is on {weight.device.type}, the fused kernel is CUDA only"
        elif self.eps > 0:
            reason = "label_smoothing > 0"
        else:
            cls, reason = liger_fused_linear_ce()
            if cls is not None:
                try:
                    self._fused_fn = cls(ignore_index=self.padding_idx, reduction="sum",
                                         return_predicted_tokens=True)
                except TypeError:  # releases before return_predicted_tokens (liger-kernel 0.8)
                    reason = "liger-kernel is too old (needs return_predicted_tokens: >= 0.8)"
                else:
                    logger.info("cross-entropy: liger-kernel fused linear cross-entropy (no logits in memory)")
                    return True
        if self.fused_choice == "liger":
            raise RuntimeError(f"criterion.fused_cross_entropy=liger cannot run: {reason}")
        if not self._fused_logged:
            logger.info("cross-entropy: eager (%s)", reason)
            self._fused_logged = True
        return False

    def _fused_loss(self, model, sample, target):
        self.last_path = "liger"
        features, _ = model(**sample["net_input"], features_only=True)  # (B, T, C)
        weight = output_weight(model.decoder)
        out = self._fused_fn(weight, features.reshape(-1, features.size(-1)), target.reshape(-1))
        loss = out.loss.float()
        return loss, loss, out.predicted_tokens.view_as(target)

    def _accuracy(self, predicted, target):
        with torch.no_grad():
            masked = target.ne(self.padding_idx) & target.ne(self.eos)
            if self.first_sentinel is not None:
                masked &= target.lt(self.first_sentinel)
            correct = (predicted.eq(target) & masked).sum()
        return {"n_masked": masked.sum(), "n_correct": correct}

    def _language_shares(self, sample, target):
        names = getattr(self.task, "languages", None)
        if "language" not in sample or not names:
            return {}
        counts = target.ne(self.padding_idx).sum(1)
        per_language = counts.new_zeros(len(names)).index_add_(0, sample["language"].to(counts.device), counts)
        return {f"lang_tokens:{name}": per_language[k] for k, name in enumerate(names)}

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = lambda key: sum(log.get(key, 0) for log in logging_outputs)
        loss, nll, ntokens = total("loss"), total("nll_loss"), total("ntokens")
        sample_size = total("sample_size")
        metrics.log_scalar("loss", loss / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", nll / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda m: 2 ** m["nll_loss"].avg if m["nll_loss"].avg < 64 else float("inf"))
        if any("n_masked" in log for log in logging_outputs):
            # sums, read only when the logs are printed: no host sync here
            # (a leading "_" keeps fairseq from printing the counts themselves)
            metrics.log_scalar_sum("_n_masked", total("n_masked"))
            metrics.log_scalar_sum("_n_correct", total("n_correct"))
            metrics.log_derived("masked_accuracy", _masked_accuracy)
        keys = {k for log in logging_outputs for k in log if k.startswith("lang_tokens:")}
        for key in sorted(keys):
            metrics.log_scalar("share_" + key.split(":", 1)[1], total(key) / max(ntokens, 1), ntokens, round=3)
        flops = total("flops")
        if flops:
            # model TFLOP/s per process (the sum covers every rank), and its share of the GPU's peak
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            metrics.log_speed("tflops", float(flops) / 1e12 / world, priority=95, round=2)
            if any("src_tokens" in log for log in logging_outputs):  # non-pad source tokens/s, all ranks
                metrics.log_speed("src_wps", float(total("src_tokens")), priority=91, round=1)
            if _DEVICE_PEAK_TFLOPS:
                metrics.log_derived("mfu", _mfu)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


_DEVICE_PEAK_TFLOPS = None  # dense bf16 peak of this process's device (0: unknown), set at the first step


def _mfu(meters):
    """Model-FLOPs utilization in percent: the logged TFLOP/s over the device's dense bf16 peak."""
    return round(100.0 * meters["tflops"].avg / _DEVICE_PEAK_TFLOPS, 1)


def _masked_accuracy(meters):
    n = float(meters["_n_masked"].sum)
    return round(100.0 * float(meters["_n_correct"].sum) / n, 2) if n else 0.0


def output_weight(decoder):
    """The (V, C) matrix of an ast_t5 decoder's output layer (tied embedding or separate head)."""
    projection = getattr(decoder, "output_projection", None)
    if projection is not None:
        return getattr(projection, "weight", None)
    if hasattr(decoder, "output_layer") and hasattr(decoder, "embed_tokens"):
        return decoder.embed_tokens.weight
    return None
