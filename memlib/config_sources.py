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
    if not path.is_file():
        raise ConfigError(f"config file {path} is a directory, not a file: name the TOML or YAML file itself")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    text = _decode(raw, path)
    try:
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file must be .toml, .yaml or .yml: {path}")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot parse config file {path}: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must contain a mapping at top level")
    return data


_BOMS = ((b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe\x00\x00", "UTF-32"), (b"\xfe\xff", "UTF-16"),
         (b"\xff\xfe", "UTF-16"))


def _decode(raw: bytes, path: Path) -> str:
    """The file's text (UTF-8, a BOM allowed), or a one-line error naming its encoding."""
    for bom, name in _BOMS:
        if raw.startswith(bom):
            raise ConfigError(f"config file {path} is {name} (byte order mark); memlib reads UTF-8: convert it, "
                              f"e.g. iconv -f {name} -t UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        hint = " (UTF-16 without a byte order mark?)" if b"\x00" in raw else ""
        raise ConfigError(f"config file {path} is not UTF-8 text: invalid byte at position {exc.start}{hint}") from None


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
