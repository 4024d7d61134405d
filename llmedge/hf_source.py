"""Pulls from the Hugging Face Hub through huggingface_hub: `hf.co/ORG/REPO[:QUANT|:FILE.gguf]`.

huggingface_hub does the transfer (its cache, `HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE`, `HF_TOKEN`,
`HF_HUB_OFFLINE`, resumable `.incomplete` files); this module chooses the file, checks the sha256
the Hub lists for it (its LFS oid), and links the cached file into llmedge's store (no second copy).

File choice: the repo's `.gguf` files (projector `mmproj` files left out); a tag ending in `.gguf`
names a file (case-insensitive, path or base name); another tag is a quant matched as a whole word
of the file name (`q4_k_m` matches `Model-Q4_K_M.gguf`, not `IQ4_K_M`); no tag takes the first of
`DEFAULT_QUANTS` present, else the repo's only GGUF. A split model (`-00001-of-00003.gguf`) has every
part downloaded and verified, then assembled into one GGUF in llmedge's store (`llmedge.splits`). A missing GGUF chat template is taken from the repo's `chat_template.jinja` or
`tokenizer_config.json` when either exists. Offline, the files of the cached snapshot are listed.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

from .errors import StoreError
from .names import ModelName
from .sources import Progress
from .splits import SPLIT_RE, merge_splits, split_siblings

DEFAULT_QUANTS = ("q4_k_m", "q4_k_s", "q4_0", "q5_k_m", "q5_k_s", "q5_0", "q6_k", "q8_0", "q4_1", "iq4_xs",
                  "iq4_nl", "q3_k_m", "q3_k_l", "q3_k_s", "q2_k", "bf16", "f16", "f32")


def repo_and_tag(spelled: str) -> tuple[str, str | None]:
    """`ORG/REPO` (its case kept) and the tag (None when absent) of `hf.co/ORG/REPO[:TAG]`."""
    rest = spelled.split("/", 1)[1]
    repo, _, tag = rest.partition(":")
    return repo, (tag or None)


def _quant_re(tag: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![a-z0-9]){re.escape(tag.lower())}(?![a-z0-9])")


def choose_file(files: list[str], tag: str | None, repo: str) -> str:
    """The GGUF file of `files` that `tag` selects (see the module docstring)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if not ggufs:
        raise StoreError(f"hf.co/{repo} has no .gguf file")
    if tag and tag.lower().endswith(".gguf"):
        hits = [f for f in ggufs if tag.lower() in (f.lower(), f.rsplit("/", 1)[-1].lower())]
    elif tag and tag.lower() != "latest":
        hits = [f for f in ggufs if _quant_re(tag).search(f.rsplit("/", 1)[-1].lower())]
    else:
        hits = []
        for quant in DEFAULT_QUANTS:
            hits = [f for f in ggufs if _quant_re(quant).search(f.rsplit("/", 1)[-1].lower())]
            if hits:
                break
        hits = hits or (ggufs if len(ggufs) == 1 else [])
    if not hits:
        shown = ", ".join(f.rsplit("/", 1)[-1] for f in ggufs[:12])
        want = f"'{tag}'" if tag else f"a default quant ({', '.join(DEFAULT_QUANTS[:4])}, ...)"
        raise StoreError(f"hf.co/{repo} has no GGUF file for {want}; it has: {shown}")
    firsts = [f for f in hits if (m := SPLIT_RE.search(f)) is None or m.group(1) == "00001"] or hits
    return sorted(firsts, key=lambda f: (len(f), f))[0]


