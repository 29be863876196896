"""Prometheus' text format read back: the samples of a `/metrics` answer
(scripts/load_test.py, scripts/pressure_report.py, the OpenAI suite's
conftest)."""

import re

SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)")


def samples(text: str) -> dict[str, float]:
    """Every sample by name; a labelled one as `name{labels}`."""
    out = {}
    for line in text.splitlines():
        m = SAMPLE.fullmatch(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out
