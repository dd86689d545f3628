"""Typed configuration: dataclasses with validation, YAML round trip and dotted overrides.

Every component owns a small dataclass deriving from :class:`Config`. YAML is only a serialization of those
dataclasses, so a typo in a file or on the command line fails *before* anything heavy runs, with a message
that names the offending key (``unknown key 'model.hiden' (did you mean 'hidden'?)``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Self, Union, get_args, get_origin

import yaml

from trilm.atomic import write_text


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the key and, if known, the file."""


class FileFormatError(ConfigError):
    """A file's bytes are not what its format says (truncated, damaged, absurd counts or offsets).

    The message names the file, the section or field and, where the format has them, the byte offset. It is
    a :class:`ConfigError` so every ``trilm`` command prints it as one line and exits with status 2: a bad
    input file is the user's problem to fix, not a bug to report with a traceback.
    """


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 120, 120


def shown(value: Any) -> str:
    """``repr(value)`` cut to a few levels and items: an error message quotes what it refuses, and a YAML
    file can hold a value whose full ``repr`` never ends (aliases nested to 9**8 leaves)."""
    return _SHOWN.repr(value)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML/CLI value to the annotated type, or raise ConfigError naming ``key``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {shown(value)} matches none of {tp}")
    if origin is Literal:
        choices = get_args(tp)
        if value in choices:
            return value
        raise ConfigError(f"{key}: {shown(value)} is not one of {list(choices)}")
    if isinstance(tp, type) and issubclass(tp, Config):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {shown(value)}")
        return tp.from_dict(value, prefix=f"{key}.")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {shown(value)}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {shown(value)}")
        args = get_args(tp)
        value_tp = args[1] if len(args) == 2 else Any
        return {k: _coerce(v, value_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {shown(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value.replace("_", ""))
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {shown(value)}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer of hundreds of digits
                raise ConfigError(f"{key}: {shown(value)} is beyond the range of a number") from None
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {shown(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {shown(value)}")
    if tp is Path:
        if isinstance(value, str | Path):
            return Path(value)
        raise ConfigError(f"{key}: expected a path, got {shown(value)}")
    raise ConfigError(f"{key}: unsupported annotation {_type_name(tp)}")


def _unknown_key(key: str, prefix: str, known: list[str]) -> ConfigError:
    hint = difflib.get_close_matches(key, known, n=1)
    suggestion = f" (did you mean '{prefix}{hint[0]}'?)" if hint else f" (known: {', '.join(sorted(known))})"
    return ConfigError(f"unknown key '{prefix}{key}'{suggestion}")


@dataclasses.dataclass
class Config:
    """Base of every trilm config: typed fields, ``validate()`` on construction, YAML and overrides."""

    _type_hints: typing.ClassVar[dict[str, Any]]  # per class, set by _hints()

    def __post_init__(self) -> None:
        hints = self._hints()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict) and get_origin(hints[f.name]) is not dict:
                object.__setattr__(self, f.name, _coerce(value, hints[f.name], f.name))
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` with a message naming the key when a value is inconsistent."""

    @classmethod
    def _hints(cls) -> dict[str, Any]:
        hints = cls.__dict__.get("_type_hints")
        if hints is None:  # resolving string annotations costs ~1 ms; configs are built in hot loops too
            hints = typing.get_type_hints(cls)
            cls._type_hints = hints
        return hints

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, prefix: str = "") -> Self:
        """Build from a plain mapping; unknown keys and wrong types raise with the dotted key path."""
        return cls._built(cls._coerced(data, prefix=prefix), prefix=prefix)

    @classmethod
    def _coerced(cls, data: dict[str, Any], *, prefix: str = "") -> dict[str, Any]:
        """The mapping's values as the fields' types, by field name; unknown keys and wrong types raise
        with the dotted key path."""
        if not isinstance(data, dict):
            raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: expected a mapping, got {shown(data)}")
        hints = cls._hints()
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        kwargs = {}
        for key, value in data.items():
            if key not in names:
                raise _unknown_key(str(key), prefix, names)
            kwargs[key] = _coerce(value, hints[key], f"{prefix}{key}")
        return kwargs

    @classmethod
    def _built(cls, kwargs: dict[str, Any], *, prefix: str = "") -> Self:
        """The config of typed field values (validated); a validation error's key gets ``prefix``."""
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise ConfigError(_prefixed(str(exc), prefix)) from None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Config):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

    def with_overrides(self, overrides: list[str] | tuple[str, ...]) -> Self:
        """Apply ``a.b.c=value`` overrides (value parsed as YAML) and re-validate."""
        return type(self).from_dict(apply_overrides(self.to_dict(), overrides))

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Self:
        path = Path(path)
        data = read_yaml_file(path, "config file") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
        try:
            cfg = cls.from_dict(data)
            return cfg.with_overrides(overrides) if overrides else cfg
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            write_text(path, text)
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``data`` (a config as :meth:`Config.to_dict` writes it, changed in place) with ``a.b.c=value``
    overrides set (value parsed as YAML); a key that is not in ``data`` raises, naming the closest one."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        dotted, raw = item.split("=", 1)
        parts = dotted.strip().split(".")
        node: dict[str, Any] = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if not isinstance(child, dict):
                known = [k for k, v in node.items() if isinstance(v, dict)]
                raise _unknown_key(part, ".".join(parts[:depth]) + ("." if depth else ""), known)
            node = child
        if parts[-1] not in node:
            raise _unknown_key(parts[-1], ".".join(parts[:-1]) + ("." if len(parts) > 1 else ""), list(node))
        node[parts[-1]] = _load_yaml(raw, f"override {dotted.strip()}") if raw.strip() else ""
    return data


def _load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``; anything PyYAML cannot build (bad syntax, nesting deeper than Python's
    recursion limit, an integer past Python's 4,300-digit conversion limit) is a ConfigError naming
    ``where``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: nested too deeply") from None
    except ValueError as exc:  # int() of a too long digit string
        raise ConfigError(f"{where}: invalid YAML: {exc}") from None


def read_yaml_file(path: Path, what: str = "file") -> Any:
    """The YAML content of ``path``; a missing, unreadable, non-UTF-8 or malformed file is a ConfigError
    naming it (``what`` says what was expected there: ``no such config file``)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path} line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    return _load_yaml(text, str(path))


def _prefixed(message: str, prefix: str) -> str:
    """Qualify a validation message's leading key with the parent's dotted path."""
    if not prefix or message.startswith(prefix):
        return message
    return f"{prefix}{message}"


def require(condition: bool, message: str) -> None:
    """Validation helper: ``require(heads % tp == 0, "heads: ...")`` raises ConfigError when false."""
    if not condition:
        raise ConfigError(message)


def require_directory_path(path: str | Path, key: str) -> None:
    """Refuse an output directory path that names an existing file (``key`` is the option or field)."""
    if Path(path).is_file():
        raise ConfigError(f"{key}: {path} is an existing file, not a directory")
