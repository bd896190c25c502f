"""What `model.compile_pad_multiple` costs: the padding a compiled model adds to real pre-training batches.

    python benchmarks/bench_padding.py --data data/default                 # config base, its max_tokens
    python benchmarks/bench_padding.py --data DIR --config ast_t5_paper_base --batches 300
    python benchmarks/bench_padding.py --data DIR --multiples 1 8 16 64
    python benchmarks/bench_padding.py --data DIR --pools 2 4 8 16        # batching by corrupted lengths

Under ``model.compile`` the model pads each batch's source and target lengths to a multiple of
``compile_pad_multiple`` before its compiled forward (`ast_t5_model.bucketed_length`), and the GPU
computes those padded shapes. The trainer's MFU counts the batch as collated (fairseq pads each batch
to its longest sample; `flops.training_flops` of that shape), so the extra padding is time that no
FLOP count shows. This benchmark draws the task's own training batches (the config's masking, token
budget and language sampling, as ``fairseq-hydra-train`` builds them, one epoch's order with its
seed), and for each multiple prints the model FLOPs of the padded shapes against those of the
collated shapes, and the FLOPs of the samples each at its own lengths (no padding at all) as the
floor. Arithmetic only: no model step runs, so it needs no GPU and the figures do not vary.

Per multiple it also counts the distinct attention shapes the batches give: (rows, source) for the
encoder's self-attention, (rows, target) for the decoder's, (rows, target, source) for its
cross-attention. The ``cudnn`` attention backend builds a forward and a backward cuDNN graph per shape
of each kind at its first call (a few hundred milliseconds each, as reported for cuDNN's attention
graphs elsewhere; `cudnn_attention.BUILD_SECONDS` measures it on a GPU), so twice their sum bounds the
graphs one epoch of these batches builds.

``--pools K ...`` asks what batching by the corrupted lengths saves (``task.batch_pool=K``,
`ast_t5.data.batch_pools`). fairseq forms the batches from the segments' own lengths (sorted, then cut
at the token budget) before the masking runs, and the AST objective's masking then spreads each
sample's source and target lengths (its target from about 0.19 to 0.31 of the segment on the default
corpus), so every batch pads to its longest corrupted sample. A pool is K batches adjacent in that
sorted order (the epoch's batches in their planned order, before fairseq shuffles them; here the first
``--batches`` of them); its samples, sorted by corrupted source length (then target length), are cut
again into K batches of the same row counts, the batches with more rows getting the shorter samples
(`cut_order`, the function the task uses). The benchmark always draws fairseq's own batches
(``task.batch_pool=1``) and cuts them itself; over a whole epoch the task's pooled iterator gives the
same figures. Per K it prints the model FLOPs of the cut batches against the planned ones, and the
largest batch's source tokens as collated (rows x longest source, what the encoder's activations
scale with) over the token budget, which the planned batches keep under by construction and cut ones
might pass, and the same for the targets (the decoder's). Sorting by each sample's own FLOPs instead,
or by target length, saved less on the default corpus: 0.963x and 0.949x at K = 16, against 0.911x.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DEFAULT_MULTIPLES = (1, 8, 16, 32, 64)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a preprocessed corpus (ast-t5-preprocess run -o DIR)")
    p.add_argument("--config", default="base", help="config/pretrain/<name>.yaml (default base)")
    p.add_argument("--max-tokens", type=int, default=0, help="tokens per batch (default: the config's)")
    p.add_argument("--batches", type=int, default=200, help="batches drawn at most (default 200; "
                                                           "fewer if the epoch ends first)")
    p.add_argument("--multiples", type=int, nargs="+", default=list(DEFAULT_MULTIPLES),
                   help="compile_pad_multiple values compared (1: the collated shapes)")
    p.add_argument("--pools", type=int, nargs="+", default=[],
                   help="also measure batching by corrupted lengths in pools of K adjacent batches (see above)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.batches < 1 or args.max_tokens < 0 or min(args.multiples) < 1 or min(args.pools, default=1) < 1:
        p.error("--batches, --multiples and --pools must be >= 1, --max-tokens >= 0")
    if not os.path.isdir(args.data):
        p.error(f"--data {args.data}: no such folder")
    return args


def setup(args):
    """The task, a model of the config's shape (its FLOP coefficients and position limits only), the
    composed config and the training set of epoch 1."""
    from fairseq import tasks, utils

    from bench_train import compose

    # fairseq's own batches (task.batch_pool 1): --pools cuts them the way task.batch_pool would
    overrides = [f"task.data={os.path.abspath(args.data)}", "dataset.num_workers=0", "common.tensorboard_logdir=null",
                 "++task.batch_pool=1"]
    if args.max_tokens:
        overrides.append(f"dataset.max_tokens={args.max_tokens}")
    cfg = compose(args.config, overrides)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)  # for its shape only (FLOP coefficients, position limits)
    task.load_dataset("train", epoch=1)
    return task, model, cfg


def batches(task, model, cfg, shuffle: bool):
    """The training batches of epoch 1 as ``fairseq-hydra-train`` draws them (``shuffle``), or in their
    planned order (sorted by segment length)."""
    from fairseq import utils

    return task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(),
                                                  cfg.dataset.max_tokens),
        ignore_invalid_inputs=True, required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed, num_workers=0, epoch=1).next_epoch_itr(shuffle=shuffle)


def measure(args, setup_result=None):
    """Per multiple: the model FLOPs of the padded shapes summed over the batches, with the collated
    shapes' (multiple 1) and the unpadded samples' sums, and the token counts."""
    from tqdm import tqdm

    from ast_t5.models.ast_t5_model import bucketed_length
    from ast_t5.models.flops import training_flops

    task, model, cfg = setup_result or setup(args)
    itr = batches(task, model, cfg, shuffle=True)
    pad = task.source_dictionary.pad()
    src_limit, tgt_limit = model.encoder.max_source_positions, model.decoder.max_target_positions
    flops = {m: 0.0 for m in args.multiples}
    collated = unpadded = 0.0
    tokens = {"real": np.zeros(2), "collated": np.zeros(2), **{m: np.zeros(2) for m in args.multiples}}
    shapes = {m: (set(), set(), set()) for m in args.multiples}  # encoder, decoder, cross-attention
    n = 0
    bar = tqdm(total=min(args.batches, len(itr)), desc="batches", disable=args.no_progress, file=sys.stderr)
    for sample in itr:
        if n == args.batches:
            break
        src, prev = sample["net_input"]["src_tokens"], sample["net_input"]["prev_output_tokens"]
        rows, src_len, tgt_len = src.size(0), src.size(1), prev.size(1)
        src_real, tgt_real = src.ne(pad).sum(1).tolist(), prev.ne(pad).sum(1).tolist()
        collated += training_flops(model, rows, src_len, tgt_len)
        unpadded += sum(training_flops(model, 1, s, t) for s, t in zip(src_real, tgt_real))
        tokens["real"] += (sum(src_real), sum(tgt_real))
        tokens["collated"] += (rows * src_len, rows * tgt_len)
        for m in args.multiples:
            s, t = bucketed_length(src_len, m, src_limit), bucketed_length(tgt_len, m, tgt_limit)
            flops[m] += training_flops(model, rows, s, t)
            tokens[m] += (rows * s, rows * t)
            for kind, shape in zip(shapes[m], ((rows, s), (rows, t), (rows, t, s))):
                kind.add(shape)
        n += 1
        bar.update()
    bar.close()
    if n == 0:
        raise SystemExit(f"bench_padding: no training batch in {args.data}")
    return {"batches": n, "max_tokens": cfg.dataset.max_tokens, "default": model.cfg.compile_pad_multiple,
            "flops": flops, "collated": collated, "unpadded": unpadded, "tokens": tokens,
            "shapes": {m: [len(kind) for kind in kinds] for m, kinds in shapes.items()}}


def cut_pool(pool):
    """The batches of one pool cut again by corrupted lengths, as ``task.batch_pool`` cuts them
    (`ast_t5.data.batch_pools.cut_order`): ``pool`` is a list of batches, each a list of samples
    (source length, target length); returns the new batches, most rows first."""
    from ast_t5.data.batch_pools import cut_order

    samples = [s for batch in pool for s in batch]
    return [[samples[i] for i in batch] for batch in cut_order([len(b) for b in pool], samples)]


def measure_pools(args, setup_result=None):
    """Per pool size K: the model FLOPs of the batches cut again by corrupted lengths (`cut_pool`)
    against those of the planned batches, and the largest batch's collated source tokens (rows x
    longest source) over the token budget, and the same for the targets, over the first ``--batches``
    batches in their planned order (K = 1: the planned batches themselves)."""
    from tqdm import tqdm

    from ast_t5.models.flops import training_flops

    task, model, cfg = setup_result or setup(args)
    itr = batches(task, model, cfg, shuffle=False)
    pad = task.source_dictionary.pad()
    planned = []  # per batch: [(source, target)] of its samples
    bar = tqdm(total=min(args.batches, len(itr)), desc="planned batches", disable=args.no_progress,
               file=sys.stderr)
    for sample in itr:
        if len(planned) == args.batches:
            break
        src_real = sample["net_input"]["src_tokens"].ne(pad).sum(1).tolist()
        tgt_real = sample["net_input"]["prev_output_tokens"].ne(pad).sum(1).tolist()
        planned.append(list(zip(src_real, tgt_real)))
        bar.update()
    bar.close()
    if not planned:
        raise SystemExit(f"bench_padding: no training batch in {args.data}")

    def batch_flops(batch):
        return training_flops(model, len(batch), max(s[0] for s in batch), max(s[1] for s in batch))

    base = sum(batch_flops(b) for b in planned)
    result = {"batches": len(planned), "max_tokens": cfg.dataset.max_tokens, "planned": base, "pools": {}}
    for k in sorted(set(args.pools)):
        cut = [b for start in range(0, len(planned), k) for b in cut_pool(planned[start:start + k])]
        budget = max(len(b) * max(s[0] for s in b) for b in cut) / cfg.dataset.max_tokens
        target = max(len(b) * max(s[1] for s in b) for b in cut) / cfg.dataset.max_tokens
        result["pools"][k] = {"flops": sum(batch_flops(b) for b in cut) / base, "budget": budget, "target": target}
    return result


def report(args, result):
    real = result["tokens"]["real"]
    collated = result["tokens"]["collated"]
    print(f"config {args.config}, {result['batches']} training batches of max_tokens {result['max_tokens']} "
          f"from {args.data}")
    print(f"  the batches as collated hold {real[0] / collated[0]:.1%} real source and {real[1] / collated[1]:.1%} "
          f"real target tokens (fairseq pads each batch to its longest sample); the samples at their own "
          f"lengths take {result['unpadded'] / result['collated']:.3f}x the collated shapes' FLOPs")
    print("| compile_pad_multiple | source tokens / real | target tokens / real | FLOPs / collated shapes' | "
          "attention shapes: encoder + decoder + cross |")
    print("|---|---|---|---|---|")
    for m in args.multiples:
        t = result["tokens"][m]
        mark = " (default)" if m == result["default"] else ""
        kinds = result["shapes"][m]
        print(f"| {m}{mark} | {t[0] / real[0]:.3f} | {t[1] / real[1]:.3f} | "
              f"{result['flops'][m] / result['collated']:.4f} | {' + '.join(map(str, kinds))} = {sum(kinds)} |")
    print("  (the cudnn attention backend builds a forward and a backward graph per attention shape at its first "
          "call: at most twice these sums in this run's batches)")


def report_pools(args, result):
    print(f"batching by corrupted lengths: the first {result['batches']} batches in their planned order, "
          f"pools of K adjacent batches cut again (the samples sorted by source length, row counts kept)")
    print("| pool of K batches | FLOPs / planned batches' | largest batch's source tokens / max_tokens | "
          "largest batch's target tokens / max_tokens |")
    print("|---|---|---|---|")
    for k, figures in result["pools"].items():
        print(f"| {k} | {figures['flops']:.4f} | {figures['budget']:.3f} | {figures['target']:.3f} |")


def main(argv=None) -> int:
    from ast_t5.data.loading import DataError

    args = parse_args(argv)
    try:
        setup_result = setup(args)
        result = measure(args, setup_result)
        pools = measure_pools(args, setup_result) if args.pools else None
    except (DataError, FileNotFoundError) as e:  # not a preprocessed corpus: one line, not a traceback
        print(f"bench_padding: error: {e}", file=sys.stderr)
        return 2
    report(args, result)
    if pools is not None:
        report_pools(args, pools)
    return 0


if __name__ == "__main__":
    sys.exit(main())
