"""docker/: the compose file's structure and the Dockerfile, checked without a Docker engine.

No engine runs here, so these tests read the files: the services and their images, the KRaft
quorum of the three Kafka nodes, published ports, dependencies, and that every ``PURGATORY_*``
variable names a real setting (a typo would be silently ignored by the container).
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from purgatory.settings import CONFIG_FILE_ENV, Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = ROOT / "docker"
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
KAFKA_NODES = ("kafka-1", "kafka-2", "kafka-3")
SERVICE = "purgatory"
SERVICE_PORT = 8080
ENV_PREFIX = "PURGATORY_"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


@pytest.fixture
def no_purgatory_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``PURGATORY_*`` variable of the user's (an exported ``PURGATORY_KAFKA_BOOTSTRAP``
    beats a TOML file) while a test loads the files' settings as a container would."""
    for name in list(os.environ):
        if name.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services = compose["services"]
    assert isinstance(services, dict)
    return services


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the "KEY=value" list form
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _depends(service: dict[str, Any]) -> set[str]:
    depends = service.get("depends_on", {})
    return set(depends) if isinstance(depends, list | dict) else set()


def _field_for(env_name: str) -> str:
    """The settings path an environment variable sets, or raise naming the unknown part.

    Mirrors pydantic-settings: strip the prefix, split on ``__``, case-insensitive; a ``dict``
    field (``purgatories``) takes any key and continues into its value's model.
    """
    parts = env_name.removeprefix(ENV_PREFIX).lower().split("__")
    model: type[BaseModel] | None = Settings
    path: list[str] = []
    expect_key = False
    for part in parts:
        if expect_key:
            path.append(part)
            expect_key = False
            continue
        if model is None or part not in model.model_fields:
            raise KeyError(f"{env_name}: no setting {'.'.join([*path, part])!r}")
        path.append(part)
        annotation = model.model_fields[part].annotation
        model, expect_key = _nested(annotation)
    return ".".join(path)


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(model to descend into, whether a free-form dict key comes first) for a field's type."""
    origin = getattr(annotation, "__origin__", None)
    args = getattr(annotation, "__args__", ())
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], True
    for arg in args:  # X | None
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, False
    return None, False


# -- services -----------------------------------------------------------------------------------


