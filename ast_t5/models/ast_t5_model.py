"""The ``ast_t5`` fairseq model: a T5 encoder-decoder in two families (see config.py).

Registered with ``@register_model("ast_t5", dataclass=AstT5Config)``; named size presets are in
architectures.py. The model's forward is fairseq's ``(src_tokens, src_lengths, prev_output_tokens)``
and its decoder is a FairseqIncrementalDecoder, so fairseq's criterions and SequenceGenerator
(beam search with cached keys/values) work unchanged.

Building one without a task (tests, demos, conversion)::

    model = AstT5Model.from_dictionary(dictionary, arch="t5_v11_tiny", dropout=0.0)

With ``model.compile=true`` the model's own ``forward`` (what fairseq's trainer and the criterion
call: encoder, decoder and output layer in one graph) runs through ``torch.compile``, created at
the first call, inside fairseq's trainer, after it has moved and cast the model. Source and
target lengths are padded to multiples of ``compile_pad_multiple`` (16) first (and the outputs
cropped back; padding is masked in the encoder and lies after every real position of the causal
decoder, so real positions see exactly what they saw before), which keeps every length aligned for
the attention kernels (a multiple of 64 computed 7% more FLOPs than the batches' own shapes on the
pre-training data, 16 computes 1.7%: benchmarks/bench_padding.py);
the batch and length dimensions are marked dynamic from the first graph on (``compile_dynamic``,
default true; false leaves them to torch's automatic dynamic shapes, which compiles a first graph
static for the first batch's exact shape and recompiles at the first change, one full compilation
more). Every compilation is logged with its wall time and, with inductor, how many of its graphs
came from inductor's on-disk cache (a rerun on the same machine and software loads them: seconds,
not minutes; `_inductor_cache_counts`). Only forwards
with gradients are compiled: validation and scoring (``torch.no_grad``) run eagerly, since grad
mode is a guard of the compiled graphs and would double them. The encoder and decoder called on
their own (generation, incremental decoding, export) stay eager too.

``compile_scope=layers`` compiles ``layer(*args)`` (`_call_layer`) instead of the whole forward: the
stacks call their layers through it during a compiled training forward, and the rest (embeddings,
position bias, masks, final norm, output layer) runs eagerly. One graph per layer class (encoder,
decoder), shared by the layers of a stack, whose parameters are the graph's inputs; far less to
trace and compile than the 12 + 12 layers of T5-base in one graph (benchmarks/bench_compile.py).

How many graphs: one per class of inputs the traced code branches on, each compiled once (and,
with ``compile_dynamic=false``, a static one first). On a GPU other than sm90 with ``auto`` a
stack's biased attention runs on ``sdpa`` up to 128 queries and on ``flex`` beyond
(`attention_backends.FLEX_MIN_QUERIES`), so the classes are source <= 128 or longer times target
<= 128 or longer: at most 4 graphs (5 with ``compile_dynamic=false``), inside torch's recompile
limit (`MIN_RECOMPILE_LIMIT`, which ``model.compile`` ensures). On sm90 ``auto`` sends every
call to ``sdpa`` whatever its length: one class. ``attention_backend=triton`` has its own length
rule, the far loops of its kernels past 4 (max_distance + tile) (768 on sm90 at T5's 128:
`triton_rpe_attention.far_loops_pay`), so the same 2 x 2 classes. Each class's first forward has
its inputs marked dynamic (the first forward of every length bucket is), so its first graph serves
the whole class. With ``compile_scope=layers`` each layer class has
its own length classes (the encoder layer's source, the decoder layer's target): at most 2 + 2
graphs, each of one layer (and 2 + 2 static ones first with ``compile_dynamic=false``; flex's block
mask, left to torch's automatic dynamic shapes, may add one graph per layer class at the first new
shape).
"""
import logging
import time
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import (BaseFairseqModel, FairseqDecoder, FairseqEncoder, FairseqEncoderDecoderModel,
                             register_model)