def repo_files(repo: str, revision: str) -> tuple[dict[str, str | None], bool]:
    """{path: sha256 or None} of the repo's files, and whether they come from the offline cache."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub import constants as hf_constants

    if not hf_constants.HF_HUB_OFFLINE:
        unreachable = _unreachable(hf_constants.ENDPOINT)
        if unreachable:
            raise StoreError(f"hf.co/{repo}: cannot reach {hf_constants.ENDPOINT} ({unreachable}); "
                             "set HF_HUB_OFFLINE=1 to use the Hugging Face cache") from None
        try:
            entries = HfApi().list_repo_tree(repo, revision=revision, recursive=True)
            out: dict[str, str | None] = {}
            for e in entries:
                lfs = getattr(e, "lfs", None)
                if hasattr(e, "size"):
                    out[e.path] = getattr(lfs, "sha256", None) if lfs is not None else None
            return out, False
        except Exception as e:  # noqa: BLE001 - huggingface_hub's errors become one line
            raise StoreError(f"hf.co/{repo}: {_hf_reason(e)}") from None
    try:
        folder = Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except Exception:  # noqa: BLE001
        raise StoreError(f"hf.co/{repo} is not in the Hugging Face cache and HF_HUB_OFFLINE is set") from None
    return {p.relative_to(folder).as_posix(): None for p in folder.rglob("*") if p.is_file()}, True


def _unreachable(endpoint: str) -> str | None:
    """Why the Hub at `endpoint` cannot be reached at all (connection refused, no such host, no
    route), else None. huggingface_hub retries such errors for ~24 s with a warning line per try,
    which only delays the one line an offline user needs; timeouts and HTTP errors are left to it."""
    import errno
    import socket
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=10).close()
    except urllib.error.URLError as e:
        reason = e.reason  # a string for an HTTP error: the Hub answered
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, socket.gaierror):
            return "no such host"
        if isinstance(reason, OSError) and reason.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "no route to host"
    except (OSError, ValueError):
        pass
    return None


def _hf_reason(e: BaseException) -> str:
    from huggingface_hub import utils as hf_utils

    known = ((getattr(hf_utils, "GatedRepoError", ()), "the repository is gated: accept its terms on the Hub and "
              "set HF_TOKEN"),
             (getattr(hf_utils, "RepositoryNotFoundError", ()), "no such repository on the Hub (a private one "
              "needs HF_TOKEN)"),
             (getattr(hf_utils, "RevisionNotFoundError", ()), "no such revision"))
    for cls, says in known:  # their own text is three sentences and a URL
        if isinstance(e, cls):
            return says
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def _progress_class(report: Progress, digest: str | None, label: str) -> type | None:
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bar(hf_tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            self._total = kwargs.get("total")

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            report(label, digest=digest, total=self._total, completed=self._done)
            return super().update(n)

    return Bar


def _download(repo: str, filename: str, revision: str, report: Progress | None = None,
              digest: str | None = None, label: str = "") -> Path:
    from huggingface_hub import hf_hub_download

    kwargs: dict[str, Any] = {"revision": revision}
    if report is not None and "tqdm_class" in inspect.signature(hf_hub_download).parameters:
        kwargs["tqdm_class"] = _progress_class(report, digest, label)
    try:
        return Path(hf_hub_download(repo, filename, **kwargs))
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors become one line
        raise StoreError(f"hf.co/{repo}: cannot download {filename}: {_hf_reason(e)}") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _repo_template(repo: str, files: dict[str, str | None], revision: str) -> str | None:
    """A chat template from the repo's chat_template.jinja or tokenizer_config.json, if any."""
    if "chat_template.jinja" in files:
        return _download(repo, "chat_template.jinja", revision).read_text(encoding="utf-8")
    if "tokenizer_config.json" in files:
        try:
            data = json.loads(_download(repo, "tokenizer_config.json", revision).read_text(encoding="utf-8"))
        except ValueError:
            return None
        tmpl = data.get("chat_template") if isinstance(data, dict) else None
        return tmpl if isinstance(tmpl, str) and tmpl.strip() else None
    return None


def _gguf_has_template(path: Path) -> bool:
    from .gguf import GGUFFile

    try:
        t = GGUFFile(path).metadata.get("tokenizer.chat_template")
    except Exception:  # noqa: BLE001 - a broken file fails later, with the loader's message
        return True
    return isinstance(t, str) and bool(t.strip())


def pull_hf(store: Any, spelled: str, name: ModelName, report: Progress) -> Path:
    """Pull `hf.co/ORG/REPO[:TAG]` into `store`: download into the HF cache, verify, link, register."""
    repo, tag = repo_and_tag(spelled)
    revision = "main"
    report("pulling manifest")
    files, offline = repo_files(repo, revision)
    filename = choose_file(list(files), tag, repo)
    parts = split_siblings(filename, list(files)) or [filename]
    paths = [fetch_verified(repo, f, files.get(f), revision, report) for f in parts]
    config: dict[str, Any] = {}
    if not _gguf_has_template(paths[0]):
        tmpl = _repo_template(repo, files, revision)
        if tmpl:
            config["template"] = tmpl
    report("writing manifest")
    store._ensure_dirs()
    source = {"type": "huggingface", "repo": repo, "file": filename, "revision": revision, "offline": offline}
    if "snapshots" in paths[0].parts[:-1]:  # <cache>/models--ORG--REPO/snapshots/<commit>/<file>
        source["commit"] = paths[0].parts[paths[0].parts.index("snapshots") + 1]
    if len(paths) == 1:
        got = _sha256(paths[0])
        blob = store.blobs.link(f"sha256:{got}", paths[0])
        source["cache_path"] = str(paths[0].resolve())
    else:
        blob, got = _assembled(store, name, parts, paths)
        source["parts"] = parts
    store.register(name.full, f"sha256:{got}", blob.stat().st_size, source, config)
    report("success")
    return blob


def fetch_verified(repo: str, filename: str, expected: str | None, revision: str, report: Progress) -> Path:
    """``filename`` of ``repo`` into the HF cache, its sha256 checked against ``expected`` (the Hub's
    LFS digest) when there is one; its path in the cache."""
    label = f"pulling {expected[:12]}" if expected else f"pulling {filename.rsplit('/', 1)[-1]}"
    digest = f"sha256:{expected}" if expected else None
    path = _download(repo, filename, revision, report, digest, label)
    size = path.stat().st_size
    report(label, digest=digest, total=size, completed=size)
    report("verifying sha256 digest")
    if expected:
        got = _sha256(path)
        if got != expected:
            raise StoreError(f"hf.co/{repo}/{filename}: sha256 mismatch, the Hub lists {expected}, got {got}")
    return path


def _assembled(store: Any, name: ModelName, parts: list[str], paths: list[Path]) -> tuple[Path, str]:
    """The one-file GGUF of a split model, in llmedge's blobs (reused when this name already has it)."""
    try:
        old = store.manifest(name.full)
        blob = store.blob_path(old["model"]["digest"])
        if old.get("source", {}).get("parts") == parts and blob.is_file():
            return blob, old["model"]["digest"].split(":")[1]
    except StoreError:
        pass
    tmp = store._temp_blob()
    try:
        merge_splits(paths, tmp)
        with open(tmp, "rb") as f:  # durable before the rename makes it the blob
            os.fsync(f.fileno())
        got = _sha256(tmp)
        blob = store.blob_path(f"sha256:{got}")
        tmp.replace(blob)
    finally:
        tmp.unlink(missing_ok=True)
    return blob, got
