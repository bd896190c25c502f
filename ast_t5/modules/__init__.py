"""Building blocks of the AST-T5 / T5 encoder-decoder (see ast_t5/models for the fairseq model)."""
from .attention_backends import ATTENTION_BACKENDS, attention  # noqa: F401
from .feed_forward import FeedForward  # noqa: F401
from .norms import RMSNorm, build_norm  # noqa: F401
from .relative_position_bias import RelativePositionBias, relative_position_bucket  # noqa: F401
from .t5_attention import T5MultiheadAttention  # noqa: F401
from .t5_layers import LayerSpec, T5DecoderLayer, T5EncoderLayer  # noqa: F401
