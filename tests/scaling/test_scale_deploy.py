"""deploy/ checked with what runs here (no Docker engine, no cluster): every
YAML file parses (multi-document), the Grafana dashboard only queries metrics
kvserve exports, the compose file, Kubernetes manifests and Dockerfile agree
with the gateway's flags; `docker compose config` and `kubectl kustomize` run
when those tools work offline."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvserve.frontend.backend_client import triton_client
from kvserve.frontend.cli.serve_cmd import build_parser
from kvserve.frontend.http.host_policy import host_policy_from_args
from kvserve.observability import metrics_catalogue as m

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
METRIC_NAMES = {s.name for s in (*m.CATALOGUE, *m.ROUTER_METRICS)}
HISTOGRAMS = {s.name for s in (*m.CATALOGUE, *m.ROUTER_METRICS) if s.kind is m.MetricKind.HISTOGRAM}
_METRIC_REF = re.compile(r"kvserve:[A-Za-z0-9_:]+")


def _docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _base_metric(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return name[: -len(suffix)]
    return name


def test_every_yaml_file_parses() -> None:
    assert len(YAML_FILES) >= 10, YAML_FILES
    for path in YAML_FILES:
        docs = _docs(path)
        assert docs and all(isinstance(d, dict) for d in docs), path


def _dashboard_queries(node) -> list[str]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "definition") and isinstance(v, str):
                out.append(v)
            else:
                out.extend(_dashboard_queries(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_dashboard_queries(v))
    return out


def test_dashboard_queries_only_catalogue_metrics() -> None:
    board = json.loads((DEPLOY / "grafana" / "dashboards" / "kvserve.json").read_text())
    queries = _dashboard_queries(board)
    assert len(queries) >= 20
    used = set()
    for q in queries:
        refs = _METRIC_REF.findall(q)
        assert refs, f"query without a kvserve metric: {q}"
        for ref in refs:
            assert _base_metric(ref) in METRIC_NAMES, f"{ref} is not in kvserve.observability.metrics_catalogue: {q}"
            used.add(_base_metric(ref))
    # the router and the engine's headline metrics are on it
    assert {m.ROUTER_REQUESTS.name, m.ROUTER_OUTSTANDING.name, m.ROUTER_REPLICA_READY.name,
            m.NUM_REQUESTS_WAITING.name, m.TIME_TO_FIRST_TOKEN.name, m.PREFIX_CACHE_HITS.name} <= used
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    datasource = _docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")[0]
    uids = {p["datasource"]["uid"] for p in board["panels"] if "datasource" in p}
    assert uids == {datasource["datasources"][0]["uid"]}


def _compose() -> dict:
    return _docs(DEPLOY / "docker-compose.yaml")[0]


def test_compose_wires_replicas_gateway_and_observability() -> None:
    services = _compose()["services"]
    tritons = sorted(s for s in services if s.startswith("triton-"))
    assert len(tritons) >= 2
    assert {"gateway", "otel-collector", "jaeger", "prometheus", "grafana"} <= set(services)
    for name in tritons:
        assert "tritonserver" in services[name]["command"][0]
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
    # the gateway's command line is one `kvserve serve` accepts, with every replica
    command = services["gateway"]["command"]
    assert command[:2] == ["kvserve", "serve"]
    args = build_parser().parse_args([a.replace("${KVSERVE_MODEL_NAME:-model}", "model")
                                      .replace("${KVSERVE_SERVED_MODEL_NAME:-kvserve}", "kvserve") for a in command[2:]])
    assert sorted(args.triton_url) == [f"{t}:8001" for t in tritons]
    assert host_policy_from_args(args).allows("gateway:8000")  # Prometheus's target passes the Host check
    # every file mounted from deploy/ exists
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), source
    assert (DEPLOY / "otel-collector.yaml").is_file()
    prometheus = _docs(DEPLOY / "prometheus.yml")[0]
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert {f"{t}:8002" for t in tritons} | {"gateway:8000"} <= targets


def test_dockerfile_layers_kvserve_on_tritonserver() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM nvcr\.io/nvidia/tritonserver:\$\{TRITON_TAG\}-py3$", text, re.M)
    assert re.search(r"^ARG TRITON_TAG=\d\d\.\d\d$", text, re.M)
    for folder in re.findall(r"^COPY (\S+) ", text, re.M):
        for part in folder.split():
            assert (DEPLOY.parent / part).exists(), part
    assert "model_repository" in text and "tritonserver" in text


def test_the_image_gets_every_folder_pyproject_installs() -> None:
    # `pip install .` in the image fails on a package-dir folder the build context or a COPY left out.
    folders = set(re.search(r"^package-dir = \{(.*)\}$", (DEPLOY.parent / "pyproject.toml").read_text(), re.M)
                  .group(1).split('"')[3::4])
    copied = set(re.findall(r"^COPY (\S+) \./\1$", (DEPLOY / "Dockerfile").read_text(), re.M))
    allowed = set(re.findall(r"^!(\S+)/\*\*$", (DEPLOY / "Dockerfile.dockerignore").read_text(), re.M))
    assert folders and folders <= copied, f"not copied into the image: {sorted(folders - copied)}"
    assert folders <= allowed, f"not in the build context: {sorted(folders - allowed)}"


def test_every_tritonserver_accepts_the_gateways_keepalive_pings() -> None:
    # With gRPC's defaults tritonserver closes a connection pinged every 10 s without calls
    # (GOAWAY too_many_pings); the gateway pings that way to notice a dead replica.
    gateway_ms = dict(triton_client._CHANNEL_OPTIONS)["grpc.keepalive_time_ms"]
    services = _compose()["services"]
    pod = _k8s()[("Deployment", "kvserve-triton")]["spec"]["template"]["spec"]["containers"][0]
    command_lines = {name: " ".join(services[name]["command"]) for name in services if name.startswith("triton-")}
    command_lines["k8s"] = " ".join(pod["command"] + pod["args"])
    command_lines["Dockerfile"] = (DEPLOY / "Dockerfile").read_text()
    for where, text in command_lines.items():
        assert "--grpc-keepalive-permit-without-calls=true" in text, where
        interval = re.search(r"--grpc-http2-min-recv-ping-interval-without-data=(\d+)", text)
        assert interval and int(interval.group(1)) * 2 <= gateway_ms, where


def _k8s() -> dict[tuple[str, str], dict]:
    objects = {}
    for path in (DEPLOY / "k8s").glob("*.yaml"):
        for doc in _docs(path):
            if "kind" in doc and doc.get("apiVersion", "").count("/") <= 1 and "metadata" in doc:
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def test_k8s_manifests_route_through_the_headless_service_and_scale_on_waiting() -> None:
    objs = _k8s()
    triton = objs[("Deployment", "kvserve-triton")]
    container = triton["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert {p["containerPort"] for p in container["ports"]} == {8000, 8001, 8002}
    volumes = {v["name"]: v for v in triton["spec"]["template"]["spec"]["volumes"]}
    claim = volumes["models"]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in objs
    headless = objs[("Service", "kvserve-triton")]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= triton["spec"]["template"]["metadata"]["labels"].items()
    gateway = objs[("Deployment", "kvserve-gateway")]
    gw = gateway["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(gw["args"])
    assert args.triton_url == ["dns://kvserve-triton:8001"]
    hosts = host_policy_from_args(args)  # the Service's in-cluster names pass the Host check
    assert hosts.allows("kvserve-gateway") and hosts.allows("kvserve-gateway.default.svc.cluster.local:80")
    assert gw["readinessProbe"]["httpGet"]["path"] == "/health"
    service = objs[("Service", "kvserve-gateway")]
    assert service["spec"]["selector"].items() <= gateway["spec"]["template"]["metadata"]["labels"].items()
    hpa = objs[("HorizontalPodAutoscaler", "kvserve-triton")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "kvserve-triton"}
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    adapter = _docs(DEPLOY / "k8s" / "prometheus-adapter-values.yaml")[0]
    rule = adapter["rules"]["custom"][0]
    assert rule["name"]["as"] == metric
    assert m.NUM_REQUESTS_WAITING.name in rule["seriesQuery"] and re.match(rule["name"]["matches"], m.NUM_REQUESTS_WAITING.name)
    listed = set(_docs(DEPLOY / "k8s" / "kustomization.yaml")[0]["resources"])
    assert listed == {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml", "prometheus-adapter-values.yaml"}


def test_k8s_only_the_gateways_reach_the_backends_inference_ports() -> None:
    # A pod that could call tritonserver directly would skip the API keys and the keyed tenant
    # salts (and probe any salt's cache through cached_tokens).
    objs = _k8s()
    triton_labels = objs[("Deployment", "kvserve-triton")]["spec"]["template"]["metadata"]["labels"]
    gateway_labels = objs[("Deployment", "kvserve-gateway")]["spec"]["template"]["metadata"]["labels"]
    policies = [o for (kind, _), o in objs.items() if kind == "NetworkPolicy"
                and o["spec"]["podSelector"]["matchLabels"].items() <= triton_labels.items()]
    assert policies, "no NetworkPolicy selects the backend pods"
    for policy in policies:
        assert "Ingress" in policy["spec"]["policyTypes"]
    reaching: dict[int, list] = {}
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])] or ["every port"]
            for port in ports:
                reaching.setdefault(port, []).append(rule.get("from"))
    for port in (8001, 8000, "every port"):
        for sources in reaching.get(port, []):
            assert sources, f"port {port} is open to every pod"
            for source in sources:
                assert set(source) == {"podSelector"}, source  # no namespace or ipBlock wildcard
                assert source["podSelector"]["matchLabels"].items() <= gateway_labels.items(), source
    assert reaching.get(8001), "the gateways cannot reach gRPC"
    # The gateways share one cache-salt secret, from a Secret (not made up per pod).
    env = {e["name"]: e for e in objs[("Deployment", "kvserve-gateway")]["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    ref = env["KVSERVE_CACHE_SALT_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] and ref["key"] and not ref.get("optional")


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_docker_compose_config() -> None:
    if shutil.which("docker") and _works(["docker", "compose", "version"]):
        argv = ["docker", "compose"]
    elif shutil.which("docker-compose") and _works(["docker-compose", "version"]):
        argv = ["docker-compose"]
    else:
        pytest.skip("no docker compose here (the docker client has no compose plugin); the YAML is checked above")
    out = subprocess.run([*argv, "-f", str(DEPLOY / "docker-compose.yaml"), "config", "--quiet"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_kubectl_kustomize_builds() -> None:
    if not shutil.which("kubectl"):
        pytest.skip("no kubectl here")
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "k8s")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out.stdout) if d)
    assert kinds == ["Deployment", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy",
                     "PersistentVolumeClaim", "Service", "Service"]
