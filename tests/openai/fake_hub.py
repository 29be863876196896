"""A small local stand-in for the Hugging Face hub's file API, enough for a
client that lists a repository and downloads its files:

- `GET /api/models/{repo}/revision/{rev}?blobs=true`: `{"sha", "siblings":
  [{"rfilename", "size", "blobId", "lfs": {"sha256", "size"}}]}`;
- `GET /{repo}/resolve/{rev}/{file}`: the bytes, with `Range: bytes=N-`
  answered 206 + `Content-Range`, `X-Repo-Commit`, `ETag` /
  `X-Linked-Etag` as the hub sends them;
- refusals as the hub makes them: `X-Error-Code: RepoNotFound` (401 without
  a token), `GatedRepo` (401 without a token, 403 with a wrong one),
  `RevisionNotFound` (404), `EntryNotFound` (404).

Blob ids are computed here from the bytes (git's blob sha1 and sha256), as
the hub computes them, so a client's hash check is checked for real.
Tests can stall or cut a file's transfer after some bytes, and read the log
of requests (path and Range) the server saw.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    lfs: set[str]
    revisions: dict[str, str] = field(default_factory=dict)  # name -> commit
    token: str | None = None  # gated: this bearer token is needed

    def __post_init__(self):
        h = hashlib.sha1()
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        self.sha = h.hexdigest()
        self.revisions.setdefault("main", self.sha)

    def sibling(self, name: str) -> dict:
        data = self.files[name]
        s = {"rfilename": name, "size": len(data), "blobId": git_blob_sha1(data)}
        if name in self.lfs:
            # An LFS file's blobId is its pointer's; the content hash is lfs.sha256.
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n"
            s["blobId"] = git_blob_sha1(pointer.encode())
            s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": len(pointer)}
        return s

    def etag(self, name: str) -> str:
        data = self.files[name]
        return hashlib.sha256(data).hexdigest() if name in self.lfs else git_blob_sha1(data)


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str | None, str | None]] = []  # (path, range, authorization)
        self.stall: dict[str, tuple[int, threading.Event]] = {}  # file -> (after bytes, release)
        self.cut: dict[str, int] = {}  # file -> close the connection after this many bytes (once)
        self.reported_size: dict[str, int] = {}  # file -> size the listing claims instead
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                hub._get(self)

            def do_HEAD(self):
                hub._get(self, head=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        for _, ev in self.stall.values():
            ev.set()
        self.server.shutdown()
        self.server.server_close()

    def file_requests(self, name: str) -> list[str | None]:
        """The Range header of every download request of `name`."""
        with self.lock:
            return [r for p, r, _ in self.requests if "/resolve/" in p and p.endswith("/" + name)]

    # -- request handling ----------------------------------------------------

    def _refuse(self, h, status: int, code: str, message: str):
        body = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _json(self, h, obj):
        body = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _authorized(self, h, repo: Repo) -> bool:
        if repo.token is None:
            return True
        auth = h.headers.get("Authorization")
        if auth is None:
            self._refuse(h, 401, "GatedRepo", "Access to this model is restricted. You must be authenticated.")
            return False
        if auth != f"Bearer {repo.token}":
            self._refuse(h, 403, "GatedRepo", "Access to this model is restricted and you are not in the authorized list.")
            return False
        return True

    def _find(self, parts: list[str]):
        """(repo id, rest) for the longest registered repo id at the start of parts."""
        for n in (2, 1):
            rid = "/".join(parts[:n])
            if rid in self.repos:
                return rid, parts[n:]
        return "/".join(parts[:2]), None

    def _get(self, h, head: bool = False):
        url = urlsplit(h.path)
        path = unquote(url.path)
        with self.lock:
            self.requests.append((path, h.headers.get("Range"), h.headers.get("Authorization")))
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"]:
            rid, rest = self._find(parts[2:])
            if rest is None:
                return self._refuse(h, 401, "RepoNotFound", "Repository not found")
            repo = self.repos[rid]
            if not self._authorized(h, repo):
                return
            rev = unquote(rest[1]) if len(rest) >= 2 and rest[0] == "revision" else "main"
            if rev not in repo.revisions and rev != repo.sha:
                return self._refuse(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            siblings = [repo.sibling(n) for n in sorted(repo.files)]
            for s in siblings:
                if s["rfilename"] in self.reported_size:
                    s["size"] = self.reported_size[s["rfilename"]]
                    if "lfs" in s:
                        s["lfs"]["size"] = s["size"]
            return self._json(h, {"id": rid, "modelId": rid, "sha": repo.sha, "siblings": siblings})
        rid, rest = self._find(parts)
        if rest is None or len(rest) < 3 or rest[0] != "resolve":
            return self._refuse(h, 401, "RepoNotFound", "Repository not found")
        repo = self.repos[rid]
        if not self._authorized(h, repo):
            return
        rev, name = rest[1], "/".join(rest[2:])
        if rev not in repo.revisions and rev != repo.sha:
            return self._refuse(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if name not in repo.files:
            return self._refuse(h, 404, "EntryNotFound", f"{name} does not exist")
        self._send_file(h, repo, name, head)

    def _send_file(self, h, repo: Repo, name: str, head: bool):
        data = repo.files[name]
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first = rng[len("bytes="):].split("-")[0]
            start = int(first) if first else 0
        if start >= len(data) and rng:
            h.send_response(416)
            h.send_header("Content-Range", f"bytes */{len(data)}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        body = data[start:]
        h.send_response(206 if rng else 200)
        h.send_header("X-Repo-Commit", repo.sha)
        h.send_header("ETag", f'"{repo.etag(name)}"')
        if name in repo.lfs:
            h.send_header("X-Linked-Etag", f'"{repo.etag(name)}"')
            h.send_header("X-Linked-Size", str(len(data)))
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Content-Type", "application/octet-stream")
        h.end_headers()
        if head:
            return
        with self.lock:
            cut = self.cut.pop(name, None)
            stall = self.stall.get(name)
        sent = 0
        step = 64 << 10
        while sent < len(body):
            if cut is not None and start + sent >= cut:
                h.close_connection = True
                h.connection.shutdown(2)
                return
            if stall is not None and start + sent >= stall[0]:
                h.wfile.flush()
                stall[1].wait()
                stall = None
            end = min(len(body), sent + step)
            if cut is not None:
                end = min(end, max(cut - start, sent + 1))
            if stall is not None:
                end = min(end, max(stall[0] - start, sent + 1))
            try:
                h.wfile.write(body[sent:end])
            except (BrokenPipeError, ConnectionResetError):
                return
            sent = end
