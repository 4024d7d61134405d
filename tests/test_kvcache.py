"""The KV cache on its own: cache types, full buffers and sliding rings, trim, context shift (RoPE
re-rotation of the kept keys), states, memory accounting; and Gemma 3's cache at a 32k context."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import skip_or_fail
from llmedge.backends.numpy_ref import NumpyBackend
from llmedge.errors import LlmedgeError
from llmedge.kvcache import (
    CELL_ALIGN,
    QK8_0,
    LayerCache,
    SequenceCache,
    dequantize_q8_0,
    quantize_q8_0,
    ring_capacity,
)
from llmedge.models.base import make_sequence_cache
from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import dequantize, quantize

TEXTS = Path(__file__).parent / "fixtures" / "texts"
H, D = 2, 64  # kv heads, head size
BE = NumpyBackend()


def rows(positions, seed: int = 0) -> np.ndarray:
    """Deterministic "pre-RoPE" K or V rows for positions (depends on the position only)."""
    out = np.empty((len(positions), H, D), dtype=np.float32)
    for i, p in enumerate(positions):
        out[i] = np.random.default_rng(seed * 100003 + int(p)).standard_normal((H, D), dtype=np.float32)
    return out


def fill(layer: LayerCache, start: int, stop: int, batch: int = 1, rope=None) -> None:
    """Append positions start..stop in batches; keys rotated at their positions when ``rope`` is set."""
    for p0 in range(start, stop, batch):
        pos = np.arange(p0, min(stop, p0 + batch))
        k = rows(pos)
        if rope is not None:
            k = BE.rope(k, pos, *rope)
        layer.update_and_fetch(k, rows(pos, seed=1), pos)


def by_position(layer: LayerCache) -> dict[int, int]:
    return {int(p): i for i, p in enumerate(layer.pos[: layer.used]) if p >= 0}


# -- q8_0 -------------------------------------------------------------------------------------------
def test_q8_0_cells_are_byte_identical_to_ggml_x86_quantization() -> None:
    x = np.random.default_rng(3).standard_normal((7, H, D)).astype(np.float32) * 3
    x[0, 0, :32] = 0.0  # an all-zero block
    qs, d = quantize_q8_0(x)
    ref = quantize(x.reshape(-1, D), T.Q8_0, variant="x86").reshape(-1, 34)
    ours = np.concatenate([d.reshape(-1, 1).view(np.uint8), qs.reshape(-1, QK8_0).view(np.uint8)], axis=1)
    assert np.array_equal(ours, ref)
    back = dequantize_q8_0(qs, d)
    assert np.array_equal(back, dequantize(ref, T.Q8_0, (7 * H, D)).reshape(x.shape))
    assert np.abs(back - x).max() <= np.abs(x).max() / 127


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_cache_types_store_what_attention_reads(kv_type: str) -> None:
    layer = LayerCache(16, H, D, D, kv_type)
    k, v = rows(range(5)), rows(range(5), seed=1)
    k_all, v_all, pos = layer.update_and_fetch(k, v, np.arange(5))
    tol = {"f32": 0, "f16": 2e-3, "q8_0": 2e-2}[kv_type]
    assert k_all.dtype == (np.float16 if kv_type == "f16" else np.float32)
    assert np.allclose(k_all, k, atol=tol * 4, rtol=tol) and np.allclose(v_all, v, atol=tol * 4, rtol=tol)
    assert pos.tolist() == [0, 1, 2, 3, 4]


def test_q8_0_cache_takes_about_half_the_bytes_of_f16() -> None:
    f16 = make_sequence_cache(4, 1024, H, D, "f16", [None] * 4, 64)
    q8 = make_sequence_cache(4, 1024, H, D, "q8_0", [None] * 4, 64)
    f32 = make_sequence_cache(4, 1024, H, D, "f32", [None] * 4, 64)
    assert 0.5 < q8.nbytes / f16.nbytes < 0.56
    assert 1.9 < f32.nbytes / f16.nbytes < 2.01


def test_unknown_cache_type_and_q8_0_with_odd_head_size_are_refused() -> None:
    with pytest.raises(LlmedgeError, match="unsupported KV cache type 'q4'"):
        make_sequence_cache(1, 64, H, D, "q4", [None], 8)
    with pytest.raises(LlmedgeError, match="multiples of 32"):
        make_sequence_cache(1, 64, H, 48, "q8_0", [None], 8)


# -- full buffers and rings -------------------------------------------------------------------------
def test_full_layer_appends_and_refuses_to_overflow() -> None:
    layer = LayerCache(8, H, D, D, "f32")
    fill(layer, 0, 8, batch=3)
    assert layer.pos.tolist() == list(range(8)) and layer.offset == 8
    with pytest.raises(ValueError, match="KV cache full"):
        layer.update_and_fetch(rows([8]), rows([8]), np.array([8]))


@pytest.mark.parametrize("batch", [1, 5, 8])
def test_ring_keeps_every_cell_each_query_of_a_batch_can_see(batch: int) -> None:
    window, max_batch = 12, 8
    layer = LayerCache(window + max_batch, H, D, D, "f16", window=window, ring=True)
    for p0 in range(0, 100, batch):
        pos = np.arange(p0, p0 + batch)
        _, _, k_pos = layer.update_and_fetch(rows(pos), rows(pos, 1), pos)
        held = set(k_pos[k_pos >= 0].tolist())
        needed = set(range(max(0, p0 - window + 1), p0 + batch))
        assert needed <= held, (p0, sorted(needed - held))
    assert layer.nbytes < 40 * H * D * 2 * 2  # does not grow with the sequence


def test_sliding_layers_are_rings_only_when_smaller_than_the_context() -> None:
    short = make_sequence_cache(3, 24, H, D, "f16", [16, None, 16], 8)
    long = make_sequence_cache(3, 1000, H, D, "f16", [16, None, 16], 8)
    assert [la.ring for la in short.layers] == [False, False, False]
    assert [la.capacity for la in long.layers] == [24, 1000, 24]
    assert ring_capacity(16, 8) == 24 and ring_capacity(512, 512) == 1088  # 64-aligned from a 64-cell window
    assert [la.ring for la in long.layers] == [True, False, True]
    layer_bytes = sum(la.nbytes for la in long.layers)
    assert layer_bytes <= long.nbytes <= layer_bytes + 64 * 9  # one arena: the layers plus alignment


@pytest.mark.parametrize("batch", [1, 5, 16])
def test_ring_cells_follow_positions_in_order_as_llama_cpp_lays_them_out(batch: int) -> None:
    """llama-cpp-python's SWA cache (swa_full) holds position p in cell p and attention sums by cell
    index mod up to 64: a ring keeps cell = position (mod CELL_ALIGN), in position order, whatever
    the batches, so it sums the same way."""
    window, max_batch = 100, 16
    layer = LayerCache(ring_capacity(window, max_batch), H, D, D, "f16", window=window, ring=True)
    assert layer.capacity == 192
    for p0 in range(0, 1000, batch):
        pos = np.arange(p0, p0 + batch)
        layer.update_and_fetch(rows(pos), rows(pos, 1), pos)
        cells = by_position(layer)
        assert set(range(max(0, p0 - window + 1), p0 + batch)) <= set(cells)
        assert all(cell % CELL_ALIGN == p % CELL_ALIGN for p, cell in cells.items()), p0
        order = [cells[p] for p in sorted(cells)]
        assert order == sorted(order), p0  # walked by cell index, the positions come in order
    k = layer.k.arrays[0][by_position(layer)[999]]
    assert np.array_equal(k, rows([999])[0].astype(np.float16))


def test_a_refused_batch_moves_no_cell() -> None:
    layer = LayerCache(128, H, D, D, "f32", window=12, ring=True)
    fill(layer, 0, 127)
    before = layer.state()
    big = np.arange(127, 127 + layer.capacity)
    with pytest.raises(ValueError, match="exceeds the sliding-window ring"):
        layer.update_and_fetch(rows(big), rows(big), big)
    assert np.array_equal(layer.state().pos, before.pos) and layer.can_trim_to(127)


def test_trim_keeps_a_prefix_and_rings_refuse_what_they_lost() -> None:
    full = LayerCache(64, H, D, D, "f32")
    fill(full, 0, 40)
    assert full.can_trim_to(17)
    full.trim_to(17)
    assert full.used == 17 and full.offset == 17
    ring = LayerCache(128, H, D, D, "f32", window=12, ring=True)
    fill(ring, 0, 300)  # its cells moved to the front several times, keeping 26 positions of history
    assert ring.can_trim_to(300 - 26) and not ring.can_trim_to(200)
    ring.trim_to(290)
    held = sorted(by_position(ring))
    assert held[-1] == 289 and held == list(range(held[0], 290)) and len(held) >= 11 + 26
    assert all(cell % CELL_ALIGN == p % CELL_ALIGN for p, cell in by_position(ring).items())
    fill(ring, 290, 400)  # continues after the trim without losing its window
    assert set(range(388, 400)) <= set(by_position(ring))


# -- context shift ----------------------------------------------------------------------------------
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("ring", [False, True])
def test_shift_moves_kept_keys_as_if_computed_at_their_new_positions(neox: bool, ring: bool) -> None:
    rope = (D, 10000.0, 1.0, neox)
    n_keep, n_discard, n = 4, 11, 30
    layer = LayerCache(24 if ring else 64, H, D, D, "f32", window=16 if ring else None, ring=ring)
    layer.rope = rope
    fill(layer, 0, n, batch=3, rope=rope)
    before = by_position(layer)
    v_before = {p: layer.v.arrays[0][i].copy() for p, i in before.items()}
    layer.shift(n_keep, n_discard, BE)
    after = by_position(layer)
    expect = {p if p < n_keep else p - n_discard for p in before if not n_keep <= p < n_keep + n_discard}
    assert set(after) == expect
    p = layer.pos[: layer.used]
    assert list(p[p >= 0]) == sorted(expect) and np.all(p[: layer.used - len(expect)] == -1)  # compacted, in order
    for new_p, i in after.items():
        old_p = new_p if new_p < n_keep else new_p + n_discard
        fresh = BE.rope(rows([old_p]), np.array([new_p]), *rope)[0]  # that token's key computed at new_p
        assert np.allclose(layer.k.arrays[0][i], fresh, atol=2e-5), new_p
        assert np.array_equal(layer.v.arrays[0][i], v_before[old_p])


def test_shift_rotates_f16_and_q8_0_keys_within_their_precision() -> None:
    rope = (D, 10000.0, 1.0, True)
    for kv_type, tol in (("f16", 3e-3), ("q8_0", 6e-2)):
        layer = LayerCache(64, H, D, D, kv_type)
        layer.rope = rope
        fill(layer, 0, 40, rope=rope)
        layer.shift(1, 19, BE)
        kf = layer.k.to_f32(layer.k.take(slice(1, 21)))
        fresh = BE.rope(rows(range(20, 40)), np.arange(1, 21), *rope)
        assert np.abs(kf - fresh).max() <= tol * np.abs(fresh).max(), kv_type


def _seq(windows: list[int | None], n_ctx: int, max_batch: int) -> SequenceCache:
    cache = make_sequence_cache(len(windows), n_ctx, H, D, "f32", windows, max_batch)
    for layer in cache.layers:
        layer.rope = (D, 10000.0, 1.0, False)
    return cache


def _extend(cache: SequenceCache, n: int, batch: int = 1) -> None:
    for layer in cache.layers:
        fill(layer, cache.offset, cache.offset + n, batch)
    cache.tokens.extend(range(cache.offset, cache.offset + n))


def test_sequence_shift_drops_tokens_and_keeps_positions_equal_to_token_indices() -> None:
    cache = _seq([None, 16], 100, 8)
    _extend(cache, 100, batch=7)
    tokens = list(cache.tokens)
    assert cache.shift(10, 45, BE)
    assert cache.tokens == tokens[:10] + tokens[55:]
    for layer in cache.layers:
        assert layer.offset == cache.offset == 55
        assert layer.can_trim_to(55)
    _extend(cache, 20)  # and goes on from there
    assert cache.offset == 75


def test_ring_that_lost_cells_coming_back_into_view_refuses_to_shift() -> None:
    cache = _seq([16, None], 1000, 8)  # ring of 24 cells
    _extend(cache, 300)  # the ring lost positions below 250 at least
    layer_state = [la.state() for la in cache.layers]
    # after dropping 280 of them the next position is 20, whose window starts at 5: old 5..11 are gone
    assert not cache.shift(12, 280, BE)
    assert cache.offset == 300 and all(np.array_equal(a.pos, b.state().pos) for a, b in zip(layer_state, cache.layers))
    assert cache.shift(2, 10, BE)  # the window of position 290 starts at 275 -> old 285..: held


# -- states -----------------------------------------------------------------------------------------
def test_state_round_trip_and_conversion_between_cache_types() -> None:
    cache = _seq([None, 16], 200, 8)
    _extend(cache, 60, batch=5)
    st = cache.state()
    other = _seq([None, 16], 200, 8)
    other.load_state(st)
    assert other.tokens == cache.tokens
    for a, b in zip(cache.layers, other.layers):
        assert np.array_equal(a.state().pos, b.state().pos)
        assert np.array_equal(a.state().k[0], b.state().k[0])
    q8 = make_sequence_cache(2, 200, H, D, "q8_0", [None, 16], 8)
    q8.load_state(st)
    k = q8.layers[0].k.to_f32(q8.layers[0].state().k)
    assert np.allclose(k, st.layers[0].k[0], atol=0.05)


def test_state_that_does_not_fit_is_refused_and_the_cache_is_unchanged() -> None:
    cache = _seq([None, 16], 200, 8)
    _extend(cache, 30)
    st = cache.state()
    small = _seq([None, 16], 20, 8)
    _extend(small, 5)
    with pytest.raises(LlmedgeError, match="does not fit"):
        small.load_state(st)
    assert small.offset == 5 and small.layers[0].used == 5
    wrong_heads = make_sequence_cache(2, 200, 1, D, "f32", [None, 16], 8)
    with pytest.raises(LlmedgeError, match="does not fit"):
        wrong_heads.load_state(st)


# -- memory -----------------------------------------------------------------------------------------
_MEASURE_KV_RSS = """
import gc, json, sys
from pathlib import Path
import llmedge

