"""The ``convert`` command: a Hugging Face safetensors model (a folder or ``hf.co/ORG/REPO``) to GGUF.

The conversion is :mod:`llmedge.quant.convert`'s; this module resolves the source (an ``hf.co/``
name is fetched through huggingface_hub into its cache, the files a conversion reads and nothing
else, with :mod:`llmedge.hf_source`'s listing and downloads) and draws the per-tensor progress.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

# the files a conversion reads from a Hub repo (weights: safetensors only)
_WANTED = re.compile(r"^(config\.json|generation_config\.json|tokenizer\.json|tokenizer\.model|tokenizer_config\.json|"
                     r"added_tokens\.json|special_tokens_map\.json|chat_template\.jinja|chat_template\.json|"
                     r"README\.md|model[^/]*\.safetensors|model\.safetensors\.index\.json)$")


def hub_folder(spelled: str, report: Any) -> tuple[Path, str]:
    """Download what converting ``hf.co/ORG/REPO`` needs into the HF cache; (snapshot folder, repo).

    Files the Hub lists with an LFS sha256 (the weights) are verified against it, as pulls are.
    """
    from llmedge.errors import LlmedgeError
    from llmedge.hf_source import fetch_verified, repo_and_tag, repo_files

    repo, tag = repo_and_tag(spelled)
    revision = tag or "main"
    files, _ = repo_files(repo, revision)
    wanted = sorted(f for f in files if _WANTED.match(f))
    if not any(f.endswith(".safetensors") for f in wanted):
        raise LlmedgeError(f"hf.co/{repo} has no model*.safetensors file (only safetensors checkpoints convert)")
    if "config.json" not in wanted:
        raise LlmedgeError(f"hf.co/{repo} has no config.json")
    folder = None
    for f in wanted:
        path = fetch_verified(repo, f, files.get(f), revision, report)
        if f == "config.json":
            folder = path.parent
    assert folder is not None
    return folder, repo


def convert(
    src: Annotated[str, typer.Argument(help="A Hugging Face model folder, or hf.co/ORG/REPO[:REVISION].")],
    out: Annotated[Path, typer.Option("--outfile", "-o", help="The GGUF file to write (a folder: llama.cpp's file name in it).")],
    outtype: Annotated[
        str, typer.Option("--outtype", help="f32, f16, bf16, q8_0, or auto (bf16 for a bf16 model, else f16).")
    ] = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
) -> None:
    """Convert a Hugging Face safetensors model to GGUF, as llama.cpp's convert_hf_to_gguf.py does."""
    from llmedge.cli.progress import pull_progress
    from llmedge.errors import LlmedgeError
    from llmedge.quant.convert import ConvertError
    from llmedge.quant.convert import convert as run_convert

    name = None
    if src.lower().startswith("hf.co/"):
        with pull_progress() as report:
            folder, name = hub_folder(src, report)
    else:
        folder = Path(src).expanduser()
        if not folder.exists():
            raise LlmedgeError(f"{src}: no such folder")
    try:
        with _progress(quiet) as report:
            r = run_convert(folder, out, outtype.lower(), model_name=name, progress=report)
    except (ConvertError, OSError) as e:
        raise LlmedgeError(str(e)) from None
    typer.echo(f"wrote {r.path} ({r.arch}, {r.n_tensors} tensors, {r.ftype}, {r.nbytes / 1024 / 1024:.2f} MiB)")


class _progress:
    """A rich bar per tensor on a terminal, one line per tensor otherwise (nothing with --quiet)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.prog, self.task = quiet, None, None

    def __enter__(self):  # noqa: ANN204
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.prog = Progress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(),
                                 console=Console(stderr=True))
            self.prog.__enter__()
        return self.report

    def report(self, i: int, n: int, name: str, qtype: Any) -> None:
        if self.quiet:
            return
        if self.prog is None:
            sys.stderr.write(f"[{i + 1:4d}/{n:4d}] {name:<40} -> {getattr(qtype, 'name', qtype)}\n")
            return
        if self.task is None:
            self.task = self.prog.add_task("converting", total=n)
        self.prog.update(self.task, completed=i + 1, description=f"{name} -> {getattr(qtype, 'name', qtype)}")

    def __exit__(self, *exc: object) -> None:
        if self.prog is not None:
            self.prog.__exit__(*exc)
