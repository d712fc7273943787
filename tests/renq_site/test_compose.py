"""docker/docker-compose.yml, checked without a Docker engine: against the Compose
Specification schema (vendored in docker/compose-spec.json), by docker-compose's own `config`
where that client is installed, and for what running renq needs."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

import jsonschema
import pytest
import yaml

from .helpers import ROOT

COMPOSE_FILE = ROOT / "docker" / "docker-compose.yml"
SCHEMA_FILE = ROOT / "docker" / "compose-spec.json"
REQUIRED_SECRETS = {
    "DJANGO_SECRET_KEY": "not-a-real-secret",
    "POSTGRES_PASSWORD": "pg-password",
    "RABBITMQ_PASSWORD": "mq-password",
    "REDIS_PASSWORD": "redis-password",
    "FLOWER_BASIC_AUTH": "admin:flower-password",
}
GPU_SERVICE_KINDS = ("embedding", "reranker", "llm")
IO_QUEUES = {"io.realtime", "io.api", "io.batch", "io.offline"}
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASS$|API_KEY|BASIC_AUTH|TOKEN")
# "${VAR}", "${VAR:?message}" or "${VAR:-}": a reference, never a value (no default but empty).
REFERENCE = re.compile(r"^\$\{[A-Z0-9_]+(:\?[^}]*|:-)?\}$")
URL_PASSWORD = re.compile(r"://[^:/@\s]*:(\$\{[^}]*\}|[^@\s]*)@")


def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose_cli() -> list[str] | None:
    """docker-compose (v1, Debian's package) or the `docker compose` plugin; neither needs a
    running engine for `config`."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def argv(service: dict) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else list(command)


def option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def workers() -> dict[str, list[str]]:
    """Celery worker services and their command lines."""
    return {
        name: argv(service)
        for name, service in compose()["services"].items()
        if argv(service)[:4] == ["celery", "-A", "renq_site", "worker"]
    }


def test_compose_file_matches_the_compose_specification():
    schema = json.loads(SCHEMA_FILE.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []


def test_the_schema_check_catches_mistakes():
    schema = json.loads(SCHEMA_FILE.read_text())
    broken = compose()
    broken["services"]["web"]["healthcheck"]["tset"] = ["CMD", "true"]
    broken["services"]["worker-io"]["depends_on"] = {"migrate": {"condition": "done"}}
    assert len(list(jsonschema.Draft201909Validator(schema).iter_errors(broken))) == 2


def test_docker_compose_config_accepts_the_file_and_requires_every_secret():
    cli = compose_cli()
    if cli is None:
        pytest.skip("no docker-compose / `docker compose` client (make test installs it via apt)")
    command = [*cli, "-f", str(COMPOSE_FILE), "config", "-q"]
    base_env = {k: v for k, v in os.environ.items() if k not in REQUIRED_SECRETS}
    ok = subprocess.run(command, env={**base_env, **REQUIRED_SECRETS}, capture_output=True)
    assert ok.returncode == 0, ok.stderr.decode()
    for secret in REQUIRED_SECRETS:
        env = {**base_env, **{k: v for k, v in REQUIRED_SECRETS.items() if k != secret}}
        refused = subprocess.run(command, env=env, capture_output=True, text=True)
        assert refused.returncode != 0 and secret in refused.stderr, (secret, refused.stderr)


def test_every_gpu_worker_consumes_its_tier_queues():
    gpu_workers = {}
    for name, args in workers().items():
        queues = set(option(args, "-Q").split(","))
        kinds = [k for k in GPU_SERVICE_KINDS if f"{k}.realtime" in queues]
        if kinds:
            gpu_workers[name] = kinds
            for kind in kinds:
                tiers = {f"{kind}.{tier}" for tier in ("realtime", "api", "batch", "offline")}
                assert tiers <= queues, name
    served = {kind for kinds in gpu_workers.values() for kind in kinds}
    assert served == set(GPU_SERVICE_KINDS)


def test_io_worker_is_a_thread_pool_on_the_io_queues():
    io = [args for args in workers().values() if set(option(args, "-Q").split(",")) == IO_QUEUES]
    assert len(io) == 1
    assert option(io[0], "--pool") == "threads"


def test_exactly_one_worker_runs_beat_and_it_serves_renq_control():
    beat = [args for args in workers().values() if "-B" in args or "--beat" in args]
    assert len(beat) == 1
    assert option(beat[0], "-Q") == "renq.control"
    # A slow sweep must not hold back the every-second aging and expiry runs.
    assert option(beat[0], "--pool") == "threads"


def test_web_and_every_worker_have_healthchecks():
    services = compose()["services"]
    assert "/readyz" in " ".join(services["web"]["healthcheck"]["test"])
    for name, args in workers().items():
        worker_name = option(args, "-n").split("@")[0]
        check = " ".join(services[name]["healthcheck"]["test"])
        # Ready = answers, consumes its queues and its models are loaded (renq_probe).
        assert "python manage.py renq_probe worker" in check, name
        # $$ is compose's escape for a literal $: the container's shell expands $HOSTNAME.
        assert f"--name {worker_name}@$$HOSTNAME" in check, name


def test_secrets_are_only_references_to_the_environment():
    text = COMPOSE_FILE.read_text()
    for leak in ("guest:guest", "FLOWER_UNAUTHENTICATED_API", "renq-dev-only", "--basic-auth="):
        assert leak not in text
    for name, service in compose()["services"].items():
        environment = service.get("environment") or {}
        assert isinstance(environment, dict), f"{name}: use the mapping form of environment"
        for key, value in environment.items():
            value = str(value)
            if SECRET_NAME.search(key):
                assert REFERENCE.match(value), f"{name}.{key} = {value!r}"
            for password in URL_PASSWORD.findall(value):
                assert REFERENCE.match(password), f"{name}.{key} has an inline password"
        for arg in argv(service):
            for password in URL_PASSWORD.findall(arg):
                assert REFERENCE.match(password), f"{name}: inline password in its command"


def test_flower_is_behind_basic_auth():
    flower = compose()["services"]["flower"]
    assert REFERENCE.match(flower["environment"]["FLOWER_BASIC_AUTH"])
    assert "flower" in argv(flower)


def test_gpu_variants_reserve_an_nvidia_gpu():
    services = compose()["services"]
    gpu_variants = {
        name: service
        for name, service in services.items()
        if service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    }
    assert gpu_variants, "no service reserves a GPU"
    for name, service in gpu_variants.items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), name
        assert name in workers(), f"{name} is not a Celery worker"


@pytest.mark.django_db
def test_migrate_service_loads_services_but_not_the_public_demo_key(monkeypatch):
    from django.core.management import call_command

    from inference.models import ApiKey, Service, Tenant

    text = COMPOSE_FILE.read_text()
    assert "DEMO_API_KEY" not in text and "demo_tenant" not in text
    steps = []
    for service in compose()["services"].values():
        for arg in argv(service):
            steps += [
                shlex.split(step)
                for step in arg.split("&&")
                if "loaddata" in step or "renq_config" in step
            ]
    assert steps, "nothing loads the services"
    # Run the compose file's own loading command(s) against the test database.
    monkeypatch.chdir(ROOT)
    for step in steps:
        assert step[:2] == ["python", "manage.py"]
        call_command(*step[2:], verbosity=0)
    assert not ApiKey.objects.exists()
    assert not Tenant.objects.exists()
    assert Service.objects.count() == 3
