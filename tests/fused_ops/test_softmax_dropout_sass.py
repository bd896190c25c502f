"""The fused softmax-dropout kernels' machine code, compiled for Hopper without a GPU
(`scripts/fused_ops_sass.py`: nvcc, then cuobjdump): a row's loads are issued together.

A branch per key used to give each key's loads a basic block of their own, consumed before the
next key's were issued: 32 memory round trips per row of 1,024 keys, one after the other. These
tests fail on that code (3 loads at most in one block)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import fused_ops_sass  # noqa: E402


@pytest.fixture(scope="module")
def sm90_bf16():
    try:
        rows = fused_ops_sass.kernel_table(90)
    except fused_ops_sass.ToolMissing as e:
        pytest.skip(f"cannot compile CUDA here: {e}")
    return {(r["direction"], r["keys"]): r for r in rows if r["dtype"] == "bf16"}


@pytest.mark.parametrize("direction, loads_per_key", [("forward", 3), ("backward", 2)])
@pytest.mark.parametrize("keys", [512, 1024, 4096])
def test_a_rows_loads_share_one_basic_block(sm90_bf16, direction, loads_per_key, keys):
    """Every key a thread holds has its loads in one block: scores, bias and mask in the forward
    (the variant with both), gradient and probabilities in the backward (plus the keep-mask words)."""
    row = sm90_bf16[(direction, keys)]
    assert row["max_loads_in_a_block"] >= loads_per_key * row["keys_per_thread"], row


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_no_kernel_up_to_8192_keys_spills(sm90_bf16, direction):
    """Holding a row's loads takes registers: up to 8,192 keys none spill on sm_90. (The 16,384-key
    kernels, 512 threads capped at 128 registers each, spill a few hundred bytes: rows that long are
    outside T5's lengths.)"""
    for (d, keys), row in sm90_bf16.items():
        if d == direction and keys <= 8192:
            assert row["spill_bytes"] == 0, row


def test_basic_blocks_split_at_branches_barriers_and_targets():
    code = [(0x00, "LDG.E R1, desc[UR4][R2.64]"), (0x10, "LDG.E R3, desc[UR4][R2.64+0x4]"),
            (0x20, "@P0 BRA 0x50"), (0x30, "LDG.E R5, desc[UR4][R2.64+0x8]"), (0x40, "BSSY B0, 0x70"),
            (0x50, "FADD R1, R1, R3"), (0x60, "BSYNC B0"), (0x70, "EXIT")]
    blocks = fused_ops_sass.basic_blocks(code)
    assert [len(b) for b in blocks] == [3, 2, 2, 1]
    assert [sum("LDG" in t for t in b) for b in blocks] == [2, 1, 0, 0]
