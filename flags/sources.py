"""Where flag values come from: defaults < config file < environment < command line.

Every resolved value keeps its provenance: ``default``, ``config:PATH``, ``env:NAME``,
``cli`` (or ``sglang:ARG`` for an imported SGLang launch command).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, TypeAdapter, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from flags.model import FLAG_SPECS, TOML_KEYS, FlagError, FlagSet, field_type

CONFIG_ENV = "CPKV_CONFIG"
"""Environment variable naming the config file when ``--config`` is not given."""
DEFAULT_CONFIG = Path("cpkv.toml")
"""The config file read when neither ``--config`` nor ``$CPKV_CONFIG`` names one."""

Layer = dict[str, tuple[Any, str]]
"""Field name to (value, provenance) for the fields one source sets."""


@dataclass(frozen=True, slots=True)
class ConfigLocation:
    """The config file in use and how it was chosen."""

    path: Path
    origin: str
    """``--config``, ``$CPKV_CONFIG`` or ``default`` (``./cpkv.toml``)."""

    @property
    def required(self) -> bool:
        """A file named explicitly must exist to be read; ``./cpkv.toml`` may be absent."""
        return self.origin != "default"


def locate_config(explicit: Path | None = None) -> ConfigLocation:
    """``--config PATH``, else ``$CPKV_CONFIG``, else ``./cpkv.toml``."""
    if explicit is not None:
        return ConfigLocation(explicit, "--config")
    from_env = os.environ.get(CONFIG_ENV)
    if from_env:
        return ConfigLocation(Path(from_env), f"${CONFIG_ENV}")
    return ConfigLocation(DEFAULT_CONFIG, "default")


def parse_config_text(text: str, path: Path) -> dict[str, Any]:
    """Validates a config file's text; returns field name to typed value.

    The file holds flat ``key = value`` lines whose keys are the CLI flags without ``--``.

    Raises:
        FlagError: bad TOML, a table, an unknown or environment-only key, or a wrong type;
            the message names the file and the key.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FlagError(f"{path}: not valid TOML: {exc}") from exc
    values = {}
    for key, value in data.items():
        name = TOML_KEYS.get(key)
        if name is None:
            raise FlagError(f"{path}: unknown key {key!r}; {_key_hint(key)}")
        values[name] = _toml_value(path, key, name, value)
    return values


def read_config(location: ConfigLocation) -> dict[str, Any] | None:
    """The validated values of the config file, or None when an optional file is absent.

    Raises:
        FlagError: the file is malformed, unreadable, or required and missing.
    """
    path = location.path
    if not path.exists():
        if location.required:
            raise FlagError(f"config file {path} (from {location.origin}) does not exist")
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FlagError(f"config file {path} cannot be read: {exc}") from exc
    return parse_config_text(text, path)


def _key_hint(key: str) -> str:
    dashed = key.replace("_", "-")
    if dashed in TOML_KEYS:
        return f"write it as {dashed!r} (the CLI flag without '--')"
    env_only = {s.field.replace("_", "-"): s.env for s in FLAG_SPECS.values() if s.env_only}
    if dashed in env_only:
        return f"it is environment-only: set {env_only[dashed]}"
    close = difflib.get_close_matches(dashed, TOML_KEYS, n=1)
    return f"did you mean {close[0]!r}?" if close else "see docs/flags.md for the keys"


def _toml_value(path: Path, key: str, name: str, value: object) -> object:
    kind = field_type(name)
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        choices = [m.value for m in kind]
        if isinstance(value, str) and value in choices:
            return kind(value)
        expected = "one of " + ", ".join(repr(c) for c in choices)
    elif kind is bool:
        if isinstance(value, bool):
            return value
        expected = "true or false"
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        expected = "an integer"
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        expected = "a number"
    elif kind is str:
        if isinstance(value, str):
            return value
        expected = "a string"
    else:
        raise RuntimeError(f"no config-file type for field {name} ({kind}); indicates a bug")
    raise FlagError(f"{path}: key {key!r} must be {expected}, got {value!r}")


class _EnvBase(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, extra="ignore")


