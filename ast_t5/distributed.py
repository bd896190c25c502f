"""Multi-process training that a cluster can trust (DESIGN section 9): checkpoints that every rank
can read, launches that match their environment, bounded waits, and ranks that agree.

The engine stays torch.distributed through fairseq's trainer; this module adds checks around it:

* ``allow_checkpoint_globals`` (run when the plugin is imported): fairseq's rank 0 reads
  ``checkpoint_last.pt`` and broadcasts it to the other ranks, which read the bytes back with
  ``torch.load``; its default ``weights_only=True`` refuses the OmegaConf config inside. We name the
  few plain-data classes such a state holds in torch's allow-list instead of loading with
  ``weights_only=False``: any other object in a broadcast state is still refused.
* ``StartupChecks``, a Hydra callback that the run configs register: in a launch whose
  environment names several processes (``WORLD_SIZE``), it initializes the same process group
  fairseq would (backend, init method, rank, world size), but with a timeout
  (``task.distributed_timeout`` minutes) for the rendezvous and every collective, logs whom it waits
  for, and turns a timeout into one line and exit code 1. fairseq's ``distributed_init`` then
  uses that group. Then all ranks compare the resolved config, the data manifest and the code
  version and stop with one line naming what differs (exit code 2).
* ``check_launch`` (task construction): the environment says several processes and this one
  trains alone: one line, exit code 2, instead of N silent copies.
* ``check_replicas`` (every ``task.replica_check_interval`` updates): a parameter checksum
  compared across ranks.
* ``WorldSizeAwareIterator``: the epoch iterator's state records the number of data shards
  (ranks); a resume on another number is refused with one line unless
  ``task.allow_world_size_change=true``, which keeps the data position by samples consumed.
"""
import collections
import hashlib
import json
import logging
import os
import sys
import threading
import typing
import warnings
from dataclasses import dataclass, field
from datetime import timedelta

import torch

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MIN = 10.0
DEFAULT_CHECK_INTERVAL = 100


@dataclass
class DistributedOptions:
    """Task keys of multi-process runs (mixed into the task configs)."""

    distributed_timeout: float = field(default=DEFAULT_TIMEOUT_MIN, metadata={
        "help": "minutes the rendezvous and any collective may wait for the other ranks before "
                "the job stops with one line (applied by the run configs' startup check)"})
    replica_check_interval: int = field(default=DEFAULT_CHECK_INTERVAL, metadata={
        "help": "every N updates, compare a parameter checksum across ranks (0: never)"})
    allow_world_size_change: bool = field(default=False, metadata={
        "help": "resume a checkpoint saved with another number of ranks; the data position is "
                "kept by samples consumed (otherwise such a resume is refused)"})


class LaunchError(SystemExit):
    """A wrong launch: printed as one line on stderr, exit code ``code``."""

    def __init__(self, message: str, code: int = 2):
        sys.stderr.write(f"ast-t5: error: {message}\n")
        sys.stderr.flush()
        super().__init__(code)
        self.message = message


# ---------------------------------------------------------------------------------------------
# 1. checkpoints broadcast by rank 0 are readable by the other ranks

def allow_checkpoint_globals() -> None:
    """Allow-list the plain-data classes of a fairseq training state for ``torch.load``.

    ``fairseq.distributed.utils.broadcast_object`` pickles the state loaded by rank 0 (its config
    is an OmegaConf ``DictConfig`` again after ``load_checkpoint_to_cpu``) and the other ranks read
    it with ``torch.load(buffer)``, i.e. ``weights_only=True``. These classes hold data only.
    """
    from omegaconf import DictConfig, ListConfig, nodes
    from omegaconf.base import ContainerMetadata, Metadata
    from fairseq.distributed.utils import _TensorPlaceholder

    node_types = [getattr(nodes, n) for n in ("AnyNode", "StringNode", "IntegerNode", "FloatNode",
                                               "BooleanNode", "EnumNode", "BytesNode", "PathNode")
                  if hasattr(nodes, n)]
    torch.serialization.add_safe_globals([
        DictConfig, ListConfig, ContainerMetadata, Metadata, *node_types, typing.Any,
        collections.defaultdict, collections.OrderedDict, _TensorPlaceholder,
        dict, list, int])  # OmegaConf's __reduce__ names the builtin types of its content


# ---------------------------------------------------------------------------------------------
# 2. the environment says several processes, the config says one

