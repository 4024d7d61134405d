"""What the CPU offers: the instruction-set features the kernels care about, how many physical
cores there are (the default thread count: hyper-threads share one core's SIMD units, so llama.cpp
and llmedge use one thread per physical core), and the last-level cache a core shares.

Everything here is read from the operating system (``/proc/cpuinfo``, ``/sys``, ``sysctl``) and is
cheap; the native library's own CPUID probe (``llmedge._native``) is what picks the kernels.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

# flags reported by /proc/cpuinfo (x86 "flags", ARM "Features") that matter to the kernels
_X86_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
              "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8")
_ARM_FLAGS = ("asimd", "asimddp", "i8mm", "sve", "sve2", "bf16", "fphp", "asimdhp")


def _usable_cpus() -> int:
    """CPUs this process may run on (honours affinity masks and cgroup-limited containers)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, n)


def _linux_physical_cores() -> int | None:
    """Distinct (package, core) pairs among the CPUs this process may use."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    for cpu in allowed:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = (topo / "core_id").read_text().strip()
            pkg = (topo / "physical_package_id").read_text().strip()
        except OSError:
            return None
        cores.add((pkg, core))
    return len(cores) or None


SYSFS_CPU0_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@functools.lru_cache(maxsize=1)
def shared_cache_bytes() -> int | None:
    """Bytes of the last-level cache that CPU 0 shares with its neighbours: Linux's sysfs size of its
    highest-level data or unified cache (``index*/size``, e.g. ``32768K``), or None where there is no
    such entry (other systems; the native library then asks the C library, ``lle_llc_bytes``).

    sysfs describes the cache a core can use. The C library need not: glibc's
    ``sysconf(_SC_LEVEL3_CACHE_SIZE)`` gave 384 MiB on a 2-core AMD EPYC (Zen 5) VM, the L3 of the whole
    12-CCD package, where each core shares one CCD's 32 MiB (sysfs's ``32768K``)."""
    best: tuple[int, int] | None = None  # (level, bytes)
    try:
        entries = sorted(SYSFS_CPU0_CACHES.glob("index*"))
    except OSError:
        return None
    for entry in entries:
        try:
            kind = (entry / "type").read_text().strip()
            level = int((entry / "level").read_text().strip())
            size = (entry / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        digits = size.rstrip("KMG")
        unit = size[len(digits):]
        if kind == "Instruction" or not digits.isdigit() or unit not in _SIZE_UNITS:
            continue
        if best is None or level > best[0]:
            best = (level, int(digits) * _SIZE_UNITS[unit])
    return best[1] if best and best[1] > 0 else None


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@functools.lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical cores available to this process (at least 1)."""
    n: int | None = None
    if sys.platform.startswith("linux"):
        n = _linux_physical_cores()
    elif sys.platform == "darwin":
        # performance cores on Apple Silicon, else all physical cores
        for key in ("hw.perflevel0.physicalcpu", "hw.physicalcpu"):
            v = _sysctl(key)
            if v and v.isdigit():
                n = int(v)
                break
    return max(1, min(n or _usable_cpus(), _usable_cpus()))


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The kernel-relevant ISA flags of this CPU, lower-case (e.g. ``{"avx2", "fma", "f16c"}``)."""
    machine = platform.machine().lower()
    flags: set[str] = set()
    if sys.platform.startswith("linux"):
        try:
            text = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            text = ""
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("flags", "features"):
                flags.update(value.split())
                break
    elif sys.platform == "darwin" and machine == "arm64":
        flags.update(("asimd", "asimddp"))
        if _sysctl("hw.optional.arm.FEAT_I8MM") == "1":
            flags.add("i8mm")
    wanted = _ARM_FLAGS if machine in ("aarch64", "arm64") else _X86_FLAGS
    return frozenset(f for f in wanted if f in flags)


def describe() -> str:
    """One line for ``llmedge show`` / bench headers, e.g. ``x86_64, 2 physical cores, avx2 fma f16c``."""
    return f"{platform.machine()}, {physical_cores()} physical cores, {' '.join(sorted(cpu_flags())) or 'no SIMD flags'}"