def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

m = llmedge.load(sys.argv[1], backend="numpy", n_ctx=32768, kv_type="f16")
info = m.cache_info()
reported = m.cache_bytes
del m.engine.cache
gc.collect()
before = rss()
cache = m.engine.new_cache()
for layer in cache.layers:
    for a in (*layer.k.arrays, *layer.v.arrays):
        a.fill(1)
print(json.dumps({"info": info, "reported": reported, "nbytes": cache.nbytes, "grown": rss() - before}))
"""


def test_gemma3_at_32k_context_holds_at_most_120_mb_of_f16_kv(gemma3_path: Path) -> None:
    """Reported and real: measured in a fresh process, so other tests' heap does not blur the RSS."""
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _MEASURE_KV_RSS, str(gemma3_path)], capture_output=True,
                       text=True, timeout=300, check=True)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    info, reported, grown = out["info"], out["reported"], out["grown"]
    assert info["n_ctx"] == 32768 and info["layers_ring"] > 0 and info["layers_full"] > 0
    assert reported <= 120 * 2**20, reported
    assert out["nbytes"] == reported
    assert 0.9 * reported <= grown <= 120 * 2**20 + 8 * 2**20, (grown, reported)


def test_a_cache_arena_commits_only_the_pages_written() -> None:
    """A cache arena is lazily zeroed memory in small pages: a few scattered writes (each layer's
    positions at creation, a token's K/V rows) commit a few 4 KB pages, not a 2 MB huge page each
    (NumPy asks for huge pages on large arrays: a fresh 4096-cell SmolLM2 cache took 164 ms)."""
    import sys

    from llmedge.kvcache import Arena

    if not sys.platform.startswith("linux"):
        skip_or_fail("/proc/self/smaps is Linux's")
    arena = Arena(64 << 20)
    buf = arena.buffer
    for at in range(0, 64 << 20, 8 << 20):  # 8 writes, 8 MB apart
        buf[at] = 1
    lo_buf, hi_buf = buf.ctypes.data, buf.ctypes.data + buf.nbytes
    rss_kb, seen, inside = 0, False, False
    with open("/proc/self/smaps") as f:  # the resident KB of every mapping over the buffer
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < hi_buf and hi > lo_buf
                seen |= inside
            elif inside and head == "Rss:":
                rss_kb += int(line.split()[1])
    assert seen, "the arena's mapping is not in /proc/self/smaps"
    assert rss_kb <= 8 * 64, f"8 scattered writes committed {rss_kb} KB"
    assert int(buf.sum(dtype=np.int64)) == 8  # zeroed everywhere else


