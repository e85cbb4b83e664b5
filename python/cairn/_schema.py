"""JSON Schema of a tool from its function's signature, type hints and docstring."""

from __future__ import annotations

import inspect
import typing
from typing import Any, Callable, Dict, Tuple

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(hint: Any) -> Dict[str, Any]:
    if hint is inspect.Parameter.empty or hint is Any:
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is type(None):
        return {"type": "null"}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is typing.Union or (origin is not None and getattr(origin, "__name__", "") == "UnionType"):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _type_schema(options[0])
        return {"anyOf": [_type_schema(a) for a in options]}
    if hint in (list, tuple, set) or origin in (list, tuple, set, typing.List, typing.Sequence):
        schema: Dict[str, Any] = {"type": "array"}
        if args:
            schema["items"] = _type_schema(args[0])
        return schema
    if hint is dict or origin is dict:
        return {"type": "object"}
    return {}


def _docs(doc: str) -> Tuple[str, Dict[str, str]]:
    """The description (the docstring up to an ``Args:`` section) and each
    parameter's line from that section."""
    text = inspect.cleandoc(doc or "")
    params: Dict[str, str] = {}
    lines = text.splitlines()
    description = []
    in_args = False
    current = None
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if not stripped:
                current = None
                continue
            if line[:1] not in (" ", "\t") and stripped.endswith(":"):
                in_args = False
                continue
            if ":" in stripped and (line.startswith("    ") and not line.startswith("        ")):
                name, _, rest = stripped.partition(":")
                name = name.split("(")[0].strip()
                params[name] = rest.strip()
                current = name
            elif current:
                params[current] = (params[current] + " " + stripped).strip()
            continue
        description.append(line)
    return "\n".join(description).strip(), params


def schema_of(fn: Callable[..., Any]) -> Tuple[str, Dict[str, Any]]:
    """``(description, JSON schema of the arguments object)`` of ``fn``."""
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    description, param_docs = _docs(fn.__doc__ or "")
    properties: Dict[str, Any] = {}
    required = []
    for name, parameter in signature.parameters.items():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        schema = _type_schema(hints.get(name, parameter.annotation))
        if name in param_docs:
            schema["description"] = param_docs[name]
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
        else:
            try:
                import json

                json.dumps(parameter.default)
                schema["default"] = parameter.default
            except (TypeError, ValueError):
                pass
        properties[name] = schema
    schema: Dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return description, schema