def _env_model() -> type[BaseSettings]:
    # NOTE: built from FlagSet's fields so a new flag gets its environment variable for free.
    fields: dict[str, Any] = {
        name: (field_type(name) | None, Field(default=None, validation_alias=FLAG_SPECS[name].env))
        for name in FlagSet.model_fields
    }
    return create_model("EnvFlags", __base__=_EnvBase, **fields)


_EnvFlags = _env_model()


def read_env() -> Layer:
    """The flags set in the environment (pydantic-settings), each with ``env:NAME``.

    Raises:
        FlagError: a variable does not parse as its flag's type; the message names it.
    """
    try:
        settings = _EnvFlags()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "environment"
        raise FlagError(
            f"environment variable {name}={os.environ.get(name, '')!r}: {err['msg']}"
        ) from exc
    return {
        name: (getattr(settings, name), f"env:{FLAG_SPECS[name].env}")
        for name in settings.model_fields_set
    }


def cli_layer(overrides: Mapping[str, object], source: str = "cli") -> Layer:
    """Validates command-line values given by field name or flag name (``attn-cp-size``).

    Strings are parsed as the flag's type (``"8"``, ``"true"``, ``"round-robin-split"``).

    Raises:
        FlagError: an unknown or environment-only flag, or a value of the wrong type.
    """
    layer: Layer = {}
    for key, raw in overrides.items():
        name = TOML_KEYS.get(key.removeprefix("--"), key)
        spec = FLAG_SPECS.get(name)
        if spec is None:
            raise FlagError(f"unknown flag {key!r}; {_key_hint(key.removeprefix('--'))}")
        if spec.env_only:
            raise FlagError(f"{name} is environment-only: set {spec.env}")
        try:
            value = TypeAdapter(field_type(name)).validate_python(raw)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"]
            raise FlagError(f"{spec.cli}: {msg}, got {raw!r}") from exc
        layer[name] = (value, source)
    return layer


def parse_set_option(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` (``--set attn-cp-size=8``) to its key and raw value."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise FlagError(f"--set takes KEY=VALUE (e.g. attn-cp-size=8), got {item!r}")
    return key.strip(), value.strip()


@dataclass(frozen=True, slots=True)
class ResolvedFlags:
    """A flag set and, for every field, the source its value came from."""

    flags: FlagSet
    sources: dict[str, str]
    """Field name to ``default``, ``config:PATH``, ``env:NAME``, ``cli`` or ``sglang:ARG``."""
    config: ConfigLocation | None = None
    """The config file consulted; None when none was (an SGLang import)."""
    config_found: bool = False
    """True when the config file existed and was read."""
    notes: tuple[str, ...] = field(default=())
    """What a person should know about how values were derived."""


def merge_layers(*layers: Layer) -> tuple[FlagSet, dict[str, str]]:
    """Defaults overlaid by ``layers`` in order; a later layer wins."""
    values: dict[str, Any] = {name: info.default for name, info in FlagSet.model_fields.items()}
    sources = dict.fromkeys(values, "default")
    for layer in layers:
        for name, (value, source) in layer.items():
            values[name] = value
            sources[name] = source
    return FlagSet.model_validate(values), sources


def file_layer(values: Mapping[str, object] | None, path: Path) -> Layer:
    """Config-file values (from :func:`parse_config_text`) with ``config:PATH`` provenance."""
    return {name: (value, f"config:{path}") for name, value in (values or {}).items()}


def resolve_flags(
    config: Path | None = None, cli: Mapping[str, object] | None = None
) -> ResolvedFlags:
    """The flag set from defaults < config file < environment < ``cli``, with provenance.

    Args:
        config: ``--config PATH``; else ``$CPKV_CONFIG``, else ``./cpkv.toml`` (optional).
        cli: command-line values by field or flag name.

    Raises:
        FlagError: a malformed config file, environment variable or command-line value.
    """
    location = locate_config(config)
    file_values = read_config(location)
    flags, sources = merge_layers(
        file_layer(file_values, location.path), read_env(), cli_layer(cli or {})
    )
    return ResolvedFlags(flags, sources, location, file_values is not None)
