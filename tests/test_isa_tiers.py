"""The tests that depend on the instruction set, rerun on every lower tier this CPU can execute.

The suite runs on the best tier of the machine (what users get there). The native kernels' own
tests (test_native_kernels.py) switch tiers in-process and cover every tier the CPU can run. The
tests on the real models are rerun here in a child pytest with ``LLMEDGE_ISA`` forcing each lower
tier, so one machine proves every tier below its own:

- a lower SIMD tier (AVX2 on an AVX-512 machine): the fused stack against the op-by-op path, and
  logits against llama.cpp on both models (greedy continuations follow from the same products);
- scalar: SmolLM2's logits against llama.cpp (the scalar kernels are 10-20x slower than SIMD ones;
  Gemma's 1,194-token prompt alone would take minutes on 2 cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmedge.backends import native_status

TESTS = Path(__file__).parent

SIMD_SELECTION = ["test_native_stack.py", "test_conformance.py", "-k", "(native and logits) or fused or sequences"]
SCALAR_SELECTION = ["test_conformance.py", "-k", "smollm2-native and logits"]


def lower_tiers() -> list[str]:
    """The tiers this CPU can run below its best one (empty without the native build)."""
    if not native_status()[0]:
        return []
    from llmedge.backends.native import NativeBackend

    isas = NativeBackend.available_isas()
    return isas[:-1]


def test_this_machine_has_a_lower_tier_to_prove() -> None:
    """Every CPU the project supports has a SIMD tier above scalar, so scalar is always proven here."""
    assert native_status()[0], native_status()[1]
    assert "scalar" in lower_tiers()


@pytest.mark.parametrize("tier", lower_tiers())
def test_isa_dependent_tests_pass_on_lower_tier(tier: str) -> None:
    selection = SCALAR_SELECTION if tier == "scalar" else SIMD_SELECTION
    env = dict(os.environ, LLMEDGE_ISA=tier)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection],
                       cwd=TESTS, env=env, capture_output=True, text=True, timeout=1200)
    tail = "\n".join(r.stdout.splitlines()[-25:])
    assert r.returncode == 0, f"LLMEDGE_ISA={tier}:\n{tail}\n{r.stderr[-2000:]}"
    assert " passed" in tail and " failed" not in tail, tail
