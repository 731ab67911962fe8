"""deploy/ is ready to use: each file parses, and every command, option, port, path and RSNOTIFY_*
variable it uses exists in `rsnotify hub` / `rsnotify worker` (the same click commands their
--help prints) and in the hub's routes; the Kubernetes manifests pass the API schema and the
"restricted" Pod Security rules; the image's health check and constraints are checked for real."""
from __future__ import annotations

import asyncio
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

import click
import pytest
import yaml

from rsnotify.cli import main as rsnotify_main
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.web.app import build_app
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VAR = re.compile(r"\bRSNOTIFY_[A-Z_]+\b")


def command(name: str) -> click.Command:
    found = rsnotify_main.get_command(click.Context(rsnotify_main), name)
    assert found is not None, f"rsnotify {name} does not exist"
    return found


def variables(name: str) -> set[str]:
    """The RSNOTIFY_* variables `rsnotify NAME` reads (what its --help shows as env var)."""
    return {p.envvar for p in command(name).params if isinstance(p.envvar, str)}


def check_command(argv: list[str]) -> str:
    """`argv` (an `rsnotify ...` command line) parses with the real CLI; returns the subcommand."""
    assert Path(argv[0]).name == "rsnotify", f"not an rsnotify command: {argv}"
    name, args = argv[1], argv[2:]
    assert name in ("hub", "worker"), f"unexpected command {argv}"
    command(name).make_context(name, list(args), resilient_parsing=False)   # raises on an unknown option
    return name


def check_admin_command(argv: list[str]) -> None:
    """`rsnotify admin [options] SUBCOMMAND... [args]` names real subcommands and parses."""
    cmd: click.Command = command("admin")
    args = argv[2:]
    while isinstance(cmd, click.Group):
        by_option = {o: p for p in cmd.params for o in p.opts}
        while args and args[0].startswith("--"):
            param = by_option.get(args[0])
            assert param is not None, f"rsnotify admin has no option {args[0]}: {argv}"
            args = args[1:] if getattr(param, "is_flag", False) else args[2:]
        if not args:
            return       # the group alone (`rsnotify admin`, `rsnotify admin --help`)
        found = cmd.get_command(click.Context(cmd), args[0])
        assert found is not None, f"{cmd.name} has no subcommand {args[0]}: {argv}"
        cmd, args = found, args[1:]
    cmd.make_context(cmd.name, list(args), resilient_parsing=False)


def check_env(names: set[str], used_by: str, where: str) -> None:
    unknown = {n for n in names if n.startswith("RSNOTIFY_")} - variables(used_by)
    assert not unknown, f"{where}: rsnotify {used_by} has no variable {sorted(unknown)}"


def routes() -> set[str]:
    app = build_app(HubSettings(redis_url="redis://127.0.0.1:1/0"))
    return {r.resource.canonical for r in app.router.routes() if r.resource is not None}


DEFAULT_PORT = str(HubSettings().port)


def test_every_variable_mentioned_anywhere_exists() -> None:
    known = variables("hub") | variables("worker") | variables("admin")
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file():
            unknown = set(VAR.findall(path.read_text())) - known
            assert not unknown, f"{path.relative_to(DEPLOY)} names {sorted(unknown)}, unknown to the CLI"


def test_readme_commands_exist() -> None:
    readme = (DEPLOY / "README.md").read_text()
    lines = re.findall(r"\brsnotify (?:hub|worker)\b[^\n`|;)&]*", readme)
    assert len(lines) >= 3
    for line in lines:
        argv = shlex.split(line.split("#", 1)[0].strip().rstrip("\\"))
        check_command(["rsnotify", *(a for a in argv[1:] if a != "--help")])
    known = {o for name in ("hub", "worker") for p in command(name).params for o in p.opts}
    admin = command("admin")
    known |= {o for c in [admin, *admin.commands.values()] for p in c.params for o in p.opts}
    for option in set(re.findall(r"`(--[a-z-]+)", readme)):
        assert option in known, f"README names {option}, which no rsnotify hub/worker/admin option has"
    admin_lines = re.findall(r"\brsnotify admin\b[^\n`|;)&]*", readme)
    assert admin_lines
    for line in admin_lines:
        check_admin_command(shlex.split(line.split("#", 1)[0].strip().replace("SID", "a" * 32)))