def expected_world_size():
    """(processes the launcher started, the variable that says so); (1, "") outside a launcher.

    ``WORLD_SIZE`` (torchrun, hand-set variables, Kubernetes) wins; otherwise an ``srun`` step
    with several tasks (``SLURM_STEP_NUM_TASKS``) that starts the training processes itself.
    """
    for name in ("WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return int(value.split("(")[0]), name
            except ValueError:
                raise LaunchError(f"{name}={value!r} is not a number of processes")
    return 1, ""


SRUN_WITHOUT_TORCHRUN = (
    "{source}={world}: an srun step starts the training processes without torchrun; fairseq's own "
    "SLURM set-up is not supported (it needs GPUs and a world size per node): submit "
    "scripts/slurm_pretrain.sh, which runs one torchrun per node")


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check_launch() -> None:
    """Refuse, in one line, to train N independent copies of one job."""
    expected, source = expected_world_size()
    if expected <= 1:
        return
    actual = torch.distributed.get_world_size() if _initialized() else 1
    if actual == 1 and source != "WORLD_SIZE":
        raise LaunchError(SRUN_WITHOUT_TORCHRUN.format(source=source, world=expected))
    if actual == 1 or (source == "WORLD_SIZE" and actual != expected):
        raise LaunchError(
            f"{source}={expected} in the environment, but this process trains with world size "
            f"{actual}: each process would train its own copy. Add the run config of the launch "
            f"(+run_config=torchrun_cpu on CPU, a GPU run config such as +run_config=node8_gpu8 "
            f"on GPUs), or start one process")


# ---------------------------------------------------------------------------------------------
# 3 and 4. bounded rendezvous, ranks that agree (a Hydra callback of the run configs)

def _flatten(node, prefix=""):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: json.dumps(node, sort_keys=True, default=str)}


# Keys that differ between ranks by design, or name where a node installed the same code.
RANK_SPECIFIC_KEYS = ("distributed_training.distributed_rank", "distributed_training.device_id",
                      "common.user_dir", "job_logging_cfg")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def config_fingerprint(config) -> dict:
    """Flat ``{dotted key: value}`` of the resolved config, without per-rank keys."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(config, resolve=False)
    raw.pop("hydra", None)  # Hydra's own node: output paths, job numbers, not training settings
    try:
        container = OmegaConf.to_container(OmegaConf.create(raw), resolve=True, throw_on_missing=False)
    except Exception:  # an interpolation into the Hydra node: compare the unresolved text
        container = raw
    flat = _flatten(container)
    return {k: v for k, v in flat.items() if not k.startswith(RANK_SPECIFIC_KEYS)}


SMALL_DATA_FILE = 1 << 20  # data files up to this size are hashed; bigger ones by size only


def data_fingerprint(data_dir) -> dict:
    """Every file of the preprocessed data: its size, and a content hash for small files (the
    manifest, dictionary, tokenizer, weights)."""
    out = {}
    if not data_dir or not os.path.isdir(str(data_dir)):
        return {"data": f"missing: {data_dir}"}
    for root, dirs, files in os.walk(str(data_dir)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, str(data_dir))
            size = os.path.getsize(path)
            out[f"data:{rel}"] = _sha256(path) if size <= SMALL_DATA_FILE else f"{size} bytes"
    return out


def code_fingerprint() -> dict:
    """A hash of every source file of the plugin, and the versions of fairseq, torch, Python."""
    import fairseq

    pkg = os.path.dirname(os.path.abspath(__file__))
    out = {"code:fairseq": fairseq.__version__, "code:torch": torch.__version__,
           "code:python": sys.version.split()[0]}
    for root, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".yaml", ".json")):
                path = os.path.join(root, name)
                out[f"code:ast_t5/{os.path.relpath(path, pkg)}"] = _sha256(path)
    return out


def disagreements(fingerprints) -> list:
    """Keys whose value differs between ranks, as ``key (rank 0: v, rank r: w)`` strings."""
    keys = sorted(set().union(*fingerprints))
    out = []
    for key in keys:
        values = [fp.get(key, "<absent>") for fp in fingerprints]
        if len(set(values)) > 1:
            odd = next(r for r, v in enumerate(values) if v != values[0])
            out.append(f"{key} (rank 0: {values[0]}, rank {odd}: {values[odd]})")
    return out


def check_agreement(config, data_dir) -> None:
    """All ranks compare config, data and code; every rank stops with the same one line."""
    mine = {**config_fingerprint(config), **data_fingerprint(data_dir), **code_fingerprint()}
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, mine)
    diff = disagreements(gathered)
    if diff:
        more = f"; and {len(diff) - 5} more" if len(diff) > 5 else ""
        raise LaunchError(f"the ranks disagree on {len(diff)} key(s): {'; '.join(diff[:5])}{more}")
    logger.info("all %d ranks hold the same config, data (%d files) and code", len(gathered),
                sum(k.startswith("data:") for k in mine))


def _rendezvous_address(init_method: str) -> str:
    if init_method.startswith("env://"):
        return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    return init_method


def init_process_group(config) -> None:
    """The process group fairseq would create, with a timeout; one line when it expires."""
    from omegaconf import OmegaConf

    world, _ = expected_world_size()
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    sel = lambda key, default=None: OmegaConf.select(config, key, default=default)  # noqa: E731
    cfg_world = sel("distributed_training.distributed_world_size")
    if cfg_world == 1:
        check_launch()  # raises
    backend = sel("distributed_training.distributed_backend") or "nccl"
    if backend == "nccl" and not torch.cuda.is_available():
        raise LaunchError("distributed_training.distributed_backend=nccl needs GPUs; on CPU use "
                          "+run_config=torchrun_cpu (gloo)")
    init_method = sel("distributed_training.distributed_init_method") or "env://"
    minutes = float(sel("task.distributed_timeout", DEFAULT_TIMEOUT_MIN))
    if minutes <= 0:
        raise LaunchError(f"task.distributed_timeout={minutes} must be > 0 minutes")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
        torch.cuda.set_device(local)
    where = _rendezvous_address(init_method)
    awaited = (f"the other {world - 1} rank(s)" if rank == 0 and not os.environ.get("TORCHELASTIC_RUN_ID")
               else f"the rendezvous store at {where}")
    logger.info("rank %d of %d: waiting up to %.3g min for %s (%s, %s)",
                rank, world, minutes, awaited, init_method, backend)

    def give_up(detail):
        return LaunchError(f"rank {rank} of {world}: waited {minutes:.3g} min "
                           f"(task.distributed_timeout) for {awaited}, in vain: {detail}", code=1)

    # torch's own timeout does not cover a listener on the port that is no torch store (the
    # handshake waits for an answer); this watchdog ends such a wait a few seconds later.
    watchdog = threading.Timer(minutes * 60 + 5, lambda: (
        give_up("no answer from the rendezvous endpoint (another program on the port?)"),
        os._exit(1)))
    watchdog.daemon = True
    watchdog.start()
    try:
        torch.distributed.init_process_group(backend=backend, init_method=init_method,
                                             world_size=world, rank=rank,
                                             timeout=timedelta(minutes=minutes))
    except Exception as e:  # DistStoreError, RuntimeError, ...: the torch message, first line
        raise give_up(" ".join(str(e).split())[:300])
    finally:
        watchdog.cancel()
    # fairseq's distributed_init finds this group and uses it
    warnings.filterwarnings("ignore", message="Distributed is already initialized")
    # fairseq runs its training collectives (gradients, logging, checkpoint broadcast) on a
    # sub-group it creates with torch's default timeout (30 min); create it now, on every rank at
    # the same point, and give it ours
    from fairseq.distributed import utils as fairseq_dist

    set_timeout = getattr(torch.distributed.distributed_c10d, "_set_pg_timeout", None)
    if set_timeout is None:
        logger.warning("this torch cannot set a group's timeout: fairseq's collectives wait 30 min")
    else:
        set_timeout(timedelta(minutes=minutes), fairseq_dist.get_global_group())
    logger.info("rank %d of %d joined (collectives time out after %.3g min)", rank, world, minutes)


try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # Hydra < 1.1
    _HydraCallback = object


class StartupChecks(_HydraCallback):
    """Hydra callback (``hydra.callbacks`` of the run configs): runs in every launched process
    before fairseq, after the config is composed. Does nothing outside a multi-process launch."""

    def on_job_start(self, config, **kwargs) -> None:
        from omegaconf import OmegaConf

        world, source = expected_world_size()
        if world <= 1 or _initialized():
            return
        if source != "WORLD_SIZE":
            raise LaunchError(SRUN_WITHOUT_TORCHRUN.format(source=source, world=world))
        init_process_group(config)
        try:
            check_agreement(config, OmegaConf.select(config, "task.data"))
        except LaunchError as e:
            _exit_now(e.code)
        except Exception as e:  # Hydra would only warn about a callback's exception
            _exit_now(LaunchError(f"the startup check of the ranks failed: {type(e).__name__}: {e}",
                                  code=1).code)


def _exit_now(code: int) -> None:
    """Leave at once with ``code`` (the one-line error is already on stderr). A normal exit would
    tear the process group down while the other ranks tear theirs down too, and gloo may then
    abort the process (SIGABRT) instead of returning the code."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---------------------------------------------------------------------------------------------
# 4. replicas that stay equal

_last_checked = {"update": None}


def parameter_checksum(model) -> torch.Tensor:
    """Per parameter tensor: the sum and the sum of squares, in float64 (order-sensitive)."""
    with torch.no_grad():
        rows = [torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()])
                for p in model.parameters()]
    return torch.stack(rows)


