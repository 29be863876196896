#!/usr/bin/env bash
# Idempotent set-up of what the test suites need beyond cargo: a Python
# virtual environment in .venv with the pinned OpenAI client and pytest.
# Safe to run again: an existing .venv is reused and pip skips what is
# already installed at the pinned version.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

# Pinned versions of the suite's Python dependencies (httpx is the openai
# client's own transport; the raw-HTTP tests use it directly; jinja2 renders
# Qwen3's chat template independently of the server, as transformers does;
# jsonschema checks structured outputs).
REQUIREMENTS=(
    "openai==3.51.0"
    "httpx==0.28.1"
    "pytest==9.2.0"
    "jinja2==3.1.6"
    "markupsafe==3.0.2"
    # deploy/k8s/ is validated against the Kubernetes API's JSON schemas
    # (tests/openai/test_deploy_manifests.py), with their dependencies pinned.
    "kubernetes-validate==1.37.0"
    "pyyaml==6.0.3"
    # Structured-output tests validate answers against their JSON schema
    # with an implementation independent of the server's (also
    # kubernetes-validate's validator).
    "jsonschema==4.26.0"
    "jsonschema-specifications==2025.9.1"
    "referencing==0.37.0"
    "rpds-py==2026.9.1"
    "attrs==26.1.0"
    "importlib-resources==7.1.0"
    "packaging==26.4"
    "typing-extensions==4.16.0"
)

if [ ! -x "$VENV/bin/python" ]; then
    echo "ci_setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi

if "$VENV/bin/python" - "${REQUIREMENTS[@]}" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
for req in sys.argv[1:]:
    name, want = req.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
    echo "ci_setup: python packages already installed (${REQUIREMENTS[*]})"
else
    echo "ci_setup: installing ${REQUIREMENTS[*]}"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"
fi

# tests/openai/test_deploy_manifests.py runs kubectl on deploy/k8s/. The
# machine image ships it; elsewhere Debian's kubernetes-client provides it.
if ! command -v kubectl >/dev/null 2>&1; then
    echo "ci_setup: installing kubectl (Debian package kubernetes-client)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client
fi
