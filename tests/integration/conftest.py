"""Fixtures for end-to-end training tests: a small preprocessed corpus (real standard-library
code plus the bundled samples of other languages), made once per session."""
import os
import socket

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRETRAIN_CONFIGS = os.path.join(REPO, "config", "pretrain")


@pytest.fixture(scope="session")
def pretrain_data(tmp_path_factory, code_corpus):
    from ast_t5_preprocess.cli import main

    out = tmp_path_factory.mktemp("pretrain_data")
    assert main(["run", str(code_corpus), "-o", str(out), "--vocab-size", "800", "--num-sentinels", "32",
                 "--max-tokens", "256", "--valid-ratio", "0.15", "--no-progress"]) == 0
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_env():
    """The environment for training subprocesses: one thread each, so two fit on two cores."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env
