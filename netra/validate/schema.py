"""A small JSON-Schema subset validator for Netra's data files (contracts, locks).

Why not `jsonschema`: the H200 image carries neither jsonschema nor pydantic, and the catalog must
load there. The subset is the one our schemas use: ``type``, ``properties``, ``required``,
``additionalProperties`` (false or a schema), ``items``, ``enum``, ``const``, ``minimum``,
``maximum``, ``minItems``, ``pattern``, ``oneOf``, ``$ref`` to ``#/$defs/...``. A keyword outside the
subset in a schema is itself an error, so a schema can never silently check less than it says.
Errors name the JSON path of the offending key or value.
"""

from __future__ import annotations

import re
from typing import Any

SUPPORTED = frozenset({
    "$schema", "$id", "$defs", "title", "description", "type", "properties", "required",
    "additionalProperties", "items", "enum", "const", "minimum", "maximum", "minItems", "pattern",
    "oneOf", "$ref",
})

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


class SchemaError(ValueError):
    """A document does not satisfy its schema; the message names the path."""


def _type_ok(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False  # JSON true is not a number
    return isinstance(value, _TYPES[name])


def errors(doc: Any, schema: dict[str, Any], root: dict[str, Any] | None = None,
           path: str = "$") -> list[str]:
    """Every violation of ``schema`` by ``doc``, as ``"<path>: <problem>"`` strings."""
    root = schema if root is None else root
    unknown = set(schema) - SUPPORTED
    if unknown:
        raise ValueError(f"schema at {path} uses unsupported keywords {sorted(unknown)}")
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"schema at {path}: only #/$defs/ references are supported, got {ref!r}")
        return errors(doc, root["$defs"][ref[len("#/$defs/"):]], root, path)
    out: list[str] = []
    if "oneOf" in schema:
        passing = [i for i, sub in enumerate(schema["oneOf"]) if not errors(doc, sub, root, path)]
        if len(passing) != 1:
            out.append(f"{path}: {doc!r} must match exactly one of {len(schema['oneOf'])} forms "
                       f"(matched {len(passing)})")
        return out
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_type_ok(doc, n) for n in names):
            return [f"{path}: expected {'/'.join(names)}, got {type(doc).__name__} {doc!r}"]
    if "const" in schema and doc != schema["const"]:
        out.append(f"{path}: expected {schema['const']!r}, got {doc!r}")
    if "enum" in schema and doc not in schema["enum"]:
        out.append(f"{path}: {doc!r} not one of {schema['enum']}")
    if isinstance(doc, (int, float)) and not isinstance(doc, bool):
        if "minimum" in schema and doc < schema["minimum"]:
            out.append(f"{path}: {doc} below minimum {schema['minimum']}")
        if "maximum" in schema and doc > schema["maximum"]:
            out.append(f"{path}: {doc} above maximum {schema['maximum']}")
    if isinstance(doc, str) and "pattern" in schema and not re.fullmatch(schema["pattern"], doc):
        out.append(f"{path}: {doc!r} does not match {schema['pattern']!r}")
    if isinstance(doc, list):
        if "minItems" in schema and len(doc) < schema["minItems"]:
            out.append(f"{path}: needs at least {schema['minItems']} items, has {len(doc)}")
        if "items" in schema:
            for i, item in enumerate(doc):
                out.extend(errors(item, schema["items"], root, f"{path}[{i}]"))
    if isinstance(doc, dict):
        props: dict[str, Any] = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in doc:
                out.append(f"{path}: missing required key {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, value in doc.items():
            if key in props:
                out.extend(errors(value, props[key], root, f"{path}.{key}"))
            elif extra is False:
                out.append(f"{path}: unknown key {key!r} (known: {sorted(props)})")
            elif isinstance(extra, dict):
                out.extend(errors(value, extra, root, f"{path}.{key}"))
    return out


def check(doc: Any, schema: dict[str, Any], what: str) -> None:
    """Raise `SchemaError` naming ``what`` and every violation."""
    found = errors(doc, schema)
    if found:
        raise SchemaError(f"{what}: " + "; ".join(found))
