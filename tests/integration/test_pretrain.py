"""End-to-end pre-training through `fairseq-hydra-train` (the real entry point, run from another
working directory): loss falls and is logged, exact resume after SIGKILL, and two processes with
gloo keep identical replicas while seeing different data."""
import json
import os
import signal
import subprocess
import sys
import time


from .conftest import PRETRAIN_CONFIGS, free_port, train_env

HYDRA_TRAIN = [sys.executable, "-m", "fairseq_cli.hydra_train"]


def tiny_args(data, save_dir, *extra):
    return ["--config-dir", PRETRAIN_CONFIGS, "--config-name", "tiny", f"task.data={data}",
            f"checkpoint.save_dir={save_dir}", "common.log_format=json", *extra]


def json_logs(text, key="train_inner"):
    """fairseq's JSON log records (one dict per logging step) from its output."""
    out = []
    for line in text.splitlines():
        start = line.find("{")
        if f"[{key}]" in line and start >= 0:
            out.append(json.loads(line[start:]))
    return out


def read_audit(folder, rank):
    with open(os.path.join(folder, f"audit_rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_tiny_pretraining_loss_falls_and_logs(pretrain_data, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    run = subprocess.run(HYDRA_TRAIN + tiny_args(
        pretrain_data, tmp_path / "ckpt", "optimization.max_update=80", "common.log_interval=10",
        f"common.tensorboard_logdir={tmp_path / 'tb'}"), cwd=cwd, env=train_env(),
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    logs = json_logs(run.stdout)
    assert len(logs) >= 6
    first, last = float(logs[0]["loss"]), float(logs[-1]["loss"])
    assert last < first - 1.0, (first, last)
    for key in ("masked_accuracy", "wps", "src_wps", "tflops", "share_python", "share_rust"):
        assert key in logs[-1], (key, sorted(logs[-1]))
    assert float(logs[-1]["tflops"]) >= 0 and "mfu" not in logs[-1]  # CPU: no known peak, no MFU
    assert abs(sum(float(v) for k, v in logs[-1].items() if k.startswith("share_")) - 1) < 0.02
    assert os.path.exists(tmp_path / "ckpt" / "checkpoint_last.pt")
    events = [f for _, _, fs in os.walk(tmp_path / "tb") for f in fs if f.startswith("events.out")]
    assert events, "no TensorBoard event files"


def _resume_run(data, save_dir, audit, *extra):
    return HYDRA_TRAIN + tiny_args(data, save_dir, "optimization.max_update=30",
                                   "common.log_interval=1", "checkpoint.save_interval_updates=6",
                                   "checkpoint.keep_interval_updates=2", f"task.audit_log={audit}", *extra)


def test_resume_after_sigkill_reproduces_the_uninterrupted_run(pretrain_data, tmp_path):
    env = train_env()
    ref = subprocess.run(_resume_run(pretrain_data, tmp_path / "ref", tmp_path / "ref_audit"),
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    cmd = _resume_run(pretrain_data, tmp_path / "run", tmp_path / "run_audit")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = tmp_path / "run" / "checkpoint_1_12.pt"
    deadline = time.time() + 300

    def saved_and_moved_on():
        """The update-12 checkpoint exists and training went on past it: fairseq writes
        checkpoint_1_12.pt first and checkpoint_last.pt after it, so a kill between the two would
        resume from update 6 (a race a loaded machine can hit)."""
        if not marker.exists():
            return False
        try:
            return any(r["update"] >= 14 for r in read_audit(tmp_path / "run_audit", 0))
        except (OSError, ValueError):  # not written yet, or a line being written
            return False

    while time.time() < deadline and not saved_and_moved_on() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(read_audit(tmp_path / "run_audit", 0))
    assert killed_at < 30, "the run finished before it could be killed"
    resumed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Loaded checkpoint" in resumed.stdout
    want = {r["update"]: r for r in read_audit(tmp_path / "ref_audit", 0)}
    got = read_audit(tmp_path / "run_audit", 0)[killed_at:]
    assert got and got[0]["update"] >= 12
    for rec in got:  # same samples, same parameters, bit for bit
        assert rec["ids"] == want[rec["update"]]["ids"]
        assert rec["checksum"] == want[rec["update"]]["checksum"]
    ref_loss = {r["num_updates"]: r["loss"] for r in json_logs(ref.stdout)}
    new_loss = {r["num_updates"]: r["loss"] for r in json_logs(resumed.stdout)}
    assert new_loss and all(ref_loss[u] == v for u, v in new_loss.items())


def test_two_processes_keep_identical_replicas_on_different_data(pretrain_data, tmp_path):
    audit = tmp_path / "audit"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "fairseq_cli.hydra_train",
           *tiny_args(pretrain_data, tmp_path / "ckpt", "optimization.max_update=8",
                      "common.log_interval=2", f"task.audit_log={audit}", "+run_config=torchrun_cpu")]
    run = subprocess.run(cmd, cwd=tmp_path, env=train_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    r0, r1 = read_audit(audit, 0), read_audit(audit, 1)
    assert len(r0) == len(r1) == 8
    for a, b in zip(r0, r1):
        assert a["update"] == b["update"]
        assert a["checksum"] == b["checksum"], "replicas diverged"
        assert not set(a["ids"]) & set(b["ids"]), "both ranks trained on the same samples"
    assert r0[0]["checksum"] != r0[-1]["checksum"], "parameters never changed"
