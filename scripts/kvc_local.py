"""A kvc-server process on a free local port, for the measurement scripts
(big_body_probe.py, session_publish_bench.py, host_tier_pressure.py)."""

import socket
import subprocess
import time

import httpx


def start(binary: str, *flags: str, wait_s: float = 60, log=subprocess.DEVNULL) -> tuple[subprocess.Popen, str]:
    """Starts `binary` on 127.0.0.1 and waits (up to `wait_s`) until /health
    answers; its output goes to `log` (a file object; discarded by default)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), *flags],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(int(wait_s * 10)):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{binary} did not become healthy" + (f" (log: {log.name})" if hasattr(log, "name") else ""))