def test_compose_has_three_kafka_nodes_the_service_and_spark(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for node in KAFKA_NODES:
        assert str(services[node]["image"]).startswith("apache/kafka:"), f"{node}: official Apache image"
    assert SERVICE in services
    spark = [name for name, s in services.items() if str(s.get("image", "")).startswith("apache/spark:")]
    assert {"spark-master", "spark-worker"} <= set(spark), f"Spark master and worker, got {spark}"


def test_spark_image_matches_the_pinned_pyspark_version(compose: dict[str, Any]) -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pinned = next(
        dep.split("==")[1]
        for dep in pyproject["project"]["optional-dependencies"]["spark"]
        if "pyspark==" in dep
    )
    image = _services(compose)["spark-master"]["image"]
    assert image == f"apache/spark:{pinned}", "the driver's pyspark and the cluster's Spark must match"


def test_kafka_nodes_form_one_kraft_quorum(compose: dict[str, Any]) -> None:
    services = _services(compose)
    envs = {node: _env(services[node]) for node in KAFKA_NODES}
    ids = {node: int(env["KAFKA_NODE_ID"]) for node, env in envs.items()}
    assert sorted(ids.values()) == [1, 2, 3], "unique node ids"
    assert len({env["CLUSTER_ID"] for env in envs.values()}) == 1, "one cluster id for every node"
    voters = {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in envs.values()}
    assert len(voters) == 1, "every node names the same quorum"
    quorum = dict(re.fullmatch(r"(\d+)@([\w.-]+):(\d+)", v).groups()[:2] for v in voters.pop().split(","))  # type: ignore[union-attr]
    controllers = {
        node for node, env in envs.items() if "controller" in env["KAFKA_PROCESS_ROLES"].split(",")
    }
    assert {int(i) for i in quorum} == {ids[node] for node in controllers}, "voters are the controller nodes"
    for voter_id, host in quorum.items():
        assert host in services and ids.get(host) == int(voter_id), f"voter {voter_id}@{host} is that node"
    assert len(controllers) % 2 == 1 and len(controllers) >= 3, "an odd quorum that survives one node down"
    for node, env in envs.items():
        assert "broker" in env["KAFKA_PROCESS_ROLES"], f"{node} is a broker"


def test_kafka_replication_is_three_with_two_in_sync(compose: dict[str, Any]) -> None:
    for node in KAFKA_NODES:
        env = _env(_services(compose)[node])
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"


def test_kafka_listeners_are_declared_mapped_and_advertised_per_node(compose: dict[str, Any]) -> None:
    for node in KAFKA_NODES:
        env = _env(_services(compose)[node])
        listeners = {item.split("://")[0] for item in env["KAFKA_LISTENERS"].split(",")}
        protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert listeners <= set(protocols), f"{node}: every listener has a security protocol"
        advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
        assert set(advertised) <= listeners
        assert advertised[env["KAFKA_INTER_BROKER_LISTENER_NAME"]].startswith(f"{node}:"), (
            f"{node} advertises its own compose hostname to the other brokers"
        )
        assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners


# -- ports and dependencies --------------------------------------------------------------------


def _published(compose: dict[str, Any]) -> list[tuple[str, str, int, int]]:
    out = []
    for name, service in _services(compose).items():
        for port in service.get("ports", []):
            ip, host, container = str(port).split(":")
            out.append((name, ip, int(host), int(container)))
    return out


def test_published_ports_bind_loopback_and_do_not_collide(compose: dict[str, Any]) -> None:
    published = _published(compose)
    assert published, "the compose file publishes ports"
    assert all(ip == "127.0.0.1" for _, ip, _, _ in published), published
    host_ports = [host for _, _, host, _ in published]
    assert len(host_ports) == len(set(host_ports)), f"host port published twice: {sorted(host_ports)}"


def test_service_publishes_its_http_port_and_kafka_its_host_listeners(compose: dict[str, Any]) -> None:
    published = _published(compose)
    assert (SERVICE, "127.0.0.1", SERVICE_PORT, SERVICE_PORT) in published
    services = _services(compose)
    for node in KAFKA_NODES:
        advertised = dict(
            item.split("://") for item in _env(services[node])["KAFKA_ADVERTISED_LISTENERS"].split(",")
        )
        host_port = next(host for name, _, host, _ in published if name == node)
        assert f"127.0.0.1:{host_port}" in advertised.values(), f"{node} advertises its published port"


def test_dependencies_exist_and_the_service_starts_after_every_broker(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name, service in services.items():
        missing = _depends(service) - set(services)
        assert not missing, f"{name} depends on unknown services {missing}"

    def closure(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        assert name not in seen, f"dependency cycle through {name}"
        out: set[str] = set()
        for dep in _depends(services[name]):
            out |= {dep} | closure(dep, seen | {name})
        return out

    assert set(KAFKA_NODES) <= closure(SERVICE)
    assert {"spark-master", "spark-worker"} <= closure("pipeline")


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in _services(compose).items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} mounts undeclared volume {source}"
            else:
                assert (DOCKER_DIR / source).resolve().exists(), f"{name} mounts missing {source}"


def test_build_contexts_and_dockerfiles_exist(compose: dict[str, Any]) -> None:
    for name, service in _services(compose).items():
        build = service.get("build")
        if build is None:
            continue
        context = (DOCKER_DIR / build["context"]).resolve()
        assert context == ROOT, f"{name} builds from the repository root"
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file()
        stages = re.findall(r"^FROM \S+ AS (\w+)$", dockerfile.read_text(encoding="utf-8"), re.M)
        assert build["target"] in stages, f"{name} builds target {build['target']}, stages {stages}"


# -- settings -----------------------------------------------------------------------------------


def test_every_purgatory_variable_names_an_existing_setting(compose: dict[str, Any]) -> None:
    names = [
        name
        for service in _services(compose).values()
        for name in _env(service)
        if name.startswith(ENV_PREFIX) and name != CONFIG_FILE_ENV
    ]
    assert "PURGATORY_KAFKA__BOOTSTRAP_SERVERS" in names
    for name in names:
        _field_for(name)  # raises KeyError naming the unknown setting


def test_field_mapping_refuses_a_misspelt_variable() -> None:
    assert _field_for("PURGATORY_KAFKA__BOOTSTRAP_SERVERS") == "kafka.bootstrap_servers"
    assert _field_for("PURGATORY_PURGATORIES__FETCH__MAX_PENDING") == "purgatories.fetch.max_pending"
    with pytest.raises(KeyError, match=r"kafka\.bootstrap_server"):
        _field_for("PURGATORY_KAFKA__BOOTSTRAP_SERVER")
    with pytest.raises(KeyError, match=r"timer\.tick"):
        _field_for("PURGATORY_TIMER__TICK")


@pytest.mark.parametrize("service_name", [SERVICE, "pipeline"])
def test_service_environment_loads_as_settings(
    compose: dict[str, Any],
    service_name: str,
    monkeypatch: pytest.MonkeyPatch,
    no_purgatory_environment: None,
) -> None:
    """The container's environment plus its mounted TOML file load, and the variables win."""
    service = _services(compose)[service_name]
    mounts = dict(str(v).split(":")[:2][::-1] for v in service["volumes"])
    env = _env(service)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(CONFIG_FILE_ENV, str((DOCKER_DIR / mounts[env[CONFIG_FILE_ENV]]).resolve()))
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == env["PURGATORY_KAFKA__BOOTSTRAP_SERVERS"]
    hosts = {server.split(":")[0] for server in settings.kafka.bootstrap_servers.split(",")}
    assert hosts == set(KAFKA_NODES), "bootstraps through every compose Kafka node"
    internal = {int(server.split(":")[1]) for server in settings.kafka.bootstrap_servers.split(",")}
    kafka_env = _env(_services(compose)["kafka-1"])
    advertised = dict(item.split("://") for item in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert internal == {int(advertised[kafka_env["KAFKA_INTER_BROKER_LISTENER_NAME"]].split(":")[1])}


def test_docker_toml_points_at_the_compose_brokers(no_purgatory_environment: None) -> None:
    settings = load_settings(ROOT / "config" / "docker.toml")
    assert settings.kafka.bootstrap_servers == ",".join(f"{node}:19092" for node in KAFKA_NODES)


# -- Dockerfile ---------------------------------------------------------------------------------


def _stage(name: str) -> str:
    text = DOCKERFILE.read_text(encoding="utf-8")
    match = re.search(rf"^FROM \S+ AS {name}$(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    assert match, f"Dockerfile has a stage {name}"
    return match.group(1)


def test_dockerfile_base_is_python_311_slim() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    assert text.rstrip().splitlines()[-1].startswith("CMD"), "the service stage is last (default target)"


def test_dockerfile_service_installs_the_extras_and_runs_unprivileged() -> None:
    stage = _stage("service")
    assert "[kafka,metrics,service]" in stage
    users = re.findall(r"^USER (\S+)$", stage, re.M)
    assert users and users[-1] not in ("root", "0"), "the service runs as a non-root user"
    assert f"EXPOSE {SERVICE_PORT}" in stage


def test_dockerfile_healthcheck_probes_healthz_on_the_service_port() -> None:
    stage = _stage("service")
    healthcheck = re.search(r"^HEALTHCHECK .*?(?=^\S)", stage, re.M | re.S)
    assert healthcheck, "a HEALTHCHECK instruction"
    assert f"127.0.0.1:{SERVICE_PORT}/healthz" in healthcheck.group(0)


def test_dockerfile_command_names_an_importable_app_factory() -> None:
    cmd = re.findall(r"^CMD (\[.*\])$", _stage("service"), re.M)[-1]
    args = yaml.safe_load(cmd)  # JSON exec form
    assert args[0] == "uvicorn" and "--factory" in args
    module, _, attr = next(a for a in args if ":" in a and not a.startswith("-")).partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    assert args[args.index("--port") + 1] == str(SERVICE_PORT)


def test_three_service_instances_share_one_ownership_group(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scale-out (docs/design.md §7): one group; each instance advertises the URL of its published port."""
    services = _services(compose)
    instances = [name for name in services if name == SERVICE or name.startswith(f"{SERVICE}-")]
    assert len(instances) == 3, f"three instances of the service, got {instances}"
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    groups, urls = set(), set()
    for name in instances:
        env = _env(services[name])
        with monkeypatch.context() as scoped:
            for key, value in env.items():
                if key != CONFIG_FILE_ENV:
                    scoped.setenv(key, value)
            settings = load_settings()
        scaleout = settings.scaleout
        assert scaleout.enabled and scaleout.topics == ("orders",), f"{name} splits the demo topic"
        groups.add(scaleout.group_id)
        urls.add(scaleout.advertised_url)
        (host_port,) = [host for svc, _, host, _ in _published(compose) if svc == name]
        assert scaleout.advertised_url == f"http://127.0.0.1:{host_port}", (
            f"{name} advertises its published port"
        )
        assert "purgatory.adapters.service.serve" in services[name]["command"], (
            "leaves the group before draining"
        )
    assert len(groups) == 1, "one ownership group"
    assert len(urls) == 3, "distinct advertised URLs"
    init = " ".join(services["kafka-init"]["command"])
    assert "orders" in init, "the split topic is created by kafka-init"


# -- issue 13: one Kafka version, Spark healthchecks, no private module in the Dockerfile -------


def test_compose_kafka_is_the_version_kafka_up_starts(compose: dict[str, Any]) -> None:
    from purgatory.adapters.kafka import DEFAULT_KAFKA_VERSION

    for node in KAFKA_NODES:
        assert _services(compose)[node]["image"] == f"apache/kafka:{DEFAULT_KAFKA_VERSION}"


def test_spark_services_have_healthchecks_and_the_pipeline_waits_for_them(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in ("spark-master", "spark-worker"):
        test = services[name].get("healthcheck", {}).get("test")
        assert test, f"{name} has a healthcheck"
    for name in ("spark-master", "spark-worker"):
        assert services["pipeline"]["depends_on"][name] == {"condition": "service_healthy"}
    assert services["spark-worker"]["depends_on"]["spark-master"] == {"condition": "service_healthy"}


def test_dockerfile_calls_only_public_commands_and_modules() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    private = re.findall(r"purgatory(?:\.\w+)*\._\w+", text)
    assert private == [], f"the Dockerfile reaches into private modules: {private}"
    assert "purgatory analyze --resolve-jars" in text


def test_analyze_offers_the_jar_resolution_the_dockerfile_runs() -> None:
    from typer.testing import CliRunner

    from purgatory.cli import app

    result = CliRunner().invoke(app, ["analyze", "--help"])
    assert "--resolve-jars" in result.output
