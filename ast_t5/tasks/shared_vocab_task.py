"""Base of the AST-T5 tasks: one dictionary for source and target (tied embeddings)."""
from fairseq.tasks import FairseqTask


class SharedVocabTask(FairseqTask):
    """A task whose source and target share ``self.dictionary`` and whose length limits are
    ``cfg.max_source_positions`` / ``cfg.max_target_positions``."""

    dictionary = None

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def max_positions(self):
        return (self.cfg.max_source_positions, self.cfg.max_target_positions)
