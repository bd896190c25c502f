"""Configuration of the ``ast_t5`` fairseq model: sizes as fields, structure by family.

Two families share one model class:

- ``ast_t5_paper`` (the AST-T5 paper's model, spec section 7): post-LayerNorm, learned absolute
  positions in both stacks, LayerNorm on the embeddings, a bucketed relative-position bias owned by
  every encoder layer (none in the decoder), ReLU, biases in all projections, q·k scaled by
  head_dim^-0.5, input and output embeddings all tied, no final norm.
- ``t5_v11`` (Google's T5 v1.1): pre-RMSNorm, gated GELU, no biases, no absolute positions, one
  relative-position table shared by the layers of each stack (bidirectional in the encoder, causal
  in the decoder), no q·k scaling, final RMSNorm in both stacks, untied output head. Exports to
  Hugging Face ``T5ForConditionalGeneration`` (see hf_conversion.py).
"""
from dataclasses import dataclass, field, fields
from typing import NamedTuple, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ast_t5.modules.attention_backends import ATTENTION_BACKENDS
from ast_t5.modules.liger_norm_ffn import FUSED_NORM_FFN_CHOICES

from .presets import ARCH_PRESETS

FAMILIES = ("ast_t5_paper", "t5_v11")
FamilyChoice = ChoiceEnum(list(FAMILIES))
AttentionBackendChoice = ChoiceEnum(list(ATTENTION_BACKENDS))
FusedNormFfnChoice = ChoiceEnum(list(FUSED_NORM_FFN_CHOICES))
COMPILE_SCOPES = ("model", "layers")
CompileScopeChoice = ChoiceEnum(list(COMPILE_SCOPES))
# torch.compile's modes that keep the trainer's own launches: the CUDA-graph modes (reduce-overhead,
# max-autotune) record one graph per input shape, and the training batches' shapes vary
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
CompileModeChoice = ChoiceEnum(list(COMPILE_MODES))
MIN_REL_POS_BUCKETS = 4  # bidirectional tables split in halves, each with exact and log buckets
DEFAULT_ARCH = "t5_v11_base"  # sizes of a model configured as plain model._name=ast_t5


class FamilyStructure(NamedTuple):
    """The structural switches that a family fixes (not configurable one by one)."""

    norm: str  # "layernorm" | "rmsnorm"
    normalize_before: bool
    activation: str  # "relu" | "gated-gelu"
    bias: bool
    learned_positions: bool
    layernorm_embedding: bool
    final_norm: bool
    per_layer_encoder_bias: bool  # True: a table per encoder layer; False: one per stack
    decoder_bias: bool
    scale_by_head_dim: bool
    tie_output: bool


FAMILY_STRUCTURE = {
    "ast_t5_paper": FamilyStructure("layernorm", False, "relu", True, True, True, False,
                                    True, False, True, True),
    "t5_v11": FamilyStructure("rmsnorm", True, "gated-gelu", False, False, False, True,
                              False, True, False, False),
}


