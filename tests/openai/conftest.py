"""Fixtures for the OpenAI-API suite: real `kvc-server` processes driven
with the real `openai` client.

The servers run the embedded default model (a tiny random Qwen3-MoE with the
real Qwen3 tokenizer): answers are gibberish but deterministic for greedy
decoding and for a fixed seed.

- `server`: one default server for the whole session.
- `start_server(*flags)`: a further server with its own flags (limits, API
  key, shutdown), stopped at the end of the test module or on request.

Environment:
    KVC_SERVER_BIN            server binary (default target/debug/kvc-server)
    KVC_SERVER_START_TIMEOUT  seconds to wait for /health (default 300)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from prom_text import samples  # noqa: E402  (scripts/prom_text.py: no dependencies)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(predicate, timeout_s, what):
    """Polls `predicate` until it returns something truthy (no fixed sleeps)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


class Server:
    def __init__(self, proc: subprocess.Popen, base_url: str, log_path: Path):
        self.proc = proc
        self.base_url = base_url  # http://127.0.0.1:PORT
        self.log_path = log_path

    def log_tail(self) -> str:
        return _log_tail(self.log_path)

    def metrics(self) -> dict[str, float]:
        """The samples of /metrics by name; labelled ones as name{labels}."""
        return samples(httpx.get(f"{self.base_url}/metrics", timeout=10).text)

    def client(self, api_key: str = "unused", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, timeout=300, **kw)

    def wait_idle(self, timeout_s: float = 30) -> dict[str, float]:
        """Waits until no request runs and every KV block is free again or
        held only by the prefix cache (reclaimable)."""
        return wait_for(
            lambda: (m := self.metrics())["kvc_requests_running"] == 0
            and m["kvc_requests_waiting"] == 0
            and m["kvc_kv_blocks_free"] + m["kvc_kv_blocks_evictable"] == m["kvc_kv_blocks_total"] and m,
            timeout_s, "an idle engine with every KV block free or reclaimable")

    def stop(self, sig=signal.SIGTERM, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def collect_stream(stream):
    """Accumulates a chat stream the way OpenAI clients do: (content,
    reasoning, tool calls as {id, name, arguments}, finish_reason)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
            for tc in c.delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function and tc.function.name:
                    call["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
            if c.finish_reason:
                finish = c.finish_reason
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def launch(tmp_dir: Path, *flags: str, env: dict | None = None) -> Server:
    """Starts kvc-server with `flags` (and `env` over this process's
    environment) and waits until /health answers 200."""
    binary = Path(os.environ.get("KVC_SERVER_BIN", ROOT / "target" / "debug" / "kvc-server"))
    if not binary.is_file():
        pytest.fail(f"server binary {binary} not found: run `cargo build -p kvc-server` or set KVC_SERVER_BIN")
    port = _free_port()
    log_path = tmp_dir / f"kvc-server-{port}.log"
    env = {**os.environ, **(env or {})}
    env.setdefault("RUST_LOG", "info")
    env.pop("KVC_API_KEY", None)
    env.pop("KVC_CLUSTER_TOKEN", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", str(port), *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    srv = Server(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + float(os.environ.get("KVC_SERVER_START_TIMEOUT", "300"))
    while True:
        if proc.poll() is not None:
            pytest.fail(f"kvc-server exited with {proc.returncode} before it was healthy:\n{srv.log_tail()}")
        try:
            if httpx.get(f"{srv.base_url}/health", timeout=2).status_code == 200:
                return srv
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"kvc-server not healthy before the deadline:\n{srv.log_tail()}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    srv = launch(tmp_path_factory.mktemp("server"))
    try:
        yield srv
    finally:
        srv.stop(timeout_s=20)


@pytest.fixture(scope="module")
def start_server(tmp_path_factory):
    started: list[Server] = []

    def start(*flags: str) -> Server:
        srv = launch(tmp_path_factory.mktemp("server"), *flags)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        if srv.proc.poll() is None:
            srv.stop(timeout_s=20)


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="session")
def model_card(client: openai.OpenAI):
    return client.models.list().data[0]


@pytest.fixture(scope="session")
def model(model_card) -> str:
    return model_card.id


@pytest.fixture(scope="session")
def max_model_len(model_card) -> int:
    return model_card.model_extra["max_model_len"]
