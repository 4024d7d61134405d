"""Shared fixtures: the two real models, pulled once through llmedge's own store and cached.

The store is the user's default one (or ``$LLMEDGE_MODELS``), so a second run downloads nothing.
A failed pull fails the tests that need the model: nothing here skips.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session", autouse=True)
def _no_user_ollama_store(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the machine's own Ollama store (~/.ollama/models) out of every test's model lists."""
    os.environ["OLLAMA_MODELS"] = str(tmp_path_factory.mktemp("no-ollama-store"))


def _pull(name: str) -> Path:
    from llmedge.store import Store

    return Store().pull(name)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _pull("smollm2:135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _pull("gemma3:270m")


@pytest.fixture(scope="session")
def model_paths(smollm2_path: Path, gemma3_path: Path) -> dict[str, Path]:
    return {"smollm2": smollm2_path, "gemma3": gemma3_path}


def skip_or_fail(reason: str) -> None:
    """A test that cannot run on this platform: a failure, unless ``LLMEDGE_ALLOW_SKIPS=1`` says
    skipping is intended (CI never sets it, so a missing install step cannot hide as a skip)."""
    if os.environ.get("LLMEDGE_ALLOW_SKIPS") == "1":
        pytest.skip(reason)
    pytest.fail(f"{reason} (set LLMEDGE_ALLOW_SKIPS=1 to skip on purpose)")


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _rss_kb() -> tuple[int, int]:
    """(current, peak) resident set size of this process in KiB, from /proc (Linux)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    """With ``LLMEDGE_TEST_MEMORY=FILE``, one line per test: its id, RSS and peak RSS (KiB) after it;
    how the suite's memory budget is checked and a test that raises the peak is found."""
    out = os.environ.get("LLMEDGE_TEST_MEMORY")
    if out and Path("/proc/self/status").exists():
        rss, peak = _rss_kb()
        with open(out, "a", encoding="utf-8") as f:
            f.write(f"{item.nodeid}\t{rss}\t{peak}\n")


@pytest.fixture(scope="module", autouse=True)
def _free_module_caches(request: pytest.FixtureRequest):
    """After each test module: empty its cache of loaded models (a module-level ``_LOADED``), collect
    garbage and hand freed heap back to the OS, so one module's models never add to the next one's
    peak memory (the suite's budget is 4 GB)."""
    yield
    cache = getattr(request.module, "_LOADED", None)
    if hasattr(cache, "clear"):
        cache.clear()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
