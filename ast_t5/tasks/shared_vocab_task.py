"""Base of the AST-T5 tasks: one dictionary for source and target (tied embeddings)."""
from fairseq.tasks import FairseqTask

from .. import distributed
from ..optim.mixed_precision import fp16_optimizer_step, takes_fast_step


class SharedVocabTask(FairseqTask):
    """A task whose source and target share ``self.dictionary`` and whose length limits are
    ``cfg.max_source_positions`` / ``cfg.max_target_positions``."""

    dictionary = None

    def __init__(self, cfg):
        super().__init__(cfg)
        distributed.check_launch()  # several processes launched, one trains: one line, exit 2

    def get_batch_iterator(self, *args, **kwargs):
        return distributed.track_world_size(super().get_batch_iterator(*args, **kwargs), self.cfg)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        distributed.check_replicas(model, update_num, getattr(self.cfg, "replica_check_interval", 0))
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def optimizer_step(self, optimizer, model, update_num):
        """FairseqTask's step, or under bf16 the same step without FP16Optimizer's per-parameter
        copies and zeroing (ast_t5/optim/mixed_precision.py)."""
        if takes_fast_step(optimizer):
            fp16_optimizer_step(optimizer)
        else:
            super().optimizer_step(optimizer, model, update_num)

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def max_positions(self):
        return (self.cfg.max_source_positions, self.cfg.max_target_positions)