def check_replicas(model, update_num: int, interval: int) -> None:
    """Every ``interval`` updates (and at update 0), compare parameter checksums across ranks.

    Call on every rank at the same point (the first micro-batch of an update): all ranks take
    part in one ``all_gather`` and all stop with the same line if a replica differs.
    """
    if interval <= 0 or not _initialized() or torch.distributed.get_world_size() < 2:
        return
    if update_num % interval or _last_checked["update"] == update_num:
        return
    _last_checked["update"] = update_num
    mine = parameter_checksum(model)
    gathered = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, mine)
    bad = [r for r, g in enumerate(gathered) if not torch.equal(g, gathered[0])]
    if bad:
        names = [n for n, _ in model.named_parameters()]
        first = int((gathered[bad[0]] != gathered[0]).any(dim=1).nonzero()[0])
        raise LaunchError(f"replicas differ at update {update_num}: the parameters of rank(s) "
                          f"{bad} differ from rank 0's (first: {names[first]}); the ranks no longer "
                          f"train one model", code=1)


# ---------------------------------------------------------------------------------------------
# 5. resume with another world size

def track_world_size(itr, cfg):
    """Give a fairseq ``EpochBatchIterator`` a state that records its number of shards."""
    from fairseq.data.iterators import EpochBatchIterator

    if type(itr) is EpochBatchIterator:
        itr.__class__ = WorldSizeAwareIterator
        itr.allow_world_size_change = bool(getattr(cfg, "allow_world_size_change", False))
    return itr


