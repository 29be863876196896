"""Fixtures for the OpenAI-API suite: one real `kvc-server` process per
test session, driven with the real `openai` client.

The server runs the embedded default model (a tiny random Qwen3-MoE with the
real Qwen3 tokenizer): answers are gibberish but deterministic for greedy
decoding and for a fixed seed.

Environment:
    KVC_SERVER_BIN            server binary (default target/debug/kvc-server)
    KVC_SERVER_START_TIMEOUT  seconds to wait for /health (default 300)
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Server:
    def __init__(self, proc: subprocess.Popen, base_url: str, log_path: Path):
        self.proc = proc
        self.base_url = base_url  # http://127.0.0.1:PORT
        self.log_path = log_path

    def log_tail(self) -> str:
        return _log_tail(self.log_path)

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of /metrics, by name."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*) (\S+)", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    binary = Path(os.environ.get("KVC_SERVER_BIN", ROOT / "target" / "debug" / "kvc-server"))
    if not binary.is_file():
        pytest.fail(f"server binary {binary} not found: run `cargo build -p kvc-server` or set KVC_SERVER_BIN")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "kvc-server.log"
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "info")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    srv = Server(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + float(os.environ.get("KVC_SERVER_START_TIMEOUT", "300"))
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"kvc-server exited with {proc.returncode} before it was healthy:\n{srv.log_tail()}")
            try:
                if httpx.get(f"{srv.base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"kvc-server not healthy before the deadline:\n{srv.log_tail()}")
            time.sleep(0.1)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def model_card(client: openai.OpenAI):
    return client.models.list().data[0]


@pytest.fixture(scope="session")
def model(model_card) -> str:
    return model_card.id


@pytest.fixture(scope="session")
def max_model_len(model_card) -> int:
    return model_card.model_extra["max_model_len"]
