"""Turn plain mappings (from YAML, JSON or ``--set``) into validated attrs objects.

Errors name the dotted key, the file and line when known, and the closest valid key::

    ConfigError: unknown key 'rollout.temprature' (quickstart.yaml:12); did you mean 'temperature'?

Validators on attrs fields raise ``ValueError`` with a short reason ("must be in (0, 1]");
:func:`structure` adds the key and location. Use :func:`check` to build such validators.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import yaml

from agentrl_core.errors import ConfigError

# Numbers in exponent form without a dot (``3e-4``), which YAML 1.1 leaves as strings.
_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

Marks = Mapping[str, str]  # dotted path -> "file:line"

EXTRA_SECTIONS = "__extra_sections__"  # class attribute: name of a dict field that takes unknown keys


def check(predicate: Callable[[Any], bool], reason: str) -> Callable[[Any, attrs.Attribute, Any], None]:
    """An attrs validator: ``field(validator=check(lambda v: v > 0, "must be > 0"))``."""

    def validator(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None and not predicate(value):
            raise ValueError(f"{reason}, got {value!r}")

    return validator


def in_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False):
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi}")

    def ok(v: float) -> bool:
        below = lo is not None and (v <= lo if lo_open else v < lo)
        above = hi is not None and (v >= hi if hi_open else v > hi)
        return not (below or above)

    return check(ok, "must be " + " and ".join(parts))


def where(path: str, marks: Marks | None) -> str:
    if not marks:
        return ""
    key = path
    while key:
        if key in marks:
            return f" ({marks[key]})"
        key = key.rpartition(".")[0]
    return f" ({marks['']})" if "" in marks else ""


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def structure(cls: type, data: Any, *, path: str = "", marks: Marks | None = None) -> Any:
    """Build an instance of attrs class ``cls`` from ``data``, or raise ConfigError."""
    return _convert(cls, data, path, marks)


def _convert(tp: Any, value: Any, path: str, marks: Marks | None) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if attrs.has(tp):
        return _structure_attrs(tp, value, path, marks)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path, marks)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        names = " or ".join(_type_name(a) for a in args)
        raise ConfigError(f"{path or 'config'}{where(path, marks)} must be {names}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{path}{where(path, marks)} must be one of {', '.join(repr(a) for a in args)}, got {value!r}{hint}"
            )
        return value
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}{where(path, marks)} must be a list, got {value!r}")
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, _join(path, i), marks) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin in (dict, typing.Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}{where(path, marks)} must be a mapping, got {value!r}")
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _convert(val_tp, v, _join(path, str(k)), marks) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}{where(path, marks)} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}{where(path, marks)} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
            # YAML 1.1 (PyYAML) reads ``1e-6`` without a dot as a string; everyone writes it.
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}{where(path, marks)} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}{where(path, marks)} must be a string, got {value!r}")
        return value
    if tp is type(None):
        if value is not None:
            raise ConfigError(f"{path}{where(path, marks)} must be null, got {value!r}")
        return None
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{path}{where(path, marks)}: unsupported config type {tp!r}")


def _structure_attrs(cls: type, value: Any, path: str, marks: Marks | None) -> Any:
    if isinstance(value, cls):
        return value
    if value is None:
        value = {}
    shorthand = getattr(cls, "__shorthand__", None)
    if isinstance(value, str) and shorthand:
        value = {shorthand: value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path or 'config'}{where(path, marks)} must be a mapping, got {value!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in attrs.fields(cls)}
    public = {f.alias or f.name: f for f in fields.values() if f.init}
    extra_name = getattr(cls, EXTRA_SECTIONS, None)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, item in value.items():
        key = str(key)
        sub = _join(path, key)
        if key in public and key != extra_name:
            kwargs[key] = _convert(hints[public[key].name], item, sub, marks)
        elif extra_name is not None:
            extra[key] = item
        else:
            valid = [k for k in public if k != extra_name]
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(valid))}"
            raise ConfigError(f"unknown key {sub!r}{where(sub, marks)}{hint}")
    if extra_name is not None:
        kwargs[extra_name] = extra
    missing = [name for name, f in public.items() if f.default is attrs.NOTHING and name not in kwargs]
    if missing:
        sub = _join(path, missing[0])
        raise ConfigError(f"missing required key {sub!r}{where(path, marks)}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        name = _failing_field(cls, kwargs, exc)
        sub = _join(path, name) if name else (path or "config")
        raise ConfigError(f"{sub}{where(sub, marks)}: {exc}") from None


def _failing_field(cls: type, kwargs: Mapping[str, Any], exc: Exception) -> str | None:
    """Find which field's validator rejected the value, to name the key in the error."""
    for f in attrs.fields(cls):
        if f.validator is None or (f.alias or f.name) not in kwargs:
            continue
        try:
            f.validator(None, f, kwargs[f.alias or f.name])
        except (ValueError, TypeError):
            return f.alias or f.name
        except Exception:  # validators that need the instance
            continue
    return None


# ---------------------------------------------------------------------------------------
# YAML with line numbers


def load_yaml(text: str, source: str = "<string>") -> tuple[Any, dict[str, str]]:
    """Parse YAML and return ``(data, marks)`` where marks map dotted keys to "file:line"."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    marks: dict[str, str] = {}
    if node is None:
        return {}, marks
    loader = yaml.SafeLoader("")
    try:
        data = _construct(loader, node, "", marks, source)
    finally:
        loader.dispose()
    return data, marks


def _construct(loader: yaml.SafeLoader, node: yaml.Node, path: str, marks: dict[str, str], source: str) -> Any:
    marks[path] = f"{source}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in out:
                sub = _join(path, str(key))
                raise ConfigError(f"duplicate key {sub!r} ({source}:{key_node.start_mark.line + 1})")
            out[key] = _construct(loader, value_node, _join(path, str(key)), marks, source)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, _join(path, i), marks, source) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``--set key.sub=value`` (value parsed as YAML) to a nested dict in place."""
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r} must look like key.sub=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML ({exc})") from None
    target: Any = data
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if isinstance(target, list):
            target = _list_item(target, part, ".".join(parts[: i + 1]))
            continue
        nxt = target.get(part)
        if isinstance(nxt, str):  # shorthand like `sampler: cross` being extended
            nxt = None
        if nxt is None:
            nxt = target[part] = {}
        target = nxt
    last = parts[-1]
    if isinstance(target, list):
        idx = int(last) if last.isdigit() else None
        if idx is None or idx >= len(target):
            raise ConfigError(f"--set {assignment!r}: {key!r} does not name an item of the list")
        target[idx] = value
    else:
        target[last] = value


def _list_item(items: list, part: str, key: str) -> Any:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"--set: {key!r} does not name an item of the list (use an index such as tasks.0.weight)")
    return items[int(part)]