def _world_size_iterator_base():
    from fairseq.data.iterators import EpochBatchIterator
    return EpochBatchIterator


class WorldSizeAwareIterator(_world_size_iterator_base()):
    """An epoch iterator whose saved state says over how many ranks (shards) it ran.

    fairseq shards the epoch's batches round-robin over the ranks and saves how many batches each
    rank consumed. On resume with another number of ranks that count is refused, or, with
    ``task.allow_world_size_change=true``, converted so that the same global position (batches,
    hence samples, consumed by all ranks together) is kept: ``consumed * old // new`` (rounded
    down: at most ``new - 1`` batches are seen twice, none skipped).
    """

    allow_world_size_change = False

    def state_dict(self):
        state = super().state_dict()
        state["num_shards"] = self.num_shards
        return state

    def load_state_dict(self, state_dict):
        saved = state_dict.get("num_shards")
        if saved is not None and saved != self.num_shards:
            done = state_dict.get("iterations_in_epoch", 0)
            if not self.allow_world_size_change:
                raise LaunchError(
                    f"the checkpoint was saved by {saved} ranks and this run has {self.num_shards}: "
                    f"the batch per update and the data position would change. Resume with "
                    f"{saved} ranks, or accept with task.allow_world_size_change=true (keeps the "
                    f"position by samples consumed)")
            state_dict = dict(state_dict, iterations_in_epoch=done * saved // self.num_shards,
                              num_shards=self.num_shards)
            logger.warning("resuming a checkpoint of %d ranks on %d: epoch %s continues after %d "
                           "of its batches (%d per rank before, %d now)", saved, self.num_shards,
                           state_dict["epoch"], done * saved, done,
                           state_dict["iterations_in_epoch"])
        return super().load_state_dict(state_dict)


allow_checkpoint_globals()
