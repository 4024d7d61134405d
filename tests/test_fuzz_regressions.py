"""The fuzz targets (fuzz/) replayed without atheris: every committed seed and every input that once
crashed a target (fuzz/regressions/<target>/) must pass the target's checks. This keeps the targets
importable and every fixed crash fixed; fuzz/run.sh does the coverage-guided runs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parent.parent / "fuzz"
TARGETS = ["gguf", "tokenizer", "template", "grammar", "requests"]


def target(name: str):  # noqa: ANN201
    if str(FUZZ) not in sys.path:
        sys.path.insert(0, str(FUZZ))
    return importlib.import_module(f"fuzz_{name}")


@pytest.mark.parametrize("name", TARGETS)
def test_seeds_and_regressions_pass_the_target(name: str, request: pytest.FixtureRequest) -> None:
    mod = target(name)
    if name == "tokenizer":  # the real vocabularies, from the session's models
        mod.tokenizers([request.getfixturevalue("smollm2_path"), request.getfixturevalue("gemma3_path")])
    from harness import regression_inputs

    inputs = mod.seeds() + regression_inputs(name)
    assert inputs
    for data in inputs:
        mod.test_one_input(data)


def test_every_regression_names_a_known_target() -> None:
    for d in (FUZZ / "regressions").iterdir():
        assert d.is_dir() and d.name in TARGETS, d
        assert any(d.iterdir()), d
