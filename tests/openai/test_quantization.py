"""`--quantization fp8` (vLLM's flag) through a real kvc-server and the
openai client: a plain checkpoint's decoder projections become block FP8
as it loads. The quantizer itself is checked against an independent
reference in crates/model-qwen3/tests/quantization_at_load.rs (kvc
quantizing moe-norm at load answers as transformers answers the FP8
checkpoint scripts/make_fp8_fixture.py writes from it); here, that the
flag reaches the loader of a served checkpoint, that it moves the prompt's
logprobs by FP8's rounding and no more, that a checkpoint already in block
FP8 is served unchanged under it, and that the methods kvc lacks stop the
start by name."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path

from conftest import ROOT, launch

FIXTURES = ROOT / "crates" / "model-qwen3" / "tests" / "fixtures"
ASSETS = ROOT / "crates" / "text-front" / "assets" / "qwen3"
NAME = "tiny"
# Token ids inside the tiny fixtures' vocabulary of 256.
PROMPT = [3, 17, 42, 99, 7, 1, 250, 12, 64, 128, 200, 5]


def model_dir(tmp: Path, fixture: str) -> Path:
    """The fixture's weights and config with the Qwen3 tokenizer beside them."""
    d = tmp / fixture
    d.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURES / fixture / name, d / name)
    (d / "tokenizer.json").write_bytes(gzip.decompress((ASSETS / "tokenizer.json.gz").read_bytes()))
    shutil.copy(ASSETS / "tokenizer_config.json", d / "tokenizer_config.json")
    return d


def prompt_logprobs(tmp: Path, fixture: str, *flags: str) -> list[float]:
    """The served model's logprob of each prompt token after the first
    (lm-eval's scoring request: echo, logprobs, no generation)."""
    tmp.mkdir(parents=True)
    srv = launch(tmp, "--device", "cpu", "--model", str(model_dir(tmp, fixture)), "--served-model-name", NAME, *flags)
    try:
        r = srv.client().completions.create(model=NAME, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, temperature=0)
        lps = r.choices[0].logprobs.token_logprobs
        assert lps[0] is None and len(lps) == len(PROMPT), lps
        return lps[1:]
    finally:
        srv.stop()


def test_fp8_at_load_moves_a_plain_checkpoints_logprobs_by_fp8_rounding_only(tmp_path: Path):
    plain = prompt_logprobs(tmp_path / "plain", "moe-norm")
    fp8 = prompt_logprobs(tmp_path / "fp8", "moe-norm", "--quantization", "fp8")
    diffs = [abs(a - b) for a, b in zip(plain, fp8)]
    # The flag reached the loader: every weight of a projection is now one
    # of e4m3's values times its block's scale, and the answer moved.
    assert max(diffs) > 1e-4, f"--quantization fp8 left the answer as it was: {diffs}"
    # One e4m3 rounding per weight (at most 1/16 of its block's largest
    # value) moves a logprob, it does not scramble the distribution: the
    # tiny model's logprobs span several nats.
    span = max(plain) - min(plain)
    assert max(diffs) < 0.25 * span, f"logprobs moved {max(diffs):.3f} of a span of {span:.3f}: {diffs}"


def test_a_block_fp8_checkpoint_is_served_unchanged_under_the_flag(tmp_path: Path):
    own = prompt_logprobs(tmp_path / "own", "moe-norm-fp8")
    flagged = prompt_logprobs(tmp_path / "flagged", "moe-norm-fp8", "--quantization", "fp8")
    assert own == flagged


def test_methods_kvc_lacks_stop_the_start_by_name():
    binary = os.environ.get("KVC_SERVER_BIN", str(ROOT / "target" / "debug" / "kvc-server"))
    for method in ("awq", "gptq", "bitsandbytes"):
        p = subprocess.run([binary, "--port", "9", "--device", "cpu", "--quantization", method],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0, f"--quantization {method} started"
        assert f"--quantization {method} is not implemented" in p.stderr and "fp8" in p.stderr, p.stderr[-2000:]