def dockerfile_instructions() -> list[str]:
    text = (DEPLOY / "Dockerfile").read_text()
    return [line.strip() for line in text.replace("\\\n", " ").splitlines() if line and not line.startswith("#")]


def healthcheck_command() -> list[str]:
    health = next(i for i in dockerfile_instructions() if i.startswith("HEALTHCHECK"))
    return json.loads(health[health.index(" CMD ") + 5:])


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    instructions = dockerfile_instructions()
    cmd = [i for i in instructions if i.startswith("CMD ")][-1]
    assert check_command(json.loads(cmd[4:])) == "hub"
    expose = re.search(r"^EXPOSE (\d+)", text, flags=re.MULTILINE).group(1)
    env = dict(re.findall(r"(RSNOTIFY_[A-Z_]+)=(\S+)", text))
    check_env(set(env), "hub", "Dockerfile")
    assert expose == env.get("RSNOTIFY_PORT", DEFAULT_PORT)
    health = " ".join(healthcheck_command())
    assert "RSNOTIFY_PORT" in health and f":{expose}/" not in health, "the health check must follow RSNOTIFY_PORT"
    assert "/health" in health and "/health" in routes()
    assert re.search(r"^USER (?!root|0\b)\S+", text, flags=re.MULTILINE), "the image must not run as root"
    [install] = [i for i in instructions if i.startswith("RUN pip install")]
    assert "-c deploy/constraints.txt" in install and "'.[hub]'" in install, install


