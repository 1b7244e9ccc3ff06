"""Downloads go through pooch: a small HTTP server on 127.0.0.1 serves the files, `sources.fetch` gets them with
`pooch.retrieve` and pooch's HTTP downloader into a temp cache, checks them against their known hash, and refuses a
changed file in one line. No test here leaves the machine."""

from __future__ import annotations

import hashlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pooch
import pytest

from highway_repro.data import sources

REL = "ptb/ptb.valid.txt"
GOOD = b" the valid split \n of a tiny treebank \n"


@pytest.fixture
def server(monkeypatch, tmp_path):
    """A local HTTP server: `files` maps a URL path to the bytes it serves (404 otherwise); `requests` lists the
    (path, User-Agent) of each GET. No mirror, downloads on, and no proxy for 127.0.0.1."""
    files, requests = {}, []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append((self.path, self.headers.get("User-Agent")))
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    for var in ("HIGHWAY_DATA_MIRROR", "HIGHWAY_DATA_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(var, "127.0.0.1")
    monkeypatch.setattr(sources, "FILES", dict(sources.FILES))
    yield f"http://127.0.0.1:{httpd.server_address[1]}", files, requests
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture
def pooch_calls(monkeypatch):
    """Records every `pooch.retrieve` call (url, known_hash) and every run of pooch's HTTP downloader (url)."""
    calls = {"retrieve": [], "http": []}
    retrieve, http = pooch.retrieve, pooch.HTTPDownloader.__call__

    def spy_retrieve(url, known_hash, *args, **kwargs):
        calls["retrieve"].append((url, known_hash))
        return retrieve(url, known_hash, *args, **kwargs)

    def spy_http(self, url, output_file, pooch_, check_only=False):
        calls["http"].append(url)
        return http(self, url, output_file, pooch_, check_only)

    monkeypatch.setattr(pooch, "retrieve", spy_retrieve)
    monkeypatch.setattr(pooch.HTTPDownloader, "__call__", spy_http)
    return calls


def serve(server, body: bytes, rel: str = REL, **fields) -> str:
    """Serve `body` as `rel`, committed with the sha256 of GOOD (or as `fields` say); returns its URL."""
    base, files, _ = server
    files["/" + rel] = body
    url = f"{base}/{rel}"
    sources.FILES[rel] = sources.Source(rel, (url,), **{"sha256": hashlib.sha256(GOOD).hexdigest(), **fields})
    return url


def test_pooch_downloads_a_file_with_its_committed_hash(server, pooch_calls, tmp_path):
    url = serve(server, GOOD)
    path = sources.fetch(REL, tmp_path)
    assert path == tmp_path / REL and path.read_bytes() == GOOD
    assert pooch_calls == {"retrieve": [(url, f"sha256:{hashlib.sha256(GOOD).hexdigest()}")], "http": [url]}
    assert server[2] == [("/" + REL, "highway-repro")]
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp file, no record (committed)
    assert sources.fetch(REL, tmp_path) == path and len(server[2]) == 1  # the verified cache copy: not fetched again


def test_a_changed_file_is_refused_in_one_line_and_left_nowhere(server, pooch_calls, tmp_path):
    changed = GOOD.replace(b"tiny", b"tidy")
    url = serve(server, changed)
    with pytest.raises(sources.ChecksumError) as e:
        sources.fetch(REL, tmp_path)
    assert str(e.value) == (
        f"checksum mismatch for {REL} (just fetched) at {tmp_path / REL}: sha256 expected "
        f"{hashlib.sha256(GOOD).hexdigest()} (committed in highway_repro/data/SHA256SUMS), got "
        f"{hashlib.sha256(changed).hexdigest()}; the file is corrupt or another version: the download from {url} is "
        f"broken; try again later")
    assert pooch_calls["http"] == [url] and not [p for p in tmp_path.rglob("*") if p.is_file()]  # pooch's temp and ours


def test_a_published_md5_is_pooch_known_hash(server, pooch_calls, tmp_path):
    md5 = hashlib.md5(GOOD).hexdigest()
    url = serve(server, GOOD + b"x", sha256=None, check=("md5", md5))
    with pytest.raises(sources.ChecksumError, match=f"md5 expected {md5}, got {hashlib.md5(GOOD + b'x').hexdigest()}"):
        sources.fetch(REL, tmp_path)
    assert pooch_calls["retrieve"] == [(url, f"md5:{md5}")]


def test_each_url_in_turn_and_a_file_without_checksum_is_recorded(server, pooch_calls, tmp_path, monkeypatch):
    """A 404 on the first URL, the second one served: a file with no published or committed checksum is trusted once,
    its sha256 recorded beside it, and a later change is refused by that record."""
    rel = "enwik8/enwik8.zip"
    base, files, requests = server
    monkeypatch.setitem(sources.ARCHIVES, rel, sources.Archive(rel, (f"{base}/missing.zip", f"{base}/{rel}")))
    files["/" + rel] = GOOD
    path = sources.fetch(rel, tmp_path)
    record = path.with_name("enwik8.zip.sha256")
    assert path.read_bytes() == GOOD and record.read_text() == f"{hashlib.sha256(GOOD).hexdigest()}  enwik8.zip\n"
    assert [r for r, _ in requests] == ["/missing.zip", "/" + rel] and len(pooch_calls["retrieve"]) == 2
    path.write_bytes(b"changed")
    with pytest.raises(sources.ChecksumError, match=f"recorded in {record}.*delete {path} and run again"):
        sources.fetch(rel, tmp_path)
    assert len(requests) == 2  # refused, not fetched again


def test_the_mirror_and_offline_make_no_request_and_need_no_pooch(server, pooch_calls, tmp_path, monkeypatch):
    """A copy in the mirror is used as it is, and HIGHWAY_DATA_OFFLINE=1 stops before pooch: a machine that reads
    only the mirror needs neither the network nor pooch (here `import pooch` fails)."""
    serve(server, GOOD)
    (tmp_path / "mirror" / "ptb").mkdir(parents=True)
    (tmp_path / "mirror" / REL).write_bytes(GOOD)
    monkeypatch.setitem(sys.modules, "pooch", None)
    monkeypatch.setenv("HIGHWAY_DATA_MIRROR", str(tmp_path / "mirror"))
    assert sources.fetch(REL, tmp_path / "cache") == tmp_path / "mirror" / REL
    monkeypatch.delenv("HIGHWAY_DATA_MIRROR")
    monkeypatch.setenv("HIGHWAY_DATA_OFFLINE", "1")
    with pytest.raises(sources.DataNotFoundError, match="HIGHWAY_DATA_OFFLINE=1"):
        sources.fetch(REL, tmp_path / "cache")
    assert server[2] == [] and pooch_calls == {"retrieve": [], "http": []}
