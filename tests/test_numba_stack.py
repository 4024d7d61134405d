"""The fused Numba decoder stack (every layer of a step in one compiled call), on both real models.

The fused call runs the op-by-op path's kernels in its order, so it must give exactly its logits:
for a prefill in chunks, for single-token decode steps, and after Gemma's sliding-window rings wrap.
Models, caches and steps it does not encode must fall back to op by op, never run wrongly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backend_checks import fused_matches_op_by_op
from llmedge.api import Model
from llmedge.backends.numba_cpu import fused, team
from llmedge.backends.numba_cpu.fused import StackPlan

TEXTS = Path(__file__).parent / "fixtures" / "texts"


def _ids(m: Model, n: int) -> list[int]:
    text = (TEXTS / "gpl3_30k.txt").read_text(encoding="utf-8")
    ids = m.tokenize(text[: 8 * n], add_bos=True)[:n]
    assert len(ids) == n
    return ids


def _paired(m: Model, ids: list[int], follow: list[int]) -> tuple[int, Any]:
    return fused_matches_op_by_op(m, ids, follow, "_numba_stack")


@pytest.mark.parametrize(("name", "n_prompt", "n_ctx"), [("smollm2", 40, 128), ("gemma3", 100, 704)])
def test_numba_fused_stack_equals_op_by_op(name: str, n_prompt: int, n_ctx: int,
                                           model_paths: dict[str, Path]) -> None:
    m = Model(model_paths[name], backend="numba", n_ctx=n_ctx, n_batch=32)
    rows, cache = _paired(m, _ids(m, n_prompt), [17, 300, 9])
    assert rows == n_prompt + 3
    if name == "gemma3":  # Gemma 3's local layers keep a ring of 640 cells (kvcache.ring_capacity)
        assert any(layer.ring for layer in cache.layers)


def test_numba_fused_stack_declines_what_it_does_not_encode(model_paths: dict[str, Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = fused._decoder_layers
    monkeypatch.setattr(fused, "_decoder_layers", lambda *a: calls.append(1) or real(*a))
    for kv_type, expected in (("f16", 1), ("f32", 0)):  # an f32 cache is not encoded: op by op
        m = Model(model_paths["smollm2"], backend="numba", n_ctx=64, n_batch=16, kv_type=kv_type)
        cache = m.engine.new_cache()
        calls.clear()
        m.engine.forward(cache, _ids(m, 5))
        assert len(calls) == expected, kv_type
        assert all(layer.used == 5 for layer in cache.layers)
    net = m.model
    assert StackPlan.decline_reason(net) is None
    saved = net.specs
    try:
        net.specs = [dataclasses.replace(s, qkv_bias=True) for s in saved]
        assert "qkv_bias" in (StackPlan.decline_reason(net) or "")
    finally:
        net.specs = saved


def test_team_step_completes_without_waiting_for_a_member_that_comes_late(model_paths: dict[str, Path],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A team of two members on one pool thread: the first runs the whole step before the second
    starts (a member descheduled for the whole step, as on a busy core). The first must not wait
    for the second (the tasks of each op are claimed, not shared out in fixed parts), the second
    must find every phase done, and the logits must equal the op-by-op path's."""
    m = Model(model_paths["smollm2"], backend="numba", n_ctx=64, n_batch=16, n_threads=1)
    real, ran = fused._run_team, []

    def two_members(nth: int, *args: Any) -> bool:
        ok = real(2, *args)
        ran.append(ok)
        return ok

    monkeypatch.setattr(fused, "_run_team", two_members)
    monkeypatch.setattr(team, "SPIN_LIMIT", 1 << 16)  # a wait for the late member gives up at once
    rows, _ = _paired(m, _ids(m, 6), [17, 300])
    assert rows == 8
    assert ran and all(ran) and not fused._team_failed


def test_a_failed_team_step_is_run_again_on_the_same_cache_reservations(model_paths: dict[str, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A team that gives up (a task stuck) has written nothing of x but its step's cache cells are
    already reserved: the step must be run again on those cells, not handed back to the op-by-op
    path (which would reserve a second set and shift every later position)."""
    m = Model(model_paths["smollm2"], backend="numba", n_ctx=64, n_batch=16, n_threads=2)
    monkeypatch.setattr(fused, "_run_team", lambda *args: False)
    rows, cache = _paired(m, _ids(m, 6), [17, 300])
    assert rows == 8 and all(layer.used == 8 for layer in cache.layers)


def test_team_steps_of_two_and_three_rows_equal_op_by_op(model_paths: dict[str, Path]) -> None:
    """Steps of up to three rows (decode, short speculative verifications) run as one team region
    on two threads; their logits equal the op-by-op path's exactly, on both real models."""
    for name in ("smollm2", "gemma3"):
        m = Model(model_paths[name], backend="numba", n_ctx=128, n_batch=32, n_threads=2)
        assert fused.TEAM_MAX_ROWS == 3
        rows, _ = _paired(m, _ids(m, 20), [17])
        assert rows == 21
        net, eng = m.model, m.engine
        caches = {True: eng.new_cache(), False: eng.new_cache()}
        for piece in (_ids(m, 9), [5, 6], [7, 8, 9]):
            out = {}
            for use in (True, False):
                net._numba_stack = None if use else False
                out[use] = eng.forward(caches[use], piece, all_logits=True)
            np.testing.assert_array_equal(out[True], out[False])
        net._numba_stack = None
