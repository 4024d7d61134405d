"""The fused native decoder stack (one C call per step) and multi-sequence steps, on both real models.

The fused call must give exactly the logits of the op-by-op path (same kernels, same order), for a
prefill in chunks, for single-token decode steps, and after Gemma's sliding-window rings wrap. A step
over several sequences must give each sequence what it gets alone, up to the summation order of
the matrix products (an n-row product uses llama.cpp's batched kernels, one row its vec_dot).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backend_checks import fused_matches_op_by_op
from llmedge.api import Model
from llmedge.models.base import Batch

TEXTS = Path(__file__).parent / "fixtures" / "texts"


def _ids(m: Model, n: int, start: int = 0) -> list[int]:
    text = (TEXTS / "gpl3_30k.txt").read_text(encoding="utf-8")
    ids = m.tokenize(text[start : start + 8 * n], add_bos=True)[:n]
    assert len(ids) == n
    return ids


def _paired(m: Model, ids: list[int], follow: list[int]) -> tuple[int, Any]:
    return fused_matches_op_by_op(m, ids, follow, "_native_stack")


@pytest.mark.parametrize(("name", "n_prompt"), [("smollm2", 300), ("gemma3", 720)])
def test_fused_stack_equals_op_by_op(name: str, n_prompt: int, model_paths: dict[str, Path]) -> None:
    m = Model(model_paths[name], backend="native", n_ctx=1024, n_batch=128)
    ids = _ids(m, n_prompt)
    follow = [17, 300, 9, 1000]
    rows, cache = _paired(m, ids, follow)
    assert rows == n_prompt + len(follow)
    if name == "gemma3":  # the sliding-window rings (704 cells) moved their cells to the front
        rings = [layer for layer in cache.layers if layer.ring]
        assert rings and all(layer.capacity < n_prompt and layer.valid_positions().min() > 0 for layer in rings)


@pytest.mark.parametrize("kv_type", ["q8_0", "f32"])
def test_fused_stack_with_other_cache_types(kv_type: str, model_paths: dict[str, Path]) -> None:
    m = Model(model_paths["smollm2"], backend="native", n_ctx=256, n_batch=64, kv_type=kv_type)
    ids = _ids(m, 150)  # three prefill chunks
    rows, _ = _paired(m, ids, [5, 77])
    assert rows == 152


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_step_over_sequences_matches_each_alone(name: str, model_paths: dict[str, Path]) -> None:
    m = Model(model_paths[name], backend="native", n_ctx=256)
    net, eng = m.model, m.engine
    prompts = [_ids(m, n, start) for n, start in ((9, 0), (23, 500), (4, 1200))]
    alone = []
    for p in prompts:
        cache = eng.new_cache()
        first = eng.forward(cache, p)[-1]
        alone.append((first, eng.forward(cache, [42])[-1]))
    caches = [eng.new_cache() for _ in prompts]
    batches = [Batch(np.array(p), np.arange(len(p)), c, np.array([len(p) - 1])) for p, c in zip(prompts, caches)]
    firsts = net.forward_many(batches)
    for c, p in zip(caches, prompts):
        c.tokens.extend(p)
    steps = net.forward_many([Batch(np.array([42]), np.array([len(p)]), c) for p, c in zip(prompts, caches)])
    for (a_first, a_next), b_first, b_next in zip(alone, firsts, steps):
        assert b_first.shape == (1, m.params.n_vocab)
        for a, b in ((a_first, b_first[0]), (a_next, b_next[0])):
            assert int(np.argmax(a)) == int(np.argmax(b))
            assert np.max(np.abs(a - b)) < 0.05 * max(1.0, float(np.max(np.abs(a))))


def test_fused_stack_refuses_rows_without_room_and_claims_nothing(model_paths: dict[str, Path]) -> None:
    """The C stack claims every step's cells itself (no Python per layer); rows that do not fit raise
    the message LayerCache.reserve gives, before any layer's cursor or positions change."""
    m = Model(model_paths["smollm2"], backend="native", n_ctx=32)
    net, eng = m.model, m.engine
    cache = eng.new_cache()
    ids = _ids(m, 28)
    net.forward(Batch(np.array(ids), np.arange(28), cache, np.array([27])))
    cache.tokens.extend(ids)
    assert all(layer.used == layer.head == 28 for layer in cache.layers)
    before = [(layer.cursor.copy(), layer.pos.copy()) for layer in cache.layers]
    with pytest.raises(ValueError, match=r"KV cache full: 28 \+ 5 tokens > 32 cells"):
        net.forward(Batch(np.array(ids[:5]), np.arange(28, 33), cache, np.array([4])))
    for layer, (cursor, pos) in zip(cache.layers, before):
        assert np.array_equal(layer.cursor, cursor) and np.array_equal(layer.pos, pos)
    out = net.forward(Batch(np.array(ids[:4]), np.arange(28, 32), cache, np.array([3])))  # exactly fits
    assert out.shape == (1, m.params.n_vocab)
    assert all(layer.used == 32 and list(layer.pos[28:32]) == [28, 29, 30, 31] for layer in cache.layers)


@pytest.mark.parametrize("n_seqs", [2, 3, 4])
def test_decode_layer_as_one_job_gives_the_separate_jobs_logits(n_seqs: int, model_paths: dict[str, Path]) -> None:
    """Several sequences' decode rows run each layer as one pool job of phases (layer.c's layer_job) or as
    separate jobs with the norms, adds and GLU between them: every logit is the same bit for bit, over
    steps where the sequences hold different numbers of cells (and the row phases split rows unevenly)."""
    from llmedge.backends.native import lib

    m = Model(model_paths["smollm2"], backend="native", n_ctx=256)
    net, eng = m.model, m.engine
    prompts = [_ids(m, n, start) for n, start in ((9, 0), (23, 500), (4, 1200), (40, 2000))[:n_seqs]]
    logits = {}
    try:
        for on in (1, 0):
            lib.lle_set_layer_job(on)
            caches = [eng.new_cache() for _ in prompts]
            for c, p in zip(caches, prompts):
                eng.forward(c, p)
            rows = []
            for tok in (42, 7, 1999):
                pos = [c.offset for c in caches]
                out = net.forward_many([Batch(np.array([tok]), np.array([q]), c, row_exact=True)
                                        for q, c in zip(pos, caches)])
                for c in caches:
                    c.tokens.append(tok)
                rows.append(np.concatenate(out))
            logits[on] = np.stack(rows)
    finally:
        lib.lle_set_layer_job(1)
    assert logits[1].shape == (3, n_seqs, m.params.n_vocab)
    assert np.array_equal(logits[1], logits[0])