def test_gemma3_ring_gives_the_logits_of_a_full_buffer_past_the_window(gemma3_path: Path) -> None:
    """Gemma 3's sliding-window layers in a ring (640 cells, moved past position 640) against plain
    n_ctx buffers, llama-cpp-python's layout (position p in cell p): the same logits bit for bit, in
    64-row prompt batches and token by token (logits_vs_llamacpp.py: those equal llama.cpp's)."""
    import llmedge
    from llmedge.models.base import Batch

    m = llmedge.load(gemma3_path, backend="native", n_ctx=1024)
    net = m.model
    ids = m.tokenize((TEXTS / "gpl3_30k.txt").read_text(encoding="utf-8"))[:716]
    ring, plain = net.make_cache(1024, "f16", 64), net.make_cache(1024, "f16", 1024)
    assert {la.capacity for la in ring.layers if la.ring} == {640} and not any(la.ring for la in plain.layers)
    pieces = [ids[i : i + 64] for i in range(0, 704, 64)] + [[t] for t in ids[704:]]
    p0 = 0
    for piece in pieces:
        pos = np.arange(p0, p0 + len(piece))
        a, b = (net.forward(Batch(np.array(piece), pos, c)) for c in (ring, plain))
        np.testing.assert_array_equal(a, b, err_msg=f"positions {p0}..")
        p0 += len(piece)
    rings = [la for la in ring.layers if la.ring]
    assert all(la.offset == 716 and la.valid_positions().min() > 0 for la in rings)  # the cells did move
