"""`--model ORG/NAME` downloads from the Hugging Face hub, tested without
the internet: a local stand-in for the hub's file API (fake_hub.py, with
HF_ENDPOINT pointed at it) serves a tiny Qwen3 (the dense reference fixture's
config and safetensors, Qwen3's real tokenizer). What is checked:

- the files land in the standard hub cache layout (refs/main -> commit,
  snapshots/<commit>/<file> -> ../../blobs/<etag>), byte for byte, with a
  progress report per file and the load's time and GB/s in the log;
- the downloaded model answers exactly as the same files in a local
  directory do;
- a second run fetches nothing (offline with HF_HUB_OFFLINE=1 and the hub
  gone, or online: only the listing);
- a killed download resumes from the bytes it left (a Range request from
  there) and a connection cut mid-file is resumed within the run, both
  ending with the hub's hashes;
- /health/live answers and /health is 503 while the download runs;
- two workers started together on one cache download each file once (the
  second waits on the first's lock);
- unknown repository, gated repository without / with a wrong token, bad
  revision, no network, not enough disk, offline with an empty cache, and
  a repository without safetensors each stop the server with a message that
  says what to do (and never print the token).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from conftest import ROOT, _free_port, launch, wait_for
from fake_hub import FakeHub, Repo

REPO_ID = "kvc-test/tiny-qwen3"
FIXTURE = ROOT / "crates" / "model-qwen3" / "tests" / "fixtures" / "dense"
ASSETS = ROOT / "crates" / "text-front" / "assets" / "qwen3"
PROMPT = [3, 17, 42, 99, 7, 1, 250, 12]


def tiny_files() -> dict[str, bytes]:
    return {
        "config.json": (FIXTURE / "config.json").read_bytes(),
        "model.safetensors": (FIXTURE / "model.safetensors").read_bytes(),
        "tokenizer.json": gzip.decompress((ASSETS / "tokenizer.json.gz").read_bytes()),
        "tokenizer_config.json": (ASSETS / "tokenizer_config.json").read_bytes(),
        "README.md": b"# tiny\n",
        "pytorch_model.bin": b"not wanted: kvc reads safetensors only",
    }


def tiny_repo(**kw) -> Repo:
    return Repo(files=tiny_files(), lfs={"model.safetensors", "tokenizer.json", "pytorch_model.bin"}, **kw)


@pytest.fixture
def hub():
    h = FakeHub()
    yield h
    h.close()


def hub_env(hub_url: str, tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        "HF_ENDPOINT": hub_url,
        "HF_HUB_CACHE": str(tmp / "cache"),
        "HF_HOME": str(tmp / "hf-home"),  # no token file from the real home
        "HF_TOKEN": "",
        "HUGGING_FACE_HUB_TOKEN": "",
        "HF_HUB_OFFLINE": "",
    }
    env.update(extra)
    return env


def repo_cache(tmp: Path, repo_id: str = REPO_ID) -> Path:
    return tmp / "cache" / ("models--" + repo_id.replace("/", "--"))


def complete(srv, model: str) -> list:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1, "ignore_eos": True}
    r = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return [choice["text"], choice["logprobs"]["tokens"]]


def binary() -> str:
    return os.environ.get("KVC_SERVER_BIN", str(ROOT / "target" / "debug" / "kvc-server"))


def fails(env: dict[str, str], *flags: str) -> str:
    """Runs the server expecting it to stop with an error; returns its output."""
    full = {**os.environ, **env, "RUST_LOG": "info"}
    p = subprocess.run([binary(), "--host", "127.0.0.1", "--port", str(_free_port()), *flags], env=full,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0, f"expected a failure, got exit 0:\n{out[-3000:]}"
    return out


def test_a_hub_model_is_downloaded_cached_and_served_like_the_local_copy(hub, tmp_path):
    repo = tiny_repo()
    hub.repos[REPO_ID] = repo
    env = hub_env(hub.url, tmp_path)
    srv = launch(tmp_path, "--model", REPO_ID, env=env)
    models = httpx.get(f"{srv.base_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [REPO_ID]
    got = complete(srv, REPO_ID)
    srv.stop()
    log = srv.log_path.read_text()

    # The standard hub cache layout, byte for byte.
    cache = repo_cache(tmp_path)
    assert (cache / "refs" / "main").read_text().strip() == repo.sha
    snapshot = cache / "snapshots" / repo.sha
    fetched = sorted(p.name for p in snapshot.iterdir())
    assert fetched == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"], \
        "configs, tokenizer and safetensors only"
    for name in fetched:
        link = snapshot / name
        assert link.is_symlink() and os.readlink(link) == f"../../blobs/{repo.etag(name)}"
        assert link.read_bytes() == repo.files[name]
    assert not list((cache / "blobs").glob("*.incomplete"))
    # Progress per file, and the load's time and rate.
    for name in fetched:
        assert f"download: {name} done" in log, f"no progress report for {name}:\n{log[-3000:]}"
    assert "load weights:" in log and "gb_per_s" in log
    assert "allocate kv pool:" in log
    assert all(auth is None for _, _, auth in hub.requests), "no token was set, none may be sent"

    # The same files in a plain directory answer the same.
    local = tmp_path / "local-copy"
    local.mkdir()
    for name in fetched:
        (local / name).write_bytes(repo.files[name])
    direct = launch(tmp_path, "--model", str(local), "--served-model-name", REPO_ID)
    try:
        assert complete(direct, REPO_ID) == got
    finally:
        direct.stop()

    # A second run online fetches no file again (the listing only) ...
    before = len(hub.requests)
    again = launch(tmp_path, "--model", REPO_ID, env=env)
    try:
        assert complete(again, REPO_ID) == got
    finally:
        again.stop()
    assert [p for p, _, _ in hub.requests[before:]] == [f"/api/models/{REPO_ID}/revision/main"]
    assert "download: " not in again.log_path.read_text()

    # ... and offline it needs no hub at all.
    hub.close()
    offline = launch(tmp_path, "--model", REPO_ID, env={**env, "HF_HUB_OFFLINE": "1"})
    try:
        assert complete(offline, REPO_ID) == got
    finally:
        offline.stop()


def start(env: dict[str, str], log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary(), "--host", "127.0.0.1", "--port", str(port), *flags],
                                env={**os.environ, **env, "RUST_LOG": "info"}, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def probe(url: str):
    try:
        return httpx.get(url, timeout=2)
    except httpx.TransportError:
        return None


def test_a_killed_download_resumes_from_its_partial_file(hub, tmp_path):
    repo = tiny_repo()
    hub.repos[REPO_ID] = repo
    env = hub_env(hub.url, tmp_path)
    stall_at = 6 << 20
    import threading
    release = threading.Event()
    hub.stall["tokenizer.json"] = (stall_at, release)
    partial = repo_cache(tmp_path) / "blobs" / f"{repo.etag('tokenizer.json')}.incomplete"
    proc, base = start(env, tmp_path / "first.log", "--model", REPO_ID)
    try:
        wait_for(lambda: partial.exists() and partial.stat().st_size >= 1 << 20, 120, "part of tokenizer.json on disk")
        # Loading: alive, not ready.
        live = wait_for(lambda: probe(f"{base}/health/live"), 30, "/health/live during the download")
        assert live.status_code == 200
        health = probe(f"{base}/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        models = probe(f"{base}/v1/models")
        assert models.status_code == 503 and "loading" in models.json()["error"]["message"]
        # The loading front is the server's own accept loop: a malformed
        # request is answered with error JSON there too (issue 31).
        from test_protocol_errors import assert_error_json, exchange
        assert_error_json(exchange(int(base.rsplit(":", 1)[1]), b"G\x00T / HTTP/1.1\r\nHost: x\r\n\r\n"), (400,))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        del hub.stall["tokenizer.json"]
        release.set()
    kept = partial.stat().st_size
    assert 0 < kept < len(repo.files["tokenizer.json"])
    srv = launch(tmp_path, "--model", REPO_ID, env=env)
    srv.stop()
    ranges = hub.file_requests("tokenizer.json")
    assert ranges[-1] == f"bytes={kept}-", f"the second run should resume at byte {kept}: {ranges}"
    blob = repo_cache(tmp_path) / "blobs" / repo.etag("tokenizer.json")
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == repo.etag("tokenizer.json")
    assert not partial.exists()


def test_a_connection_cut_mid_file_is_resumed_in_the_same_run(hub, tmp_path):
    repo = tiny_repo()
    hub.repos[REPO_ID] = repo
    hub.cut["model.safetensors"] = 100_000
    srv = launch(tmp_path, "--model", REPO_ID, env=hub_env(hub.url, tmp_path))
    srv.stop()
    ranges = hub.file_requests("model.safetensors")
    assert len(ranges) == 2 and ranges[0] is None, ranges
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 100_000
    assert "download interrupted: resuming" in srv.log_path.read_text()
    blob = repo_cache(tmp_path) / "snapshots" / repo.sha / "model.safetensors"
    assert blob.read_bytes() == repo.files["model.safetensors"]


def test_hub_failures_stop_the_server_with_a_message_saying_what_to_do(hub, tmp_path):
    secret = "hf_s3cr3t_token"
    hub.repos[REPO_ID] = tiny_repo()
    hub.repos["kvc-test/gated"] = tiny_repo(token=secret)
    gated = hub.repos["kvc-test/gated"]
    gated.revisions = {"main": gated.sha, "v1": gated.sha}
    hub.repos["kvc-test/no-weights"] = Repo(files={k: v for k, v in tiny_files().items() if not k.endswith(".safetensors")}, lfs=set())
    env = hub_env(hub.url, tmp_path)

    out = fails(env, "--model", "kvc-test/no-such-model")
    assert "not found" in out and "HF_TOKEN" in out
    out = fails(env, "--model", "kvc-test/gated")
    assert "gated" in out and "HF_TOKEN" in out
    out = fails({**env, "HF_TOKEN": "hf_wrong"}, "--model", "kvc-test/gated")
    assert "gated" in out and "no access" in out and "hf_wrong" not in out
    out = fails(env, "--model", REPO_ID, "--revision", "v9")
    assert "revision" in out and "v9" in out
    out = fails(env, "--model", "kvc-test/no-weights")
    assert "safetensors" in out and "--load-format dummy" in out
    out = fails(hub_env(f"http://127.0.0.1:{_free_port()}", tmp_path), "--model", REPO_ID)
    assert "cannot reach the hub" in out and "HF_HUB_OFFLINE" in out
    out = fails({**env, "HF_HUB_OFFLINE": "1"}, "--model", REPO_ID)
    assert "HF_HUB_OFFLINE" in out and "not in the hub cache" in out
    out = fails(env, "--model", "not a/valid/id")
    assert "neither an existing directory nor a Hugging Face hub id" in out
    hub.reported_size["model.safetensors"] = 1 << 60
    out = fails(env, "--model", REPO_ID)
    assert "disk full" in out and "--download-dir" in out
    del hub.reported_size["model.safetensors"]
    assert not any((repo_cache(tmp_path) / "snapshots").glob("*/model.safetensors")), "nothing was fetched by the failures"

    # The right token (and a named revision) gets the gated model, into --download-dir.
    dl = tmp_path / "download-dir"
    srv = launch(tmp_path, "--model", "kvc-test/gated", "--revision", "v1", "--download-dir", str(dl),
                 env={**env, "HF_TOKEN": secret})
    try:
        assert complete(srv, "kvc-test/gated")
    finally:
        srv.stop()
    assert (dl / "models--kvc-test--gated" / "refs" / "v1").read_text().strip() == gated.sha
    assert secret not in srv.log_path.read_text()
    sent = {auth for p, _, auth in hub.requests if "gated" in p}
    assert f"Bearer {secret}" in sent


def test_two_workers_starting_on_one_model_download_each_file_once(hub, tmp_path):
    import threading
    repo = tiny_repo()
    hub.repos[REPO_ID] = repo
    env = hub_env(hub.url, tmp_path)
    release = threading.Event()
    hub.stall["tokenizer.json"] = (1 << 20, release)
    a, a_url = start(env, tmp_path / "a.log", "--model", REPO_ID)
    b = None
    try:
        partial = repo_cache(tmp_path) / "blobs" / f"{repo.etag('tokenizer.json')}.incomplete"
        wait_for(lambda: partial.exists(), 120, "the first worker to start tokenizer.json")
        b, b_url = start(env, tmp_path / "b.log", "--model", REPO_ID)
        wait_for(lambda: "another process is downloading this file" in (tmp_path / "b.log").read_text(errors="replace"),
                 120, "the second worker to wait for the first one's download")
        release.set()
        for url in (a_url, b_url):
            wait_for(lambda: (r := probe(f"{url}/health")) is not None and r.status_code == 200, 300, f"{url} ready")
    finally:
        release.set()
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert len(hub.file_requests(name)) == 1, f"{name} was downloaded {len(hub.file_requests(name))} times"
        assert (repo_cache(tmp_path) / "snapshots" / repo.sha / name).read_bytes() == repo.files[name]