@dataclass
class AstT5Config(FairseqDataclass):
    # Fields an architecture preset sets default to None ("from the preset"): fairseq's Hydra path
    # merges the dataclass defaults into model._name=<arch> configs *before* the preset runs, so a
    # concrete default here would hide every preset. Unset after the preset (plain model._name=
    # ast_t5): the sizes of DEFAULT_ARCH.
    family: Optional[FamilyChoice] = field(default=None, metadata={"help": "model family: " + ", ".join(FAMILIES)})
    embed_dim: Optional[int] = field(default=None, metadata={"help": "model width (d_model)"})
    ffn_dim: Optional[int] = field(default=None, metadata={"help": "feed-forward hidden width (d_ff)"})
    num_heads: Optional[int] = field(default=None, metadata={"help": "attention heads"})
    head_dim: Optional[int] = field(
        default=None, metadata={"help": "width per head (d_kv); 0 = embed_dim // num_heads"})
    encoder_layers: Optional[int] = field(default=None, metadata={"help": "encoder layers"})
    decoder_layers: Optional[int] = field(default=None, metadata={"help": "decoder layers"})
    rel_pos_buckets: Optional[int] = field(
        default=None, metadata={"help": "relative-position buckets (paper 128, T5 32)"})
    rel_pos_max_distance: Optional[int] = field(
        default=None, metadata={"help": "distance where relative buckets stop growing (paper 256, T5 128)"})
    max_source_positions: int = field(
        default=1024, metadata={"help": "longest source; sizes the paper family's learned positions"})
    max_target_positions: int = field(
        default=1024, metadata={"help": "longest target; sizes the paper family's learned positions"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings and sub-layer outputs"})
    attention_dropout: float = field(default=0.1, metadata={"help": "dropout on attention probabilities"})
    activation_dropout: float = field(default=0.0, metadata={"help": "dropout inside the feed-forward block"})
    attention_backend: AttentionBackendChoice = field(
        default="auto", metadata={"help": "attention implementation: " + ", ".join(ATTENTION_BACKENDS)
                                  + " (auto follows attention_backends.AUTO_TABLE and logs each choice "
                                  "once; triton: our Triton kernel with the bias per distance, dropout "
                                  "and the table gradient, CUDA only)"})
    fused_norm_ffn: FusedNormFfnChoice = field(
        default="auto", metadata={"help": "RMSNorm and gated GELU (t5_v11): eager (PyTorch ops), liger "
                                  "(liger-kernel's Triton kernels, CUDA, the [gpu] extra; same parameters) "
                                  "or auto (eager until a GPU measurement says otherwise)"})
    checkpoint_activations: bool = field(
        default=False, metadata={"help": "recompute each layer's activations in backward (saves memory)"})
    init_factor: float = field(default=1.0, metadata={"help": "multiplier of every initialization std"})
    compile: bool = field(default=False, metadata={
        "help": "torch.compile the training forward (model(...) with gradients, as fairseq's trainer "
                "and criterion call it); validation, generation and incremental decoding stay eager. "
                "The compile time is logged"})
    compile_backend: str = field(default="inductor", metadata={
        "help": "torch.compile backend (inductor: generated kernels; aot_eager: traced graphs run "
                "by PyTorch's own ops, compiles in seconds, for tests)"})
    compile_dynamic: bool = field(default=True, metadata={
        "help": "with compile: the batch and length dimensions are dynamic from the first graph on "
                "(false: torch's automatic dynamic shapes, which compile the first graph for the first "
                "batch's exact shape and once more at the first change)"})
    compile_scope: CompileScopeChoice = field(default="model", metadata={
        "help": "with compile: what one graph holds. model: the whole training forward (encoder, "
                "decoder, output layer); layers: one encoder layer and one decoder layer, each graph "
                "reused by every layer of its stack (the embeddings, the position bias and the masks run "
                "eagerly between them): T5-base compiled in 0.32x the time on a CPU (benchmarks/bench_compile.py)"})
    compile_mode: CompileModeChoice = field(default="default", metadata={
        "help": "with compile (inductor): torch.compile's mode. max-autotune-no-cudagraphs times "
                "candidate kernels for every matrix product and tunes the generated kernels' block "
                "sizes at the first compile (minutes more on T5-base); the CUDA-graph modes are not "
                "offered, since the batches' shapes vary"})
    compile_pad_multiple: int = field(default=16, metadata={
        "help": "with compile: source and target lengths are padded to a multiple of this inside "
                "the model (outputs cropped back). The graphs are dynamic in the lengths, so this only "
                "keeps every length aligned (16: SDPA's bias rows need no padded copy, inductor's "
                "alignment guard holds); larger multiples compute more padding (64: 7% more FLOPs on "
                "the pre-training batches, 16: 1.7%; benchmarks/bench_padding.py)"})


def structure(cfg: AstT5Config) -> FamilyStructure:
    """The structural switches of ``cfg.family``."""
    return FAMILY_STRUCTURE[str(cfg.family)]


def resolved_head_dim(cfg: AstT5Config) -> int:
    return cfg.head_dim if cfg.head_dim > 0 else cfg.embed_dim // cfg.num_heads


def config_from(source) -> AstT5Config:
    """A complete AstT5Config: the fields ``source`` sets, then DEFAULT_ARCH's preset, then defaults.

    ``source`` is what fairseq hands to ``build_model``: an argparse Namespace, an omegaconf
    DictConfig (after the arch preset filled its unset fields) or an AstT5Config.
    """
    values = {}
    for f in fields(AstT5Config):
        value = source.get(f.name, None) if hasattr(source, "get") else getattr(source, f.name, None)
        if value is not None:
            values[f.name] = str(value) if f.name in ("family", "attention_backend", "fused_norm_ffn") else value
    for name, value in ARCH_PRESETS[DEFAULT_ARCH].items():
        values.setdefault(name, value)
    cfg = AstT5Config(**values)
    validate(cfg)
    return cfg


def validate(cfg: AstT5Config) -> None:
    """Raise ValueError with one line naming the first invalid field."""
    if str(cfg.family) not in FAMILIES:
        raise ValueError(f"model.family must be one of {FAMILIES}, got {cfg.family!r}")
    if str(cfg.attention_backend) not in ATTENTION_BACKENDS:
        raise ValueError(f"model.attention_backend must be one of {ATTENTION_BACKENDS}, got {cfg.attention_backend!r}")
    if str(cfg.fused_norm_ffn) not in FUSED_NORM_FFN_CHOICES:
        raise ValueError(f"model.fused_norm_ffn must be one of {FUSED_NORM_FFN_CHOICES}, got {cfg.fused_norm_ffn!r}")
    for name in ("embed_dim", "ffn_dim", "num_heads", "encoder_layers", "decoder_layers",
                 "max_source_positions", "max_target_positions"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"model.{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.head_dim < 0 or (cfg.head_dim == 0 and cfg.embed_dim % cfg.num_heads):
        raise ValueError(f"model.head_dim must be > 0, or 0 with embed_dim divisible by num_heads; "
                         f"got head_dim={cfg.head_dim}, embed_dim={cfg.embed_dim}, num_heads={cfg.num_heads}")
    if cfg.rel_pos_buckets < MIN_REL_POS_BUCKETS or cfg.rel_pos_buckets % 2:
        raise ValueError(f"model.rel_pos_buckets must be even and >= {MIN_REL_POS_BUCKETS}, got {cfg.rel_pos_buckets}")
    if cfg.rel_pos_max_distance <= cfg.rel_pos_buckets // 2:  # the causal table's exact range
        raise ValueError(f"model.rel_pos_max_distance must exceed rel_pos_buckets / 2, got {cfg.rel_pos_max_distance}")
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ValueError(f"model.{name} must be in [0, 1), got {getattr(cfg, name)}")
    if str(cfg.compile_scope) not in COMPILE_SCOPES:
        raise ValueError(f"model.compile_scope must be one of {COMPILE_SCOPES}, got {cfg.compile_scope!r}")
    if str(cfg.compile_mode) not in COMPILE_MODES:
        raise ValueError(f"model.compile_mode must be one of {COMPILE_MODES}, got {cfg.compile_mode!r}")
    if str(cfg.compile_mode) != "default" and cfg.compile_backend != "inductor":
        raise ValueError(f"model.compile_mode={cfg.compile_mode} needs model.compile_backend=inductor "
                         f"(got {cfg.compile_backend!r}, which has no modes)")
    if cfg.compile_pad_multiple < 1:
        raise ValueError(f"model.compile_pad_multiple must be >= 1, got {cfg.compile_pad_multiple}")
    if cfg.init_factor <= 0:
        raise ValueError(f"model.init_factor must be > 0, got {cfg.init_factor}")
