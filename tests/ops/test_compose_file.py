"""docker-compose.yml is a valid Compose Specification file that a Compose user can run:
checked against the specification's own JSON Schema (ops/compose/compose-spec.json, from
github.com/compose-spec/compose-spec), with no usable default secret, a volume for
results and checkpoints shared by every Gantry container, and Flower behind a login on
this machine only. (No Compose binary runs here: the schema is what Compose validates
the file against.)"""

from __future__ import annotations

import json
import re

import jsonschema
import yaml

from tests.worker_harness import ROOT

COMPOSE = ROOT / "docker-compose.yml"
SECRETS = ("GANTRY_SECRET_KEY", "POSTGRES_PASSWORD", "FLOWER_BASIC_AUTH", "GRAFANA_ADMIN_PASSWORD")
GANTRY_SERVICES = ("migrate", "api", "beat", "worker", "flower")


def interpolated(text: str, values: dict[str, str]) -> str:
    """Compose's variable interpolation: ${NAME}, ${NAME:-default}, ${NAME:?error}, $$."""

    def value(match: re.Match) -> str:
        name, operator, rest = match.group(1), match.group(2) or "", match.group(3) or ""
        if name in values:
            return values[name]
        if operator.endswith("?"):
            raise KeyError(f"{name}: {rest}")
        return rest if operator.endswith("-") else ""

    text = re.sub(r"\$\{(\w+)(:?[-?])?([^}]*)\}", value, text)
    return text.replace("$$", "$")


def test_the_compose_file_is_valid_and_has_no_usable_default_secret():
    raw = COMPOSE.read_text()
    schema = json.loads((ROOT / "ops" / "compose" / "compose-spec.json").read_text())
    document = yaml.safe_load(interpolated(raw, dict.fromkeys(SECRETS, "set-in-env")))
    jsonschema.Draft7Validator(schema).validate(document)
    assert "dockerfile_inline" not in raw and (ROOT / "Dockerfile").is_file()
    for name in SECRETS:  # every secret is required from .env, none has a default
        uses = re.findall(r"\$\{" + name + r"([^}]*)\}", raw)
        assert uses and all(use.startswith(":?") for use in uses), (name, uses)
    for name in SECRETS:
        try:
            interpolated(raw, {n: "x" for n in SECRETS if n != name})
        except KeyError as missing:
            assert name in str(missing)
        else:
            raise AssertionError(f"compose would start without {name}")
    assert "change-me" not in raw


def test_every_gantry_container_shares_the_results_volume_and_flower_needs_a_login():
    raw = COMPOSE.read_text()
    services = yaml.safe_load(interpolated(raw, dict.fromkeys(SECRETS, "x")))["services"]
    gantry = [name for name in services if name in GANTRY_SERVICES or name.startswith("worker")]
    assert len(gantry) >= 7
    for name in gantry:
        assert "media:/data/media" in services[name]["volumes"], name
        assert services[name]["environment"]["GANTRY_MEDIA_ROOT"] == "/data/media", name
    assert "media" in yaml.safe_load(interpolated(raw, dict.fromkeys(SECRETS, "x")))["volumes"]
    flower = services["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == "x"
    assert all(port.startswith("127.0.0.1:") for port in flower["ports"])
    assert (ROOT / ".env.example").read_text().count("=") >= len(SECRETS)