import fused_ops
from ast_t5.modules import FeedForward, RMSNorm
from ast_t5.modules.liger_norm_ffn import resolve_fused_norm_ffn

from .config import AstT5Config, config_from, structure
from .initialization import initialize_weights
from .presets import ARCH_PRESETS, MODEL_NAME
from .t5_stacks import T5Decoder, T5Encoder

logger = logging.getLogger(__name__)


@register_model(MODEL_NAME, dataclass=AstT5Config)
class AstT5Model(FairseqEncoderDecoderModel):
    """T5 encoder-decoder; ``cfg`` is the resolved AstT5Config it was built from."""

    def __init__(self, cfg: AstT5Config, encoder: T5Encoder, decoder: T5Decoder):
        super().__init__(encoder, decoder)
        self.cfg = cfg
        self._compiled_forward = None
        self.compile_seconds = 0.0  # total wall time of the calls that compiled a graph
        # graphs of those calls that inductor loaded from its on-disk cache (a rerun, or another process
        # that compiled the same model before on this machine), and those it compiled
        self.compile_cache_hits = 0
        self.compile_cache_misses = 0
        # compile_dynamic: mark the compiled inputs' dimensions dynamic in this forward (`_mark_dynamic`;
        # with compile_scope=layers `_mark_all_dynamic`, about 8 ms of host time per T5-base step on a
        # CPU core): in the first one, after any forward that compiled a graph until one compiles
        # nothing, and in the first forward of every (source, target) length bucket (`_seen_lengths`).
        # The marks only shape what dynamo traces: a dynamic graph takes unmarked inputs of any size.
        # A length class of its own (a guard of the traced code on a length: the triton backend's far
        # loops past 4 (max_distance + tile), `triton_rpe_attention.far_loops_pay`) compiles at its
        # first bucket, which is marked, so its first graph is already dynamic (unmarked, it was static,
        # and the next bucket of the class compiled again).
        self._mark_inputs = True
        self._seen_lengths = set()

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        """fairseq's encoder-decoder forward; compiled with bucketed lengths when cfg.compile."""
        if not self.cfg.compile or not torch.is_grad_enabled():
            # forwards without gradients (validation, scoring) run eagerly: compiling them would
            # double the graphs (grad mode is a guard) and could exhaust torch's recompile limit
            return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)
        pad = self.encoder.padding_idx
        tgt_len = prev_output_tokens.size(1)
        src = pad_to_bucket(src_tokens, self.cfg.compile_pad_multiple, self.encoder.max_source_positions, pad)
        prev = pad_to_bucket(prev_output_tokens, self.cfg.compile_pad_multiple,
                             self.decoder.max_target_positions, pad)
        if self._compiled_forward is None:
            # One eager forward without gradients first: code that logs once (the attention
            # backends' choice) runs here, outside the traced graph, where a logging call would
            # split the graph and force a recompilation at the next update.
            with torch.no_grad():
                self._eager_forward(src, src_lengths, prev, **kwargs)
            ensure_recompile_limit(MIN_RECOMPILE_LIMIT)
            mode = str(self.cfg.compile_mode)
            logger.info("torch.compile (backend %s, compile_scope %s%s): compiling the training forward and "
                        "backward in this update (T5-base: minutes on a first run; the time is logged when "
                        "done)", self.cfg.compile_backend, self.cfg.compile_scope,
                        "" if mode == "default" else f", mode {mode}")
            options = dict(backend=self.cfg.compile_backend, mode=None if mode == "default" else mode)
            if self.layerwise_compile:
                self._compiled_forward = torch.compile(_call_layer, **options)
            else:
                self._compiled_forward = torch.compile(self._eager_forward, **options)
        graphs, cache = _compiled_graph_count(), _inductor_cache_counts()
        start = time.perf_counter()
        lengths = (src.size(1), prev.size(1))
        mark = self.cfg.compile_dynamic and (self._mark_inputs or lengths not in self._seen_lengths)
        self._seen_lengths.add(lengths)
        if self.layerwise_compile:
            x, extra = self._forward_with_compiled_layers(src, src_lengths, prev, mark=mark, **kwargs)
        else:
            if mark:
                _mark_dynamic(src, src_lengths, prev)
            x, extra = self._compiled_forward(src, src_lengths, prev, **kwargs)
        compiled_now = _compiled_graph_count() != graphs
        self._mark_inputs = compiled_now
        if compiled_now:
            seconds = time.perf_counter() - start
            self.compile_seconds += seconds
            hits, misses = (now - before for now, before in zip(_inductor_cache_counts(), cache))
            self.compile_cache_hits += hits
            self.compile_cache_misses += misses
            logger.info("torch.compile: new graph for batch %d x source %d / target %d (%s) in %.1f s "
                        "(%.1f s in all)%s", src.size(0), src.size(1), prev.size(1),
                        "training" if self.training else "eval", seconds, self.compile_seconds,
                        f"; inductor's cache: {hits} of {hits + misses} graphs loaded" if hits + misses else "")
        return (x[:, :tgt_len] if x.size(1) != tgt_len else x), extra

    def _eager_forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)

    @property
    def layerwise_compile(self) -> bool:
        """``model.compile_scope=layers``: the compiled graphs are one encoder layer and one decoder layer."""
        return str(self.cfg.compile_scope) == "layers"

    def _forward_with_compiled_layers(self, *args, mark: bool = False, **kwargs):
        """The eager forward with every layer call going through the compiled `_call_layer`
        (``compile_scope=layers``): one graph per layer class, reused by each layer of its stack;
        ``mark``: the layer calls' tensors marked dynamic first (`_mark_all_dynamic`)."""
        stacks = (self.encoder, self.decoder)
        compiled = self._compiled_forward
        if mark:
            def call(layer, *layer_args):
                _mark_all_dynamic(layer_args)
                return compiled(layer, *layer_args)
        else:
            call = compiled
        for stack in stacks:
            stack.layer_call = call
        try:
            return self._eager_forward(*args, **kwargs)
        finally:
            for stack in stacks:
                stack.layer_call = None

    @classmethod
    def build_model(cls, cfg, task):
        """fairseq entry point. Source and target must share one dictionary (tied embeddings)."""
        src, tgt = task.source_dictionary, task.target_dictionary
        if tgt is not None and src is not None and (len(src) != len(tgt) or src.pad() != tgt.pad()):
            raise ValueError("ast_t5 needs one shared source/target dictionary; got sizes "
                             f"{len(src)} and {len(tgt)}")
        return cls.build(config_from(cfg), src if src is not None else tgt)

    @classmethod
    def build(cls, cfg: AstT5Config, dictionary) -> "AstT5Model":
        """Build and initialize a model over ``dictionary`` (a fairseq Dictionary)."""
        embed_tokens = nn.Embedding(len(dictionary), cfg.embed_dim, padding_idx=dictionary.pad())
        encoder = T5Encoder(cfg, dictionary, embed_tokens)
        decoder = T5Decoder(cfg, dictionary, embed_tokens)
        model = cls(cfg, encoder, decoder)
        initialize_weights(model, str(cfg.family), cfg.embed_dim, cfg.init_factor)
        model.set_norm_ffn_impl(resolve_fused_norm_ffn(cfg.fused_norm_ffn, str(cfg.family)))
        if str(cfg.attention_backend) == "fused":
            ok, reason = fused_ops.fused_backend_status()
            if not ok:  # not an error yet: a CPU machine may build the model only to convert it
                logger.warning("attention_backend=fused cannot run in this process (%s); the first "
                               "forward will raise. Use auto to fall back.", reason)
        if str(cfg.attention_backend) == "triton":
            from ast_t5.modules import triton_rpe_attention as tra

            reason = None if tra.triton is not None else tra.TRITON_IMPORT_ERROR
            if reason is None and not torch.cuda.is_available():  # CPU tensors: the interpreter, if it runs
                reason = tra._device_unsupported(torch.empty(0))
            if reason is not None:
                logger.warning("attention_backend=triton cannot run in this process (%s); biased "
                               "attention will run on sdpa (logged once per kind of call).", reason)
        logger.info("ast_t5 %s: %s parameters (%s without embeddings), attention backend %s",
                    cfg.family, f"{model.num_parameters():,}", f"{model.num_parameters(False):,}",
                    cfg.attention_backend)
        return model

    @classmethod
    def from_dictionary(cls, dictionary, arch: Optional[str] = None, **overrides) -> "AstT5Model":
        """Build from a dictionary, an optional preset name (e.g. "t5_v11_tiny") and field overrides."""
        values = dict(ARCH_PRESETS[arch]) if arch is not None else {}
        values.update(overrides)
        unknown = set(values) - set(AstT5Config.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown AstT5Config fields: {sorted(unknown)}")
        return cls.build(config_from(AstT5Config(**values)), dictionary)

    def set_norm_ffn_impl(self, impl: str) -> int:
        """Run every RMSNorm and gated feed-forward block with ``impl`` ("eager" or "liger"; see
        liger_norm_ffn.py). Parameters are untouched. Returns the number of modules switched."""
        if impl not in ("eager", "liger"):
            raise ValueError(f"norm/ffn implementation must be 'eager' or 'liger', got {impl!r}")
        switched = 0
        for module in self.modules():
            if isinstance(module, RMSNorm) or (isinstance(module, FeedForward) and module.gated):
                module.impl = impl
                switched += 1
        self.norm_ffn_impl = impl
        return switched

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Parameter count; without embeddings leaves out the token table and the output head."""
        total = sum(p.numel() for p in self.parameters())
        if not include_embeddings:
            total -= self.encoder.embed_tokens.weight.numel()
            if self.decoder.output_projection is not None:
                total -= self.decoder.output_projection.weight.numel()
        return total

    # fairseq's Trainer.train_step and FairseqTask.train_step call model.train() and
    # model.set_num_updates() before every forward. Both walked every submodule with an attribute
    # write or a failing hasattr each (T5-base: 339 modules, about 1.6 ms of host time per update on
    # a 2-core CPU), and on a GPU that time falls where the device waits: after the update's last
    # host sync (fairseq reads the logged values) and before the next forward is launched.
    def train(self, mode: bool = True):
        """nn.Module.train, which returns at once when every submodule is already in ``mode``."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        if all(m is None or m.training is mode for m in _module_tree(self)):
            return self
        return super().train(mode)

    def set_num_updates(self, num_updates):
        """Pass the update count to every submodule that takes it, once each.

        fairseq's version asks every module ``hasattr(m, "set_num_updates")`` (an exception per
        module without one) and the encoder repeats the walk over its own submodules, so a module
        that takes the count gets it twice. Here one walk finds the method on the module's class or
        instance without raising, and skips fairseq's own forwarding implementations (the walk
        already reaches what they would)."""
        seen = {id(self)}
        for module in _module_tree(self):
            if module is None or id(module) in seen:
                continue
            seen.add(id(module))
            method = module.__dict__.get("set_num_updates") or getattr(type(module), "set_num_updates", None)
            if method is None or getattr(method, "__func__", method) in _FORWARDING_SET_NUM_UPDATES:
                continue
            module.set_num_updates(num_updates)

    def __getstate__(self):  # a compiled function does not pickle or deep-copy; it is rebuilt lazily
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state["_compiled_forward"] = None
        return state

    @property
    def family(self) -> str:
        return str(self.cfg.family)

    @property
    def tied_output(self) -> bool:
        return structure(self.cfg).tie_output


# fairseq's set_num_updates implementations that only forward the count to submodules.
_FORWARDING_SET_NUM_UPDATES = frozenset(
    getattr(cls, "set_num_updates") for cls in (FairseqEncoder, FairseqDecoder, BaseFairseqModel)
    if hasattr(cls, "set_num_updates"))


def _module_tree(root: nn.Module) -> list:
    """``root`` and every module below it, breadth-first, as a list: about 6x faster than
    ``root.modules()``'s recursive generators. Unlike it, this keeps a module as often as it is
    registered (a shared module appears under each parent) and the ``None`` entries of
    ``_modules``; callers skip them."""
    tree = [root]
    for module in tree:  # the list grows while it is walked
        if module is not None:
            tree += module._modules.values()
    return tree


def bucketed_length(length: int, multiple: int, limit: int) -> int:
    """The next multiple of ``multiple`` from ``length`` on, at most ``limit`` (never below ``length``)."""
    return max(length, min(-(-length // multiple) * multiple, limit))


def pad_to_bucket(tokens: torch.Tensor, multiple: int, limit: int, pad: int) -> torch.Tensor:
    """(B, L) right-padded with ``pad`` to `bucketed_length` (``compile_pad_multiple``)."""
    length = tokens.size(1)
    target = bucketed_length(length, multiple, limit)
    return tokens if target == length else F.pad(tokens, (0, target - length), value=pad)


# Graphs the compiled training forward may need (see the module docstring: 4 classes, 1 + 4 with
# compile_dynamic=false), with
# room for what only a GPU run can show. torch's default limit is 8 per function; past it, new
# shapes silently run eagerly (slower, and with more activation memory than the recipes plan).
MIN_RECOMPILE_LIMIT = 16


def ensure_recompile_limit(minimum: int) -> None:
    """Raise torch._dynamo's per-function recompile limit to ``minimum`` if it is lower (logged)."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    current = getattr(dynamo_config, name)
    if current < minimum:
        setattr(dynamo_config, name, minimum)
        logger.info("torch.compile: torch._dynamo.config.%s raised from %d to %d (graphs of the "
                    "training forward: one per length class)", name, current, minimum)


def _mark_dynamic(src: torch.Tensor, src_lengths, prev: torch.Tensor) -> None:
    """Mark the batch and length dimensions of the compiled forward's inputs dynamic (``maybe``: a
    dimension the traced code specializes, or of size 1, stays static without an error), so that
    the first graph is already the one later batches reuse (`compile_dynamic`)."""
    mark = torch._dynamo.maybe_mark_dynamic
    for t in (src, prev):
        mark(t, 0)
        mark(t, 1)
    if torch.is_tensor(src_lengths):
        mark(src_lengths, 0)


def _mark_all_dynamic(args) -> None:
    """Mark every dimension of the tensor arguments of a layer call dynamic (``maybe``: those the
    layer ties to its weights, the model and head sizes, stay static without an error), so that the
    first graph of each layer class is the one later batches and lengths reuse (``compile_dynamic``
    with ``compile_scope=layers``). The stack's bias object (`attention_backends.FoldedBias`) is an
    argument too: its key padding mask and dense bias are marked with the rest (`varying_tensors`).
    flex's block mask is left to torch's automatic dynamic shapes (one more graph at the first new
    shape)."""
    for arg in args:
        tensors = (arg,) if torch.is_tensor(arg) else getattr(arg, "varying_tensors", tuple)()
        for t in tensors:
            for dim in range(t.dim()):
                torch._dynamo.maybe_mark_dynamic(t, dim)


def _call_layer(layer, *args):
    """``layer(*args)``: what ``compile_scope=layers`` compiles. With torch's inlining of built-in
    modules (the default since 2.5), a layer's parameters are the graph's inputs, not its constants,
    so the 12 layers of a stack share one graph."""
    return layer(*args)


def _inductor_cache_counts() -> Tuple[int, int]:
    """(hits, misses) of inductor's FX graph cache in this process: a compiled forward or backward
    graph found in its on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the system's
    temporary folder) is loaded instead of compiled, which makes a rerun's compilation seconds, not
    minutes. Dynamo's counters (not public API); (0, 0) without them or with other backends."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])
    except Exception:
        return 0, 0


def _compiled_graph_count() -> int:
    """Graphs torch.compile has produced in this process (dynamo's own counter)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # the counter is not public API; without it compilations go unlogged
        return 0