async def test_image_health_check_follows_rsnotify_port(ops_hub) -> None:
    """The HEALTHCHECK command itself, run with the hub's port in RSNOTIFY_PORT: healthy; another port: not."""
    port = ops_hub.url.rsplit(":", 1)[1].strip("/")
    argv = [sys.executable if a == "python" else a for a in healthcheck_command()]

    async def run(with_port: str) -> int:
        process = await asyncio.create_subprocess_exec(*argv, env={**os.environ, "RSNOTIFY_PORT": with_port},
                                                       stdout=asyncio.subprocess.DEVNULL,
                                                       stderr=asyncio.subprocess.DEVNULL)
        return await asyncio.wait_for(process.wait(), 60)

    assert await run(port) == 0
    assert await run(str(free_port())) != 0


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides ("!" re-includes)."""
    parts = path.split("/")
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        glob = pattern.replace("**/", "*/") if pattern.startswith("**/") else pattern
        if any(fnmatch.fnmatchcase(c, glob) or (pattern.startswith("**/") and fnmatch.fnmatchcase(c, pattern[3:]))
               for c in candidates):
            excluded = not negate
    return excluded


def test_dockerignore_lets_in_only_what_the_image_copies() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = [i.split()[1] for i in dockerfile_instructions() if i.startswith("COPY ") and "--from" not in i]
    for source in copied:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which does not exist"
        assert not dockerignore_excludes(source, patterns), f".dockerignore keeps out {source}"
    for private in ("deploy/tokens.txt", ".git/config", ".venv/bin/python", "tests/conftest.py",
                    "hub/__pycache__/app.cpython-311.pyc", "rsnotify-data/secret.key", ".env"):
        assert dockerignore_excludes(private, patterns), f".dockerignore lets {private} into the image"


def test_constraints_pin_exactly_what_the_hub_extra_installs() -> None:
    """deploy/constraints.txt names every distribution `rsnotify[hub]` needs (and nothing else), at
    versions that satisfy pyproject's ranges."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    spec = importlib.util.spec_from_file_location("pin_constraints", DEPLOY / "pin_constraints.py")
    pin_constraints = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pin_constraints)
    pins = dict(line.split("==") for line in (DEPLOY / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    needed = pin_constraints.closure()
    assert set(pins) == set(needed), ("run `python deploy/pin_constraints.py > deploy/constraints.txt`: "
                                      f"missing {sorted(set(needed) - set(pins))}, extra {sorted(set(pins) - set(needed))}")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"] + project["optional-dependencies"]["hub"]:
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate(
                {**default_environment(), **pin_constraints.IMAGE_PLATFORM}):
            continue        # e.g. portalocker, Windows only: not in the Linux image
        pinned = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(pinned, prereleases=True), f"{requirement.name}=={pinned} is outside {line}"


def test_compose() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "hub", "worker", "prometheus"} <= set(services)
    redis = services["redis"]
    assert "--appendonly" in redis["command"] and "yes" in redis["command"]
    password = redis["command"][redis["command"].index("--requirepass") + 1]
    assert password.startswith("${REDIS_PASSWORD:?"), "Redis must refuse to start without a password"
    assert redis["environment"]["REDISCLI_AUTH"] == "${REDIS_PASSWORD}"   # its health check authenticates
    for name in ("hub", "worker"):
        service = services[name]
        used = check_command(service["command"])
        assert used == name
        check_env(set(service["environment"]), used, f"compose service {name}")
        assert service["environment"]["RSNOTIFY_REDIS_URL"] == "redis://:${REDIS_PASSWORD}@redis:6379/0"
        assert "redis" in service["networks"] and "default" in service["networks"]   # Redis, and subscribers
    for name, service in services.items():
        assert service.get("read_only") is True and service.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
    assert redis["networks"] == ["redis"] and compose["networks"]["redis"]["internal"] is True
    assert [n for n, s in services.items() if "redis" in s.get("networks", [])] == ["redis", "hub", "worker"]
    hub_env = services["hub"]["environment"]
    assert services["hub"]["ports"] == [f"{hub_env['RSNOTIFY_PORT']}:{hub_env['RSNOTIFY_PORT']}"]
    secret_file = hub_env["RSNOTIFY_TOKENS_FILE"]
    assert secret_file == "/run/secrets/" + services["hub"]["secrets"][0]
    assert (DEPLOY / compose["secrets"]["rsnotify_tokens"]["file"].replace("tokens.txt", "tokens.txt.example")).exists()
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    assert job["metrics_path"] in routes()
    assert job["static_configs"][0]["targets"] == [f"hub:{hub_env['RSNOTIFY_PORT']}"]


def test_tokens_example_is_a_valid_tokens_file() -> None:
    from rsnotify.hub.settings import read_tokens_file
    pairs = read_tokens_file(str(DEPLOY / "tokens.txt.example"))
    assert pairs and all(prefix.startswith("https://") for _, prefix in pairs)


def k8s_documents(names: list[str] | None = None) -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if path.name != "kustomization.yaml" and (names is None or path.name in names):
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def applied_files() -> list[str]:
    """The manifests `kubectl apply -k deploy/k8s` applies (the README's command)."""
    return yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]


def check_restricted(pod: dict, where: str) -> None:
    """The "restricted" Pod Security Standard, for the fields these manifests use, plus a read-only root."""
    pod_context = pod.get("securityContext", {})
    assert pod.get("automountServiceAccountToken") is False, where
    for container in pod["containers"] + pod.get("initContainers", []):
        context = {**pod_context, **container.get("securityContext", {})}
        name = f"{where} container {container['name']}"
        assert context.get("runAsNonRoot") is True and context.get("runAsUser", 0) != 0, name
        assert context.get("allowPrivilegeEscalation") is False, name
        assert context.get("capabilities", {}).get("drop") == ["ALL"] and not context["capabilities"].get("add"), name
        assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        assert context.get("readOnlyRootFilesystem") is True, name
        assert not container.get("ports") or all("hostPort" not in p for p in container["ports"]), name
        resources = container.get("resources", {})
        for kind in ("cpu", "memory"):
            assert kind in resources.get("requests", {}) and kind in resources.get("limits", {}), f"{name}: {kind}"
    for volume in pod.get("volumes", []):
        assert set(volume) - {"name"} <= {"secret", "configMap", "emptyDir", "persistentVolumeClaim", "projected"}, where
        assert "hostPath" not in volume, where


