"""The GPU kernel choices (KVC_ATTENTION_BACKEND, KVC_DECODE_KERNEL,
KVC_MOE_GEMM, KVC_MOE_SMALL_PAIRS) are read once at start into the
engine's kernel plan: a value kvc does not know stops the start with a
message naming the variable and its choices, never a silent default."""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, launch


def run_with(env: dict) -> subprocess.CompletedProcess:
    binary = os.environ.get("KVC_SERVER_BIN", str(ROOT / "target" / "debug" / "kvc-server"))
    return subprocess.run([binary, "--host", "127.0.0.1", "--port", "9", "--device", "cpu"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("var,value,choice", [
    ("KVC_MOE_GEMM", "triton", "cutlass-swap"),
    ("KVC_ATTENTION_BACKEND", "flash", "cudnn-paged"),
    ("KVC_DECODE_KERNEL", "v3", "v1"),
    ("KVC_MOE_SMALL_PAIRS", "many", "pairs"),
])
def test_an_unknown_kernel_choice_stops_the_start_naming_it(var, value, choice):
    p = run_with({var: value})
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert var in out and value in out and choice in out, out[-2000:]


def test_known_choices_start_a_cpu_worker_that_serves(tmp_path: Path):
    srv = launch(tmp_path, "--device", "cpu", env={"KVC_MOE_GEMM": "cublas", "KVC_DECODE_KERNEL": "v1"})
    try:
        r = srv.client().completions.create(model="kvc-default", prompt=[41, 42], max_tokens=2)
        assert r.usage.completion_tokens >= 1
        assert "GPU kernel choices are set but the model runs on the CPU" in srv.log_path.read_text()
    finally:
        srv.stop(timeout_s=20)
