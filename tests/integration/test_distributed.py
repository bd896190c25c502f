"""Multi-process training as a cluster runs it, on CPU with gloo and 2 processes (loopback only):
resume after kill -9 of a rank, launches without the run config, incomplete launches, ranks that
disagree, a resume with another world size, and the SLURM script under stand-in SLURM commands."""
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from .conftest import REPO, free_port, train_env
from .test_pretrain import HYDRA_TRAIN, json_logs, read_audit, tiny_args

LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
               "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID")
# every run of this module: 12 updates, a checkpoint every 4, warm-up short enough for 6 updates
RUN = ("optimization.max_update=12", "lr_scheduler.warmup_updates=2", "common.log_interval=1",
       "checkpoint.save_interval_updates=4", "checkpoint.keep_interval_updates=3")


def clean_env(**extra):
    env = {k: v for k, v in train_env().items() if k not in LAUNCH_VARS}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def torchrun(data, save_dir, audit, *extra, port=None):
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(port or free_port()),
            "-m", "fairseq_cli.hydra_train",
            *tiny_args(data, save_dir, *RUN, f"++task.audit_log={audit}", *extra)]


def error_lines(text):
    return sorted({line for line in text.splitlines() if line.startswith("ast-t5: error:")})


@pytest.fixture(scope="module")
def reference_run(pretrain_data, tmp_path_factory):
    """An uninterrupted 2-rank run (torchrun, gloo): its checkpoints, audit records and losses."""
    root = tmp_path_factory.mktemp("reference")
    run = subprocess.run(torchrun(pretrain_data, root / "ckpt", root / "audit", "+run_config=torchrun_cpu",
                                  "task.replica_check_interval=2"),
                         cwd=root, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    return root, run.stdout


@pytest.mark.slow
def test_kill_9_of_a_rank_then_the_same_command_resumes_bit_for_bit(pretrain_data, reference_run, tmp_path):
    ref_root, ref_stdout = reference_run
    cmd = torchrun(pretrain_data, tmp_path / "ckpt", tmp_path / "audit", "+run_config=torchrun_cpu",
                   "task.replica_check_interval=2")
    agent = subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 300

    def progressed():  # a checkpoint exists and training went on past it (the copy is complete)
        path = tmp_path / "audit" / "audit_rank0.jsonl"
        return (tmp_path / "ckpt" / "checkpoint_1_4.pt").exists() and path.exists() and \
            max(json.loads(l)["update"] for l in path.read_text().splitlines() if l.endswith("}")) >= 5
    while time.time() < deadline and agent.poll() is None and not progressed():
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, workers
    os.kill(int(workers[-1]), signal.SIGKILL)  # one rank dies; the other must stop too
    assert agent.wait(timeout=120) != 0
    killed_at = [len(read_audit(tmp_path / "audit", r)) for r in (0, 1)]
    assert max(killed_at) < 13, "the run finished before it could be killed"

    resumed = subprocess.run(cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, (resumed.stdout[-2000:], resumed.stderr[-3000:])
    assert "Loaded checkpoint" in resumed.stdout
    for rank in (0, 1):
        want = {r["update"]: r for r in read_audit(ref_root / "audit", rank)}
        got = read_audit(tmp_path / "audit", rank)[killed_at[rank]:]
        assert got and got[0]["update"] in (4, 8) and got[-1]["update"] == 11
        for rec in got:  # same samples, same parameters, bit for bit, on both ranks
            assert rec["ids"] == want[rec["update"]]["ids"], (rank, rec["update"])
            assert rec["checksum"] == want[rec["update"]]["checksum"], (rank, rec["update"])
    ref_loss = {r["num_updates"]: r["loss"] for r in json_logs(ref_stdout)}
    new_loss = {r["num_updates"]: r["loss"] for r in json_logs(resumed.stdout)}
    assert new_loss and all(ref_loss[u] == v for u, v in new_loss.items())


@pytest.mark.slow
def test_world_size_change_is_refused_or_resumes_by_samples_consumed(pretrain_data, reference_run, tmp_path):
    ref_root, _ = reference_run
    (tmp_path / "ckpt").mkdir()
    shutil.copyfile(ref_root / "ckpt" / "checkpoint_1_4.pt", tmp_path / "ckpt" / "checkpoint_last.pt")
    one = HYDRA_TRAIN + tiny_args(pretrain_data, tmp_path / "ckpt", *RUN,
                                  f"++task.audit_log={tmp_path / 'audit'}")
    refused = subprocess.run(one, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2
    assert error_lines(refused.stderr) == [
        "ast-t5: error: the checkpoint was saved by 2 ranks and this run has 1: the batch per update and "
        "the data position would change. Resume with 2 ranks, or accept with "
        "task.allow_world_size_change=true (keeps the position by samples consumed)"]
    assert not (tmp_path / "audit").exists(), "trained although refused"

    one = [a.replace("max_update=12", "max_update=6") for a in one]  # two updates are enough here
    accepted = subprocess.run(one + ["++task.allow_world_size_change=true"], cwd=tmp_path, env=clean_env(),
                              capture_output=True, text=True, timeout=600)
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    got = read_audit(tmp_path / "audit", 0)
    assert [r["update"] for r in got] == [4, 5]
    # 2 ranks consumed 2 x 4 batches: one process goes on with global batch 8 (rank 0's 5th
    # batch in the 2-rank run), then batch 9 (rank 1's 5th): nothing repeated, nothing skipped
    ref0, ref1 = read_audit(ref_root / "audit", 0), read_audit(ref_root / "audit", 1)
    assert got[0]["ids"] == ref0[4]["ids"] and got[1]["ids"] == ref1[4]["ids"]
    assert got[0]["checksum"] == ref0[4]["checksum"]  # the 2-rank model after 4 updates


@pytest.mark.slow
def test_a_launch_without_the_run_config_refuses_instead_of_training_copies(pretrain_data, tmp_path):
    run = subprocess.run(torchrun(pretrain_data, tmp_path / "ckpt", tmp_path / "audit"), cwd=tmp_path,
                         env=clean_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode != 0
    lines = error_lines(run.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "ast-t5: error: WORLD_SIZE=2 in the environment, but this process trains with world size 1")
    assert "+run_config=torchrun_cpu" in lines[0]
    assert not (tmp_path / "audit").exists() and not (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


class SilentListener:
    """A foreign program on the rendezvous port: accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        try:
            while True:
                self.conns.append(self.sock.accept()[0])
        except OSError:
            pass

    def close(self):
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.slow
def test_incomplete_launches_end_within_the_timeout_with_one_line(pretrain_data, tmp_path):
    """Rank 0 alone (WORLD_SIZE=2, hand-set variables), and rank 1 whose MASTER_PORT reaches
    another program: both stop after task.distributed_timeout (3 s here; the default is 10 min)
    with one line naming what they waited for. Run side by side to save time."""
    listener = SilentListener()
    args = tiny_args(pretrain_data, tmp_path / "ckpt", *RUN, "+run_config=torchrun_cpu",
                     "task.distributed_timeout=0.05")
    common = dict(MASTER_ADDR="127.0.0.1", WORLD_SIZE=2, LOCAL_RANK=0)
    lone = subprocess.Popen(HYDRA_TRAIN + args, cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env(**common, RANK=0, MASTER_PORT=free_port()))
    foreign = subprocess.Popen(HYDRA_TRAIN + args, cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               env=clean_env(**common, RANK=1, MASTER_PORT=listener.port))
    try:
        _, lone_err = lone.communicate(timeout=300)  # far below the 10 min default
        _, foreign_err = foreign.communicate(timeout=300)
    finally:
        listener.close()
    assert lone.returncode == 1 and foreign.returncode == 1
    [line] = error_lines(lone_err)
    assert line.startswith("ast-t5: error: rank 0 of 2: waited 0.05 min (task.distributed_timeout) "
                           "for the other 1 rank(s), in vain:"), line
    assert "1/2 clients joined" in line
    [line] = error_lines(foreign_err)
    assert line.startswith("ast-t5: error: rank 1 of 2: waited 0.05 min (task.distributed_timeout) for "
                           f"the rendezvous store at 127.0.0.1:{listener.port}, in vain:"), line


def test_torchrun_script_with_a_missing_node_stops_within_the_timeout(pretrain_data, tmp_path):
    """torchrun --nnodes 2 with only node 0: torchrun's own wait for the nodes is bounded by
    DIST_TIMEOUT_MIN (here 3 s) and names how many joined; no worker is started."""
    env = clean_env(NNODES=2, NODE_RANK=0, NPROC=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(),
                    DIST_TIMEOUT_MIN=0.05)
    script = os.path.join(REPO, "scripts", "torchrun_pretrain.sh")
    run = subprocess.run(["bash", script, pretrain_data, "tiny", "torchrun_cpu",
                          f"checkpoint.save_dir={tmp_path / 'ckpt'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "waiting for clients. 1/2 clients joined" in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_ranks_with_different_configs_stop_naming_the_key(pretrain_data, tmp_path):
    """Hand-set variables (as a Kubernetes job sets them); rank 1 has another learning rate."""
    port = free_port()
    procs = []
    for rank, extra in ((0, []), (1, ["optimization.lr=[0.01]"])):
        env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=2, RANK=rank, LOCAL_RANK=rank)
        procs.append(subprocess.Popen(
            HYDRA_TRAIN + tiny_args(pretrain_data, tmp_path / "ckpt", *RUN, "+run_config=torchrun_cpu",
                                    *extra),
            cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 2
        assert error_lines(err) == ["ast-t5: error: the ranks disagree on 1 key(s): optimization.lr "
                                    "(rank 0: [0.02], rank 1: [0.01])"]
    assert not (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def write_stand_ins(bin_dir):
    """scontrol and srun as a one-node SLURM cluster would answer; srun drops its own options
    and runs the command once (one task on the one node). nvidia-smi lists no GPU (a CPU node), so
    that the script's process count does not come from the GPUs of the host running the test."""
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    (bin_dir / "srun").write_text(
        "#!/bin/bash\necho \"srun $*\" >> \"$SRUN_LOG\"\n"
        "while [ $# -gt 0 ]; do case $1 in\n"
        "  --kill-on-bad-exit=*) shift;; --*) shift 2;; *) break;; esac\ndone\n"
        "[ -n \"$SRUN_DRY\" ] && exit 0\nexec \"$@\"\n")
    (bin_dir / "torchrun").write_text(f"#!/bin/sh\nexec {sys.executable} -m torch.distributed.run \"$@\"\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)


def slurm_env(tmp_path, **extra):
    env = clean_env(SRUN_LOG=tmp_path / "srun.log", SLURM_JOB_NODELIST="node1", SLURM_JOB_NUM_NODES=1,
                    **extra)
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.slow
def test_slurm_script_derives_port_and_process_count_and_trains(pretrain_data, tmp_path):
    write_stand_ins(tmp_path / "bin")
    script = os.path.join(REPO, "scripts", "slurm_pretrain.sh")

    def sbatch(*extra_args, **env):
        return subprocess.run(["bash", script, pretrain_data, "tiny", "torchrun_cpu", *extra_args],
                              cwd=tmp_path, env=slurm_env(tmp_path, **env), capture_output=True, text=True,
                              timeout=600)
    # no GPU, one task per node, no NPROC: refuse rather than guess 8
    run = sbatch(SLURM_JOB_ID=4242, SRUN_DRY=1)
    assert run.returncode == 2 and "cannot tell how many processes to start per node" in run.stderr
    # the port follows the job id; processes per node follow the allocation
    for job, gpus in ((4242, 4), (4243, 2)):
        assert sbatch(SLURM_JOB_ID=job, SLURM_GPUS_ON_NODE=gpus, SRUN_DRY=1).returncode == 0
    log = (tmp_path / "srun.log").read_text().splitlines()
    assert "--nproc-per-node 4 " in log[0] and "--rdzv-endpoint 127.0.0.1:24242 " in log[0]
    assert "--nproc-per-node 2 " in log[1] and "--rdzv-endpoint 127.0.0.1:24243 " in log[1]
    # a CPU job with two tasks per node trains 2 ranks through torchrun (c10d rendezvous)
    run = sbatch(f"checkpoint.save_dir={tmp_path / 'ckpt'}", "optimization.max_update=2",
                 f"++task.audit_log={tmp_path / 'audit'}", SLURM_JOB_ID=4244,
                 SLURM_NTASKS_PER_NODE=2, MASTER_PORT=free_port())
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert len(read_audit(tmp_path / "audit", 0)) == len(read_audit(tmp_path / "audit", 1)) == 2


def test_broadcast_training_state_loads_with_torch_defaults():
    """What fairseq's broadcast_object sends to ranks >= 1 (a state with its OmegaConf config),
    read back with torch.load's default weights_only=True once the plugin is imported."""
    from omegaconf import OmegaConf
    from fairseq.distributed.utils import _put_tensors_in_obj, _split_tensors_from_obj

    import ast_t5.distributed  # noqa: F401  (the allow-list)

    state = {"cfg": OmegaConf.create({"optimization": {"lr": [0.02]}, "task": {"data": "/d", "x": None}}),
             "model": {"w": torch.arange(4.0)}, "extra_state": {"train_iterator": {"epoch": 1}},
             "optimizer_history": [{"num_updates": 4}]}
    tensors = []
    buffer = io.BytesIO()
    torch.save(_split_tensors_from_obj(state, tensors), buffer)
    buffer.seek(0)
    back = _put_tensors_in_obj(torch.load(buffer, map_location="cpu"), tensors)
    assert back["cfg"] == state["cfg"] and back["cfg"].optimization.lr == [0.02]
    assert torch.equal(back["model"]["w"], state["model"]["w"])

    buffer = io.BytesIO()
    torch.save({"x": Foreign()}, buffer)  # anything else is still refused
    buffer.seek(0)
    with pytest.raises(Exception, match="Unsupported global"):
        torch.load(buffer)


class Foreign:
    pass


def test_disagreements_name_every_differing_key():
    from ast_t5.distributed import disagreements

    fps = [{"optimization.lr": "[0.02]", "code:ast_t5/x.py": "aa"},
           {"optimization.lr": "[0.02]", "code:ast_t5/x.py": "bb"},
           {"optimization.lr": "[0.01]", "code:ast_t5/x.py": "aa", "task.extra": "1"}]
    assert disagreements(fps) == ["code:ast_t5/x.py (rank 0: aa, rank 1: bb)",
                                  "optimization.lr (rank 0: [0.02], rank 2: [0.01])",
                                  "task.extra (rank 0: <absent>, rank 2: 1)"]
    assert disagreements(fps[:1] * 3) == []