def test_kubernetes() -> None:
    applied = applied_files()
    assert sorted(applied) == sorted(p.name for p in (DEPLOY / "k8s").glob("*.yaml")
                                     if p.name not in ("kustomization.yaml", "secret.example.yaml"))
    docs = k8s_documents(applied)
    assert not [d for d in docs if d["kind"] == "Secret"], "an applied manifest would overwrite the real Secret"
    [example] = k8s_documents(["secret.example.yaml"])
    secret = example["stringData"]
    by_kind: dict[tuple[str, str], dict] = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    by_kind[("Secret", example["metadata"]["name"])] = example
    config = by_kind[("ConfigMap", "rsnotify-config")]["data"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"rsnotify-hub", "rsnotify-worker"}
    for workload in [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]:
        check_restricted(workload["spec"]["template"]["spec"], workload["metadata"]["name"])
    for deployment in deployments:
        spec = deployment["spec"]["template"]["spec"]
        [container] = spec["containers"]
        used = check_command(container["command"])
        env = set()
        for source in container.get("envFrom", []):
            assert ("ConfigMap", source["configMapRef"]["name"]) in by_kind
            env |= set(config)
        defined: list[str] = []
        for item in container.get("env", []):
            env.add(item["name"])
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ("Secret", ref["name"]) in by_kind and ref["key"] in secret
            for needed in re.findall(r"\$\((\w+)\)", item.get("value", "")):
                assert needed in defined, f"{item['name']} uses $({needed}) before it is defined"
            defined.append(item["name"])
        check_env(env, used, f"k8s {deployment['metadata']['name']}")
        redis_url = next(i["value"] for i in container["env"] if i["name"] == "RSNOTIFY_REDIS_URL")
        host = re.fullmatch(r"redis://:\$\(REDIS_PASSWORD\)@([^:/]+):6379/0", redis_url).group(1)
        assert ("Service", host) in by_kind
        if used == "hub":
            [port] = container["ports"]
            assert str(port["containerPort"]) == config["RSNOTIFY_PORT"]
            assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": port["name"]}
            # liveness must not depend on Redis: a Redis outage should not restart every hub pod
            assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": port["name"]}
            assert {"/health", "/live"} <= routes()
            tokens = next(i["value"] for i in container["env"] if i["name"] == "RSNOTIFY_TOKENS_FILE")
            mount = next(m for m in container["volumeMounts"] if m["mountPath"] == os.path.dirname(tokens))
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            assert tokens == mount["mountPath"] + "/" + volume["secret"]["items"][0]["path"]
            assert volume["secret"]["items"][0]["key"] in secret
            service = by_kind[("Service", "rsnotify-hub")]
            assert service["spec"]["ports"][0]["targetPort"] == port["name"]


