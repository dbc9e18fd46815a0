"""Where configuration values come from before validation: a TOML or YAML file, ``MEMLIB__``
environment variables and ``section.key=value`` overrides, merged into one nested mapping
that :func:`memlib.config.load_config` validates."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    pass


ENV_PREFIX = "MEMLIB__"


def read_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file must be .toml, .yaml or .yml: {path}")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot parse config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must contain a mapping at top level")
    return data


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = [k for k in dotted.split(".") if k]
    if not keys:
        raise ConfigError(f"empty override key in {dotted!r}")
    cur = data
    for k in keys[:-1]:
        nxt = cur.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted!r}: {k!r} is not a section")
        cur = nxt
    cur[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``"section.key=value"`` -> (key path, YAML-typed value)."""
    if "=" not in item:
        raise ConfigError(f"override must look like section.key=value, got {item!r}")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def env_overrides(environ: dict[str, str]) -> list[str]:
    """``MEMLIB__LLM__BASE_URL=x`` -> ``["llm.base_url=x"]``."""
    out = []
    for name, value in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            path = ".".join(p.lower() for p in name[len(ENV_PREFIX):].split("__"))
            out.append(f"{path}={value}")
    return out
