"""Size presets of the ``ast_t5`` model's named architectures (registered in architectures.py).

A preset only fills fields the user left unset (fairseq's convention), so
``--arch t5_v11_base --embed-dim 1024`` or a YAML ``model: {_name: t5_v11_base, dropout: 0.0}``
override it. Sizes:
- AST-T5 paper (spec section 7.1; relative bias 128 buckets / max distance 256): small 512/2048,
  6+6 layers, 8 heads; base 768/3072, 12+12, 12 heads; large 1024/4096, 24+24, 16 heads.
- T5 v1.1 (Google's released checkpoints; 32 buckets / 128): small 512/1024, 8+8 layers,
  6 heads of 64; base 768/2048, 12+12, 12; large 1024/2816, 24+24, 16; xl 2048/5120, 24+24, 32.
- ``*_tiny``: 32 wide, 2+2 layers, 4 heads of 8, for CPU tests and demos.
"""
from fairseq.utils import safe_hasattr

MODEL_NAME = "ast_t5"
_PAPER = dict(family="ast_t5_paper", rel_pos_buckets=128, rel_pos_max_distance=256, head_dim=64)
_T5_V11 = dict(family="t5_v11", rel_pos_buckets=32, rel_pos_max_distance=128, head_dim=64)
_TINY = dict(embed_dim=32, ffn_dim=64, num_heads=4, head_dim=8, encoder_layers=2, decoder_layers=2)


def _size(embed_dim, ffn_dim, layers, heads):
    return dict(embed_dim=embed_dim, ffn_dim=ffn_dim, encoder_layers=layers, decoder_layers=layers,
                num_heads=heads)


ARCH_PRESETS = {
    "ast_t5_paper_tiny": {**_PAPER, **_TINY},
    "ast_t5_paper_small": {**_PAPER, **_size(512, 2048, 6, 8)},
    "ast_t5_paper_base": {**_PAPER, **_size(768, 3072, 12, 12)},
    "ast_t5_paper_large": {**_PAPER, **_size(1024, 4096, 24, 16)},
    "t5_v11_tiny": {**_T5_V11, **_TINY},
    "t5_v11_small": {**_T5_V11, **_size(512, 1024, 8, 6)},
    "t5_v11_base": {**_T5_V11, **_size(768, 2048, 12, 12)},
    "t5_v11_large": {**_T5_V11, **_size(1024, 2816, 24, 16)},
    "t5_v11_xl": {**_T5_V11, **_size(2048, 5120, 24, 32)},
}


def apply_preset(cfg, arch: str) -> None:
    """Set each field of ``ARCH_PRESETS[arch]`` that ``cfg`` (Namespace or DictConfig) lacks or
    holds as None (AstT5Config's "from the preset" default)."""
    for name, value in ARCH_PRESETS[arch].items():
        if not safe_hasattr(cfg, name):
            setattr(cfg, name, value)
