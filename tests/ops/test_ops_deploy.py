"""deploy/ is ready to use: each file parses, and every command, option, port, path and RSNOTIFY_*
variable it uses exists in `rsnotify hub` / `rsnotify worker` (the same click commands their
--help prints) and in the hub's routes."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click
import pytest
import yaml

from rsnotify.hub.app import build_app
from rsnotify.hub.settings import HubSettings
from rsnotify.cli import main as rsnotify_main

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
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


def check_env(names: set[str], used_by: str, where: str) -> None:
    unknown = {n for n in names if n.startswith("RSNOTIFY_")} - variables(used_by)
    assert not unknown, f"{where}: rsnotify {used_by} has no variable {sorted(unknown)}"


def routes() -> set[str]:
    app = build_app(HubSettings(redis_url="redis://127.0.0.1:1/0"))
    return {r.resource.canonical for r in app.router.routes() if r.resource is not None}


DEFAULT_PORT = str(HubSettings().port)


def test_every_variable_mentioned_anywhere_exists() -> None:
    known = variables("hub") | variables("worker")
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
    for option in set(re.findall(r"`(--[a-z-]+)", readme)):
        assert any(option in p.opts for name in ("hub", "worker") for p in command(name).params), option


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    instructions = [line for line in text.replace("\\\n", " ").splitlines() if line and not line.startswith("#")]
    cmd = [i for i in instructions if i.startswith("CMD ")][-1]
    assert check_command(json.loads(cmd[4:])) == "hub"
    expose = re.search(r"^EXPOSE (\d+)", text, flags=re.MULTILINE).group(1)
    env = dict(re.findall(r"(RSNOTIFY_[A-Z_]+)=(\S+)", text))
    check_env(set(env), "hub", "Dockerfile")
    assert expose == env.get("RSNOTIFY_PORT", DEFAULT_PORT)
    health = next(i for i in instructions if i.startswith("HEALTHCHECK"))
    assert f"127.0.0.1:{expose}/health" in health and "/health" in routes()
    assert re.search(r"^USER (?!root)\S+", text, flags=re.MULTILINE), "the image must not run as root"


def test_compose() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "hub", "worker", "prometheus"} <= set(services)
    assert "--appendonly" in services["redis"]["command"] and "yes" in services["redis"]["command"]
    for name in ("hub", "worker"):
        service = services[name]
        used = check_command(service["command"])
        assert used == name
        check_env(set(service["environment"]), used, f"compose service {name}")
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


def k8s_documents() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_kubernetes() -> None:
    docs = k8s_documents()
    by_kind: dict[tuple[str, str], dict] = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = by_kind[("ConfigMap", "rsnotify-config")]["data"]
    secret = by_kind[("Secret", "rsnotify-secrets")]["stringData"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"rsnotify-hub", "rsnotify-worker"}
    for deployment in deployments:
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        [container] = spec["containers"]
        used = check_command(container["command"])
        env = set()
        for source in container.get("envFrom", []):
            assert ("ConfigMap", source["configMapRef"]["name"]) in by_kind
            env |= set(config)
        for item in container.get("env", []):
            env.add(item["name"])
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ("Secret", ref["name"]) in by_kind and ref["key"] in secret
        check_env(env, used, f"k8s {deployment['metadata']['name']}")
        if used == "hub":
            [port] = container["ports"]
            assert str(port["containerPort"]) == config["RSNOTIFY_PORT"]
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["httpGet"]["path"] == "/health" and container[probe]["httpGet"]["port"] == port["name"]
            tokens = next(i["value"] for i in container["env"] if i["name"] == "RSNOTIFY_TOKENS_FILE")
            [mount] = container["volumeMounts"]
            [volume] = spec["volumes"]
            assert volume["name"] == mount["name"]
            assert tokens == mount["mountPath"] + "/" + volume["secret"]["items"][0]["path"]
            assert volume["secret"]["items"][0]["key"] in secret
            service = by_kind[("Service", "rsnotify-hub")]
            assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    redis_url = config["RSNOTIFY_REDIS_URL"]
    assert ("Service", re.match(r"redis://([^:/]+)", redis_url).group(1)) in by_kind


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