def test_kubernetes_redis_needs_a_password_and_only_hub_and_workers_reach_it() -> None:
    docs = k8s_documents(applied_files())
    [redis] = [d for d in docs if d["kind"] == "StatefulSet"]
    [container] = redis["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDISCLI_AUTH)"
    [auth] = [e for e in container["env"] if e["name"] == "REDISCLI_AUTH"]    # redis-cli in the probes reads it
    assert auth["valueFrom"]["secretKeyRef"] == {"name": "rsnotify-secrets", "key": "REDIS_PASSWORD"}
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    redis_labels = redis["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= redis_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    [peer] = rule["from"]
    allowed = {e["key"]: set(e["values"]) for e in peer["podSelector"]["matchExpressions"]}
    assert allowed == {"app": {"rsnotify"}, "component": {"hub", "worker"}}
    clients = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"}
    assert all(labels["component"] in allowed["component"] for labels in clients.values())
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]


def test_kubernetes_manifests_pass_the_api_schema() -> None:
    """kubernetes-validate checks each document against the Kubernetes OpenAPI schema (strict:
    a misspelt field fails), the way kubeconform does."""
    validator = pytest.importorskip("kubernetes_validate",
                                    reason="kubernetes-validate is not installed (pip install kubernetes-validate)")
    docs = k8s_documents()
    assert len(docs) >= 8
    version = validator.latest_version()
    for doc in docs:
        validator.validate(doc, version, strict=True)
    broken = json.loads(json.dumps(next(d for d in docs if d["kind"] == "Deployment")))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(validator.ValidationError):       # the check is real: a typo fails it
        validator.validate(broken, version, strict=True)


def systemd_unit(path: Path) -> dict[str, list[str]]:
    entries: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            entries.setdefault(key.strip(), []).append(value.strip())
    return entries


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


@pytest.mark.parametrize("unit", ["rsnotify-hub.service", "rsnotify-worker@.service"])
def test_systemd_units(unit: str) -> None:
    entries = systemd_unit(DEPLOY / "systemd" / unit)
    argv = shlex.split(entries["ExecStart"][0].replace("%H", "host").replace("%i", "1"))
    used = check_command(argv)
    assert used == ("hub" if "hub" in unit else "worker")
    env_path = Path(entries["EnvironmentFile"][0])
    example = DEPLOY / "systemd" / (env_path.name + ".example")
    check_env(set(env_file(example)), used, f"{unit} via {example.name}")
    assert entries["User"] == ["rsnotify"]
    state = "/var/lib/" + entries["StateDirectory"][0]
    assert env_file(example)["RSNOTIFY_DATA_DIR"] == state == entries["WorkingDirectory"][0]


def test_nginx_proxies_to_the_hub_port() -> None:
    text = (DEPLOY / "nginx" / "rsnotify.conf").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    assert code.count("{") == code.count("}")
    upstream = re.search(r"upstream (\S+) \{\s*server ([\d.]+):(\d+);", code)
    env = env_file(DEPLOY / "systemd" / "rsnotify.env.example")
    assert upstream.group(2) == env["RSNOTIFY_HOST"] and upstream.group(3) == env["RSNOTIFY_PORT"]
    assert f"proxy_pass http://{upstream.group(1)};" in code
    size = int(re.search(r"client_max_body_size (\d+)m;", code).group(1))
    assert size * 1024 * 1024 >= HubSettings().max_body
    server_name = re.search(r"server_name (\S+);", code).group(1)
    assert env["RSNOTIFY_PUBLIC_URL"] == f"https://{server_name}/"


# --- a replicated Redis/Valkey under Sentinel (compose, Kubernetes overlay, systemd drop-ins) -------

SENTINEL_PORT = 26379


def substituted(value: str) -> str:
    """A compose/shell value with ${VAR} replaced by a stand-in (var-name), ${VAR:-default} by its
    default, and $$ by $, as at run time."""
    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        return default[2:] if default and default.startswith(":-") else name.lower().replace("_", "-")
    return re.sub(r"\$\{([A-Z_]+)([^}]*)\}", one, value).replace("$$", "$")


def sentinel_settings(env: dict[str, str]) -> HubSettings:
    """The settings a process builds from `env` (RSNOTIFY_* only); they must be valid."""
    return HubSettings.from_env({k: v for k, v in env.items() if k.startswith("RSNOTIFY_")})


def test_sentinel_compose() -> None:
    from rsnotify.hub.redis_url import parse_redis_url

    compose = yaml.safe_load((DEPLOY / "docker-compose.sentinel.yml").read_text())
    services = compose["services"]
    nodes = {n: s for n, s in services.items() if n.startswith("valkey-")}
    sentinels = {n: s for n, s in services.items() if n.startswith("sentinel-")}
    assert len(nodes) == 3 and len(sentinels) == 3 and {"hub", "worker"} <= set(services)
    for name, node in nodes.items():
        command = node["command"]
        assert command[command.index("--appendonly") + 1] == "yes", name
        assert command[command.index("--requirepass") + 1].startswith("${REDIS_PASSWORD"), name
        assert command[command.index("--masterauth") + 1] == "${REDIS_PASSWORD}", name   # it may become a replica
        if name != "valkey-1":
            assert command[command.index("--replicaof") + 1:command.index("--replicaof") + 3] == ["valkey-1", "6379"]
    monitored = set()
    for name, sentinel in sentinels.items():
        conf = sentinel["command"][0]
        assert f"port {SENTINEL_PORT}" in conf and conf.rstrip().endswith("--sentinel"), name
        service, host = re.search(r"sentinel monitor (\S+) (\S+) 6379 2", conf).groups()
        assert host in nodes, name
        monitored.add(service)
        assert "sentinel auth-pass " + service + " $${REDIS_PASSWORD}" in conf       # the data nodes' password
        assert "requirepass $${SENTINEL_PASSWORD}" in conf                          # its own, another one
        assert sentinel["environment"]["SENTINEL_PASSWORD"].startswith("${SENTINEL_PASSWORD:?"), name
    [service] = monitored
    for name in ("hub", "worker"):
        process = services[name]
        used = check_command(process["command"])
        assert used == name
        env = process["environment"]
        check_env(set(env), used, f"sentinel compose service {name}")
        url = parse_redis_url(substituted(env["RSNOTIFY_REDIS_URL"]))
        assert url.is_sentinel and url.service == service and url.password == "redis-password"
        assert {f"{h}:{p}" for h, p in url.sentinels} == {f"{s}:{SENTINEL_PORT}" for s in sentinels}
        assert env["RSNOTIFY_SENTINEL_PASSWORD"] == "${SENTINEL_PASSWORD}"
        settings = sentinel_settings({k: substituted(str(v)) for k, v in env.items()})
        assert settings.replicas_to_wait_for == 1
        assert set(process["networks"]) == {"valkey", "default"}
    for name, process in services.items():
        assert process.get("read_only") is True and process.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in process.get("security_opt", []), name
    assert compose["networks"]["valkey"]["internal"] is True
    assert {n for n, s in services.items() if "valkey" in s.get("networks", [])} == \
        set(nodes) | set(sentinels) | {"hub", "worker"}


def sentinel_overlay() -> tuple[dict, list[dict]]:
    """deploy/k8s-sentinel's kustomization, and the documents it yields: deploy/k8s's with the
    delete patches applied and the env patches merged by name (kustomize's strategic merge)."""
    overlay = DEPLOY / "k8s-sentinel"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"][0] == "../k8s"
    docs = k8s_documents(applied_files())
    for resource in kustomization["resources"][1:]:
        docs += [d for d in yaml.safe_load_all((overlay / resource).read_text()) if d]
    for entry in kustomization["patches"]:
        patch = yaml.safe_load(entry["patch"])
        if patch.get("$patch") == "delete":
            found = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"])]
            assert len(found) == 1, f"the overlay deletes {patch['kind']} {patch['metadata']['name']}, absent from deploy/k8s"
            docs.remove(found[0])
            continue
        [target] = [d for d in docs if d["kind"] == entry["target"]["kind"] and
                    d["metadata"]["name"] == entry["target"]["name"]]
        for changed in patch["spec"]["template"]["spec"]["containers"]:
            [container] = [c for c in target["spec"]["template"]["spec"]["containers"] if c["name"] == changed["name"]]
            for item in changed["env"]:
                names = [e["name"] for e in container["env"]]
                if item["name"] in names:
                    container["env"][names.index(item["name"])] = item
                else:
                    container["env"].append(item)
    return kustomization, docs


def test_sentinel_kubernetes_overlay_and_chart_values() -> None:
    from rsnotify.hub.redis_url import parse_redis_url

    overlay = DEPLOY / "k8s-sentinel"
    _, docs = sentinel_overlay()
    text = (overlay / "kustomization.yaml").read_text()
    release = re.search(r"helm install (\S+) valkey/valkey -f deploy/k8s-sentinel/valkey-values.yaml", text).group(1)
    assert release in (DEPLOY / "README.md").read_text()
    values = yaml.safe_load((overlay / "valkey-values.yaml").read_text())
    replica, sentinel = values["replica"], values["replica"]["sentinel"]
    assert replica["enabled"] and sentinel["enabled"] and replica["replicas"] + 1 >= 3 and sentinel["replicas"] >= 3
    assert sentinel["quorum"] == sentinel["replicas"] // 2 + 1
    assert {"default", replica["replicationUser"]} <= set(values["auth"]["aclUsers"])
    assert "appendonly yes" in values["valkeyConfig"] and "appendfsync everysec" in values["valkeyConfig"]
    [example] = [d for d in yaml.safe_load_all((overlay / "users-secret.example.yaml").read_text()) if d]
    assert example["metadata"]["name"] == values["auth"]["usersExistingSecret"]
    assert {"default", replica["replicationUser"], sentinel["passwordKey"]} <= set(example["stringData"])
    assert not [d for d in docs if d["kind"] == "StatefulSet" or "redis" in d["metadata"]["name"]]
    assert not [d for d in docs if d["kind"] == "Secret"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"rsnotify-hub", "rsnotify-worker"}
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    for deployment in deployments:
        check_restricted(deployment["spec"]["template"]["spec"], deployment["metadata"]["name"])
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        used = check_command(container["command"])
        env = {item["name"]: item for item in container["env"]}
        check_env(set(env) | set(config), used, f"k8s-sentinel {deployment['metadata']['name']}")
        defined: list[str] = []
        for item in container["env"]:
            for needed in re.findall(r"\$\((\w+)\)", item.get("value", "")):
                assert needed in defined, f"{item['name']} uses $({needed}) before it is defined"
            defined.append(item["name"])
        url = parse_redis_url(env["RSNOTIFY_REDIS_URL"]["value"].replace("$(REDIS_PASSWORD)", "x"))
        assert url.is_sentinel and url.service == sentinel["masterSet"]
        assert url.sentinels == ((f"{release}-sentinel", sentinel["port"]),)
        secret_of = {name: env[name]["valueFrom"]["secretKeyRef"] for name in ("REDIS_PASSWORD",
                                                                               "RSNOTIFY_SENTINEL_PASSWORD")}
        assert secret_of["REDIS_PASSWORD"] == {"name": example["metadata"]["name"], "key": "default"}
        assert secret_of["RSNOTIFY_SENTINEL_PASSWORD"] == {"name": example["metadata"]["name"],
                                                            "key": sentinel["passwordKey"]}
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/instance": release}
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} == {6379, sentinel["port"]}
    validator = pytest.importorskip("kubernetes_validate",
                                    reason="kubernetes-validate is not installed (pip install kubernetes-validate)")
    version = validator.latest_version()
    for doc in [*docs, example]:
        validator.validate(doc, version, strict=True)


@pytest.mark.parametrize("unit", ["rsnotify-hub.service", "rsnotify-worker@.service"])
def test_systemd_sentinel_drop_ins(unit: str) -> None:
    from rsnotify.hub.redis_url import parse_redis_url

    base = systemd_unit(DEPLOY / "systemd" / unit)
    drop_in = systemd_unit(DEPLOY / "systemd" / f"{unit}.d" / "sentinel.conf")
    [path] = drop_in["EnvironmentFile"]
    example = DEPLOY / "systemd" / (Path(path).name + ".example")
    used = check_command(shlex.split(base["ExecStart"][0].replace("%H", "host").replace("%i", "1")))
    check_env(set(env_file(example)), used, f"{unit} drop-in via {example.name}")
    # systemd reads the unit's EnvironmentFile, then the drop-in's: the latter's lines win
    merged = {**env_file(DEPLOY / "systemd" / "rsnotify.env.example"), **env_file(example)}
    settings = sentinel_settings(merged)
    assert parse_redis_url(str(settings.redis_url)).is_sentinel and settings.sentinel_password
    assert settings.replicas_to_wait_for == 1
