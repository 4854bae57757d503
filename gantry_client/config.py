"""Where the client finds the API URL and key.

Precedence, first found wins: command-line flags (--api-url, --api-key), the environment
(GANTRY_API_URL, GANTRY_API_KEY), the config file, then the default URL (no default key).

The config file is TOML, by default ~/.config/gantry/config.toml (or
$XDG_CONFIG_HOME/gantry/config.toml; GANTRY_CONFIG names another file):

    api_url = "http://127.0.0.1:8000"
    api_key = "gk_..."

`gantry configure` writes it with mode 0600, since it holds a secret.
"""

from __future__ import annotations

import json
import os
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_API_URL = "http://127.0.0.1:8000"
ENV_API_URL = "GANTRY_API_URL"
ENV_API_KEY = "GANTRY_API_KEY"
ENV_CONFIG = "GANTRY_CONFIG"
FILE_KEYS = ("api_url", "api_key")

HOW_TO_SET_KEY = (
    "Pass --api-key KEY, set the GANTRY_API_KEY environment variable, "
    "or store it with `gantry configure --api-key KEY`."
)
HOW_TO_SET_URL = (
    "Pass --api-url URL, set the GANTRY_API_URL environment variable, "
    "or store it with `gantry configure --api-url URL`."
)


class ConfigError(Exception):
    """The configuration cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Settings:
    api_url: str  # the first of api_urls
    api_key: str | None
    url_source: str  # "--api-url", "GANTRY_API_URL", a config file path, or "default"
    key_source: str | None
    # Every API host given (comma-separated): a submission that gets no answer from one
    # is resent to the next with the same Idempotency-Key.
    api_urls: tuple[str, ...] = ()


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "gantry" / "config.toml"


def normalise_url(url: str, *, source: str) -> str:
    """An http(s) base URL without a trailing slash; anything else is a ConfigError."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"The API URL from {source} must look like http://host:port, got {url!r}. "
            + HOW_TO_SET_URL
        )
    return url.rstrip("/")


def normalise_urls(value: str, *, source: str) -> tuple[str, ...]:
    """One URL or several separated by commas (API hosts), each as normalise_url."""
    parts = [part for part in value.split(",") if part.strip()] or [value]
    return tuple(dict.fromkeys(normalise_url(part, source=source) for part in parts))


def load_file(path: Path) -> dict[str, str]:
    """The settings stored in the config file; {} when there is none."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"Cannot read the config file {path}: {exc.strerror}.") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"The config file {path} is not valid TOML: {exc}.") from exc
    found = {}
    for key in FILE_KEYS:
        if key in data:
            if not isinstance(data[key], str):
                raise ConfigError(f"In {path}, {key} must be a string.")
            found[key] = data[key]
    return found


def resolve(
    *,
    api_url: str | None = None,
    api_key: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """The effective settings, each with where it came from (for error messages)."""
    env = os.environ if env is None else env
    path = config_path(env)
    stored = load_file(path)

    url, url_source = DEFAULT_API_URL, "default"
    for value, source in (
        (api_url, "--api-url"),
        (env.get(ENV_API_URL), ENV_API_URL),
        (stored.get("api_url"), str(path)),
    ):
        if value:
            url, url_source = value, source
            break

    key, key_source = None, None
    for value, source in (
        (api_key, "--api-key"),
        (env.get(ENV_API_KEY), ENV_API_KEY),
        (stored.get("api_key"), str(path)),
    ):
        if value and value.strip():
            key, key_source = value.strip(), source
            break

    urls = normalise_urls(url, source=url_source)
    return Settings(
        api_url=urls[0],
        api_key=key,
        url_source=url_source,
        key_source=key_source,
        api_urls=urls,
    )


def _toml_string(value: str) -> str:
    # A JSON string with ASCII escapes is also a valid TOML basic string.
    return json.dumps(value, ensure_ascii=True)


def write_file(path: Path, *, api_url: str | None = None, api_key: str | None = None) -> Path:
    """Store the given settings in the config file, keeping the others; mode 0600."""
    stored = load_file(path)
    if api_url is not None:
        stored["api_url"] = normalise_url(api_url, source="--api-url")
    if api_key is not None:
        stored["api_key"] = api_key.strip()
    text = "".join(f"{key} = {_toml_string(stored[key])}\n" for key in FILE_KEYS if key in stored)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written to a private temporary file first so the key is never world-readable.
    fd, tmp = tempfile.mkstemp(prefix=".config-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def mask_key(key: str | None) -> str:
    """Enough of a key to recognise it, never enough to use it."""
    if not key:
        return "(none)"
    return f"{key[:11]}…" if len(key) > 14 else "…"
