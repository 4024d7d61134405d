"""The prefetch hint of the weight streams (native backend): the policy (``keep_weights_cached``), the
flag it sets in C as weights come and go, ``LLMEDGE_WEIGHT_PREFETCH``, and that the hint changes
no value; likewise the decode products' prefetch of the next layer's K/V cells (``kv_prefetch_wanted``,
``LLMEDGE_KV_PREFETCH``)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from llmedge.backends import native_status
from llmedge.errors import LlmedgeError

if not native_status()[0]:  # pragma: no cover - the suite installs the native build
    pytest.fail(native_status()[1])

from llmedge.backends import native  # noqa: E402

AMD, INTEL = 1 << 13, 1 << 12  # LLE_CPU_AMD, LLE_CPU_INTEL (native/common.h)
MB = 1 << 20


def fake_cpu(monkeypatch: pytest.MonkeyPatch, features: int, llc: int, sysfs: int | None = None) -> None:
    """A CPU with ``features`` whose C library reports ``llc`` bytes of last-level cache, and sysfs
    ``sysfs`` (None: no sysfs entry)."""
    monkeypatch.setattr(native, "lib", SimpleNamespace(lle_cpu_features=lambda: features, lle_llc_bytes=lambda: llc))
    monkeypatch.setattr(native, "shared_cache_bytes", lambda: sysfs)


def fake_sysfs_caches(root: Path, caches: list[tuple[int, str, str]]) -> Path:
    """cpu0/cache as Linux lays it out: one index<i> directory per (level, type, size)."""
    for i, (level, kind, size) in enumerate(caches):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return root


def test_the_shared_cache_is_the_highest_level_data_or_unified_cache_in_sysfs(tmp_path, monkeypatch) -> None:
    from llmedge.backends import cpu

    zen5 = [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")]
    monkeypatch.setattr(cpu, "SYSFS_CPU0_CACHES", fake_sysfs_caches(tmp_path / "zen5", zen5))
    cpu.shared_cache_bytes.cache_clear()
    try:
        assert cpu.shared_cache_bytes() == 32 * MB
        # no L3, and an instruction cache bigger than the rest, which is not the one data streams through
        odd = [(1, "Data", "64K"), (2, "Instruction", "8M"), (2, "Unified", "4M")]
        monkeypatch.setattr(cpu, "SYSFS_CPU0_CACHES", fake_sysfs_caches(tmp_path / "odd", odd))
        cpu.shared_cache_bytes.cache_clear()
        assert cpu.shared_cache_bytes() == 4 * MB
        monkeypatch.setattr(cpu, "SYSFS_CPU0_CACHES", tmp_path / "absent")
        cpu.shared_cache_bytes.cache_clear()
        assert cpu.shared_cache_bytes() is None
        garbled = [(3, "Unified", "lots")]
        monkeypatch.setattr(cpu, "SYSFS_CPU0_CACHES", fake_sysfs_caches(tmp_path / "garbled", garbled))
        cpu.shared_cache_bytes.cache_clear()
        assert cpu.shared_cache_bytes() is None
    finally:
        cpu.shared_cache_bytes.cache_clear()


def test_sysfs_decides_over_the_c_library_which_may_report_the_whole_package(monkeypatch) -> None:
    """glibc reported 384 MiB of L3 on a Zen 5 VM whose cores share 32 MiB: SmolLM2's 96 MB of
    weights must stream there, as on any AMD CPU whose L3 they exceed."""
    monkeypatch.delenv(native.WEIGHT_PREFETCH_ENV, raising=False)
    fake_cpu(monkeypatch, AMD, 384 * MB, sysfs=32 * MB)
    assert native.last_level_cache_bytes() == 32 * MB
    assert not native.keep_weights_cached(96 * MB)
    fake_cpu(monkeypatch, AMD, 384 * MB, sysfs=None)  # no sysfs: the C library's figure
    assert native.last_level_cache_bytes() == 384 * MB
    assert native.keep_weights_cached(96 * MB)


def test_amd_keeps_weights_that_fit_half_the_last_level_cache_and_streams_the_rest(monkeypatch) -> None:
    monkeypatch.delenv(native.WEIGHT_PREFETCH_ENV, raising=False)
    fake_cpu(monkeypatch, AMD, 32 * MB)
    assert native.keep_weights_cached(16 * MB)
    assert not native.keep_weights_cached(16 * MB + 1)
    assert not native.keep_weights_cached(100 * MB)
    fake_cpu(monkeypatch, AMD, 0)  # cache size unknown: stream
    assert not native.keep_weights_cached(1 * MB)


def test_other_cpus_keep_weights_whatever_their_size(monkeypatch) -> None:
    monkeypatch.delenv(native.WEIGHT_PREFETCH_ENV, raising=False)
    for features in (INTEL, 0):
        fake_cpu(monkeypatch, features, 32 * MB)
        assert native.keep_weights_cached(400 * MB)


def test_the_environment_forces_either_hint_and_rejects_other_values(monkeypatch) -> None:
    fake_cpu(monkeypatch, AMD, 32 * MB)
    monkeypatch.setenv(native.WEIGHT_PREFETCH_ENV, "keep")
    assert native.keep_weights_cached(400 * MB)
    monkeypatch.setenv(native.WEIGHT_PREFETCH_ENV, "Stream")
    assert not native.keep_weights_cached(1 * MB)
    monkeypatch.setenv(native.WEIGHT_PREFETCH_ENV, "auto")
    assert native.keep_weights_cached(1 * MB) and not native.keep_weights_cached(400 * MB)
    monkeypatch.setenv(native.WEIGHT_PREFETCH_ENV, "t0")
    with pytest.raises(LlmedgeError, match="LLMEDGE_WEIGHT_PREFETCH=t0 is not a prefetch mode"):
        native.keep_weights_cached(1 * MB)


def test_a_bad_mode_fails_the_command_with_one_line(smollm2_path: Path) -> None:
    env = dict(os.environ, LLMEDGE_WEIGHT_PREFETCH="fast", LLMEDGE_BACKEND="native")
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "show", str(smollm2_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "LLMEDGE_WEIGHT_PREFETCH=fast" in lines[0], r.stderr


def test_loading_and_freeing_a_model_accounts_its_weights_and_sets_the_c_flag(smollm2_path: Path, monkeypatch) -> None:
    import llmedge

    monkeypatch.delenv(native.WEIGHT_PREFETCH_ENV, raising=False)
    gc.collect()
    before = native._live_weight_bytes
    m = llmedge.load(str(smollm2_path), backend="native")
    file_bytes = sum(int(t.n_bytes) for t in m.gguf.tensors.values() if len(t.dims) == 2)
    assert native._live_weight_bytes - before == file_bytes
    want = "keep" if native.keep_weights_cached(native._live_weight_bytes) else "stream"
    assert native.weight_prefetch() == want
    del m
    gc.collect()
    assert native._live_weight_bytes == before


def test_the_hint_changes_no_product(smollm2_path: Path) -> None:
    """Both hints run the same kernels: the same bits for one row (decode) and four (batched rows)."""
    import llmedge

    m = llmedge.load(str(smollm2_path), backend="native")
    be, layer = m.model.backend, m.model.layers[3]
    x = np.random.default_rng(0).standard_normal((4, layer["ffn_up"].k)).astype(np.float32)
    was = native.lib.lle_weight_prefetch()
    try:
        got = []
        for keep in (0, 1):
            native.lib.lle_set_weight_prefetch(keep)
            assert native.weight_prefetch() == ("keep" if keep else "stream")
            got.append((be.matmul(x[:1], layer["ffn_up"]), be.matmul_rows(x, layer["ffn_up"]),
                        be.matmul(x[:1], m.model.output)))
    finally:
        native.lib.lle_set_weight_prefetch(was)
    for a, b in zip(*got):
        assert np.array_equal(a, b)


def fake_family(monkeypatch: pytest.MonkeyPatch, features: int, family: int) -> None:
    monkeypatch.setattr(native, "lib", SimpleNamespace(lle_cpu_features=lambda: features, lle_cpu_family=lambda: family))


def test_kv_prefetch_is_off_by_default_only_on_amd_zen5_and_later(monkeypatch) -> None:
    monkeypatch.delenv(native.KV_PREFETCH_ENV, raising=False)
    for features, family, want in ((AMD, 0x19, True), (AMD, 0x1A, False), (AMD, 0x1B, False),
                                   (INTEL, 0x1A, True), (INTEL, 6, True), (0, 0, True)):
        fake_family(monkeypatch, features, family)
        assert native.kv_prefetch_wanted() is want, (features, family)


def test_the_environment_forces_the_kv_prefetch_and_rejects_other_values(monkeypatch) -> None:
    fake_family(monkeypatch, AMD, 0x1A)
    monkeypatch.setenv(native.KV_PREFETCH_ENV, "ON")
    assert native.kv_prefetch_wanted()
    fake_family(monkeypatch, INTEL, 6)
    monkeypatch.setenv(native.KV_PREFETCH_ENV, "off")
    assert not native.kv_prefetch_wanted()
    monkeypatch.setenv(native.KV_PREFETCH_ENV, "yes")
    with pytest.raises(LlmedgeError, match="LLMEDGE_KV_PREFETCH=yes is not a K/V prefetch mode"):
        native.kv_prefetch_wanted()


def test_a_backend_sets_the_kv_prefetch_flag_in_c(monkeypatch) -> None:
    was = native.lib.lle_kv_prefetch()
    try:
        for mode, want in (("on", 1), ("off", 0)):
            monkeypatch.setenv(native.KV_PREFETCH_ENV, mode)
            native.NativeBackend(native.lib.lle_n_threads())  # the pool keeps its size
            assert native.lib.lle_kv_prefetch() == want
    finally:
        native.lib.lle_set_kv_prefetch(was)


def test_the_kv_prefetch_changes_no_logit(smollm2_path: Path) -> None:
    """Prefetches are hints: 4 sequences decoded in one step, and one alone, give the same bits either way."""
    import llmedge
    from llmedge.models.base import Batch

    m = llmedge.load(str(smollm2_path), backend="native", n_ctx=128)
    eng = m.engine
    was = native.lib.lle_kv_prefetch()
    got = []
    try:
        for on in (1, 0):
            native.lib.lle_set_kv_prefetch(on)
            caches = [eng.new_cache() for _ in range(4)]
            for i, c in enumerate(caches):
                eng.forward(c, [1, 2, 3 + i, 4, 5 + i])
            steps = []
            for k in range(3):
                batches = [Batch(np.array([7 + i + k]), np.array([c.offset]), c, np.array([0]), row_exact=True)
                           for i, c in enumerate(caches)]
                steps.append(np.concatenate(eng._forward_batches(batches)))
                for i, c in enumerate(caches):
                    c.tokens.append(7 + i + k)
            steps.append(eng.forward(caches[0], [9]))
            got.append(steps)
    finally:
        native.lib.lle_set_kv_prefetch(was)
    for a, b in zip(*got):
        assert np.array_equal(a, b)
