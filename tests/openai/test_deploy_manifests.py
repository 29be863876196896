"""deploy/k8s/: the Kubernetes example parses and maps as kubectl sees it
(`kubectl apply --dry-run=client --validate=false -f deploy/k8s/` against a
discovery-only API stand-in, since there is no cluster here), validates
strictly against the Kubernetes API's JSON schemas (kubernetes-validate,
pinned in scripts/ci_setup.sh; --validate=false checks no field), and holds
what docs/deployment.md promises: router / prefill / decode Deployments
probed on /health (readiness) and /health/live (liveness), the cluster
token from a Secret, each role started with the flags it needs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from fake_kube_api import FakeKubeApi

K8S = ROOT / "deploy" / "k8s"


def manifests() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_kubectl_accepts_the_manifests_in_a_client_dry_run(tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed: it is needed to check deploy/k8s/ (Debian: apt-get install kubectl "
                    "from the Kubernetes apt repository, or the machine image's package)")
    api = FakeKubeApi()
    try:
        env = {**os.environ, "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")), "HOME": str(tmp_path)}
        p = subprocess.run([kubectl, "apply", "--dry-run=client", "--validate=false", "-f", str(K8S)],
                           env=env, capture_output=True, text=True, timeout=120)
    finally:
        api.close()
    assert p.returncode == 0, f"kubectl refused deploy/k8s/:\n{p.stdout}\n{p.stderr}"
    created = sorted(line.split()[0] for line in p.stdout.splitlines() if line.endswith("created (dry run)"))
    want = sorted(f"{d['kind'].lower()}.{d['apiVersion'].split('/')[0]}/{d['metadata']['name']}"
                  if "/" in d["apiVersion"] else f"{d['kind'].lower()}/{d['metadata']['name']}" for d in manifests())
    assert created == want, p.stdout


def test_the_manifests_validate_against_the_kubernetes_schemas():
    import kubernetes_validate
    for doc in manifests():
        # strict: unknown fields are errors too.
        kubernetes_validate.validate(doc, "1.32.0", strict=True)


def container(doc: dict) -> dict:
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return c


def test_each_role_is_probed_and_gets_the_cluster_token_from_a_secret():
    docs = manifests()
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    roles = {}
    for name, d in deployments.items():
        c = container(d)
        role = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--role="))
        roles[role] = name
        assert c["readinessProbe"]["httpGet"]["path"] == "/health", name
        assert c["livenessProbe"]["httpGet"]["path"] == "/health/live", name
        token = next(e for e in c["env"] if e["name"] == "KVC_CLUSTER_TOKEN")
        ref = token["valueFrom"]["secretKeyRef"]
        assert ref["key"] in secrets[ref["name"]]["stringData"], name
        assert d["spec"]["replicas"] == 1, f"{name}: peers are addressed one by one"
    assert set(roles) == {"router", "prefill", "decode"}
    # Every peer URL names a Service of this deployment.
    for name, d in deployments.items():
        for a in container(d)["args"]:
            if a.startswith(("--prefill-peer=", "--decode-peer=")):
                host = a.split("//", 1)[1].split(":")[0]
                assert host in services, f"{name}: {a} names no Service"


def test_every_worker_runs_as_a_fixed_non_root_user():
    """Issue 31: the KV transport's accept guard trusts local connections
    of the worker's own user; as root that user is every root process of
    the node. Each Deployment runs as a fixed non-root UID, without
    privilege escalation or capabilities."""
    for d in (d for d in manifests() if d["kind"] == "Deployment"):
        name, pod = d["metadata"]["name"], d["spec"]["template"]["spec"]
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0 and sc["runAsGroup"] > 0, name
        c = container(d)["securityContext"]
        assert c["allowPrivilegeEscalation"] is False and c["capabilities"]["drop"] == ["ALL"], name
