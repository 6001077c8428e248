"""The JSON Schemas specq can constrain output to: an allowlist, checked before a job is queued.

The worker turns a schema into a grammar with llama-cpp-python's converter
(`llama_cpp.llama_grammar.json_schema_to_gbnf`, engine/llama/grammar.py), which silently ignores what
it cannot express (`minimum`, `uniqueItems`, `not`, a `maxLength` beside a `pattern`, ...): output
"constrained" by such a schema could break it. So every keyword is checked here, in pure Python (the
API has no llama-cpp-python), and the first one the converter would not honour is refused, named
with its path. `normalise` then rewrites the checked schema into the converter's dialect (a schema of
annotations only, `{}`, means any JSON value, not the converter's "any object").
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..contracts import InputError

#: keywords that only describe (ignored by the grammar, harmless)
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly"})
#: every type JSON Schema names, and the string formats the converter writes a grammar for
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
#: keywords allowed per (sub)schema shape; anything else is refused
_OBJECT = frozenset({"type", "properties", "required", "additionalProperties"})
_ARRAY = frozenset({"type", "items", "prefixItems", "minItems", "maxItems"})
_STRING = frozenset({"type", "pattern", "format", "minLength", "maxLength"})
#: where subschemas of a schema live (checked as schemas in their own right)
_DEFS = ("$defs", "definitions")
#: the most nesting, subschemas and enum values per schema, and the largest repetition count: the
#: converter spells `maxLength: n` out as n nested optional items, so a large n is a large grammar
MAX_DEPTH = 32
MAX_NODES = 2000
MAX_ENUM = 512
MAX_REPEAT = 1000
#: a backslash escape the converter would copy raw into a JSON string (\\d, \\w and escaped punctuation are fine)
_RAW_ESCAPE = re.compile(r"\\[^dw.\-+()\[\]{}*?|^$/]")
#: a schema of annotations only (`{}`, pydantic's `Any`): any JSON value
ANY: dict[str, Any] = {"type": list(TYPES)}


class SchemaError(InputError):
    """A schema specq cannot honour exactly (the message names the keyword and where it is)."""


def check(schema: Any, what: str = "json_schema") -> None:
    """Raise SchemaError for the first invalid or unsupported part of `schema` (a JSON object)."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{what} must be a JSON Schema object, not {type(schema).__name__}")
    counter = [0]
    _values(schema, what, 0)
    _check(schema, schema, what, 0, counter)
    for key in _DEFS:
        if key in schema:
            defs = schema[key]
            if not isinstance(defs, dict):
                raise SchemaError(f"{what}.{key} must be an object of schemas")
            for name, sub in defs.items():
                _check(sub, schema, f"{what}.{key}.{name}", 1, counter)


def _values(value: Any, where: str, depth: int) -> None:
    """Every value storable and finite (no NaN, no NUL, no lone surrogate), nested at most MAX_DEPTH."""
    if depth > 2 * MAX_DEPTH:
        raise SchemaError(f"{where}: nested deeper than {MAX_DEPTH} schemas")
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"{where} holds a number that is not finite")
    if isinstance(value, str):
        _text(value, where)
    elif isinstance(value, dict):
        for k, v in value.items():
            _text(k, where)
            _values(v, where, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _values(v, where, depth + 1)


def _text(value: str, where: str) -> None:
    if "\x00" in value:
        raise SchemaError(f"{where} holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SchemaError(f"{where} holds a lone surrogate; send UTF-8 text") from None


def _check(s: Any, root: dict, where: str, depth: int, counter: list[int]) -> None:
    counter[0] += 1
    if counter[0] > MAX_NODES:
        raise SchemaError(f"json_schema has more than {MAX_NODES} subschemas")
    if depth > MAX_DEPTH:
        raise SchemaError(f"{where}: nested deeper than {MAX_DEPTH} schemas")
    if not isinstance(s, dict):
        raise SchemaError(f"{where} must be a schema object, not {type(s).__name__}")
    keys = set(s) - ANNOTATIONS - ({*_DEFS} if s is root else set())

    def only(allowed: set[str] | frozenset[str], beside: str) -> None:
        extra = sorted(keys - allowed)
        if extra:
            raise SchemaError(f"{where}: keyword {extra[0]!r} is not supported beside {beside!r} (specq's "
                              "grammar could not enforce it)")

    if "$ref" in keys:
        only({"$ref"}, "$ref")
        _ref(s["$ref"], root, where)
        return
    for union in ("anyOf", "oneOf"):
        if union in keys:
            only({union}, union)
            alts = s[union]
            if not isinstance(alts, list) or not alts:
                raise SchemaError(f"{where}.{union} must be a non-empty list of schemas")
            for i, alt in enumerate(alts):
                _check(alt, root, f"{where}.{union}[{i}]", depth + 1, counter)
            return
    t = s.get("type")
    if isinstance(t, list):
        if not t or any(x not in TYPES for x in t) or len(set(t)) != len(t):
            raise SchemaError(f"{where}.type must be one of {', '.join(TYPES)} or a list of distinct ones")
        only({"type"}, "a list of types")
        return
    if t is not None and t not in TYPES:
        raise SchemaError(f"{where}.type must be one of {', '.join(TYPES)} or a list of distinct ones")
    if "const" in keys or "enum" in keys:
        key = "const" if "const" in keys else "enum"
        only({key, "type"}, key)
        if key == "enum" and (not isinstance(s["enum"], list) or not s["enum"] or len(s["enum"]) > MAX_ENUM):
            raise SchemaError(f"{where}.enum must be a list of 1 to {MAX_ENUM} values")
        return
    unknown = sorted(keys - _OBJECT - _ARRAY - _STRING)
    if unknown:
        raise SchemaError(f"{where}: keyword {unknown[0]!r} is not supported (specq's grammar could not enforce "
                          "it; supported: type, properties, required, additionalProperties, items, prefixItems, "
                          "minItems, maxItems, enum, const, anyOf, oneOf, $ref, $defs, pattern, format, minLength, "
                          "maxLength and annotations such as title and description)")
    if keys & (_OBJECT - {"type"}):
        if t not in (None, "object"):
            raise SchemaError(f"{where}: object keywords need type object")
        only(_OBJECT, "properties")
        _object(s, root, where, depth, counter)
    elif keys & (_ARRAY - {"type"}):
        if t not in (None, "array"):
            raise SchemaError(f"{where}: array keywords need type array")
        only(_ARRAY, "items")
        _array(s, root, where, depth, counter)
    elif keys & (_STRING - {"type"}):
        if t not in (None, "string"):
            raise SchemaError(f"{where}: string keywords need type string")
        only(_STRING, "type string")
        _string(s, where)


def _object(s: dict, root: dict, where: str, depth: int, counter: list[int]) -> None:
    props = s.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError(f"{where}.properties must be an object of schemas")
    for name, sub in props.items():
        _check(sub, root, f"{where}.properties.{name}", depth + 1, counter)
    required = s.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"{where}.required must be a list of property names")
    missing = [r for r in required if r not in props]
    if missing:
        raise SchemaError(f"{where}.required names {missing[0]!r}, which is not in its properties")
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        _check(extra, root, f"{where}.additionalProperties", depth + 1, counter)
    elif extra is not None and not isinstance(extra, bool):
        raise SchemaError(f"{where}.additionalProperties must be true, false or a schema")


def _array(s: dict, root: dict, where: str, depth: int, counter: list[int]) -> None:
    if "items" in s and "prefixItems" in s:
        raise SchemaError(f"{where}: keyword 'prefixItems' is not supported beside 'items'")
    items = s.get("items", s.get("prefixItems"))
    if items is None:
        raise SchemaError(f"{where}: minItems/maxItems need items (the item schema)")
    if isinstance(items, list):
        if "minItems" in s or "maxItems" in s:
            raise SchemaError(f"{where}: keyword 'minItems'/'maxItems' is not supported beside a list of items")
        for i, sub in enumerate(items):
            _check(sub, root, f"{where}.items[{i}]", depth + 1, counter)
    else:
        if "prefixItems" in s:
            raise SchemaError(f"{where}.prefixItems must be a list of schemas")
        _check(items, root, f"{where}.items", depth + 1, counter)
    _counts(s, where, "minItems", "maxItems")


def _string(s: dict, where: str) -> None:
    shapes = [k for k in ("pattern", "format") if k in s]
    if len(shapes) > 1 or (shapes and ("minLength" in s or "maxLength" in s)):
        raise SchemaError(f"{where}: keyword {sorted(set(s) & {'format', 'minLength', 'maxLength'})[0]!r} is not "
                          f"supported beside {shapes[0]!r} (specq's grammar could not enforce both)")
    if "pattern" in s:
        p = s["pattern"]
        if not isinstance(p, str) or not p.startswith("^") or not p.endswith("$") or len(p) < 2:
            raise SchemaError(f"{where}.pattern must be a regular expression anchored with ^ and $")
        if "[^" in p or '"' in p or _RAW_ESCAPE.search(p):
            raise SchemaError(f"{where}.pattern: negated classes, quotes and escapes other than \\d \\w and escaped "
                              "punctuation are not supported (the grammar would write them raw into a JSON string)")
        try:
            re.compile(p)
        except re.error as e:
            raise SchemaError(f"{where}.pattern is not a valid regular expression: {e}") from None
    if "format" in s and s["format"] not in FORMATS:
        raise SchemaError(f"{where}: format {str(s['format'])[:40]!r} is not supported (supported: "
                          f"{', '.join(sorted(FORMATS))})")
    _counts(s, where, "minLength", "maxLength")


def _counts(s: dict, where: str, lo_key: str, hi_key: str) -> None:
    lo, hi = s.get(lo_key, 0), s.get(hi_key)
    for key, v in ((lo_key, lo), (hi_key, hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_REPEAT):
            raise SchemaError(f"{where}.{key} must be an integer in [0, {MAX_REPEAT}]")
    if hi is not None and hi < lo:
        raise SchemaError(f"{where}.{hi_key} is below {lo_key}")


def _ref(ref: Any, root: dict, where: str) -> None:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise SchemaError(f"{where}.$ref must be a reference inside the schema (#/$defs/...), not {str(ref)[:60]!r}")
    target: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(target, dict) or part not in target:
            raise SchemaError(f"{where}.$ref {ref[:80]!r} names nothing in the schema")
        target = target[part]
    if not isinstance(target, dict):
        raise SchemaError(f"{where}.$ref {ref[:80]!r} does not name a schema")


def normalise(schema: dict[str, Any]) -> dict[str, Any]:
    """A checked schema in the converter's dialect: a (sub)schema of annotations only (`{}`) becomes
    ANY, so it allows any JSON value (the converter would allow only an object, or fail)."""

    def walk(s: Any, top: bool = False) -> Any:
        if not isinstance(s, dict):
            return s
        if not set(s) - ANNOTATIONS - ({*_DEFS} if top else set()):
            out = dict(ANY)
            if top:
                out.update({k: s[k] for k in _DEFS if k in s})
            s = out
        out = {}
        for k, v in s.items():
            if k in ("properties", *_DEFS) and isinstance(v, dict):
                out[k] = {n: walk(x) for n, x in v.items()}
            elif k in ("items", "additionalProperties") and isinstance(v, dict):
                out[k] = walk(v)
            elif k in ("items", "prefixItems", "anyOf", "oneOf") and isinstance(v, list):
                out[k] = [walk(x) for x in v]
            else:
                out[k] = v
        return out

    return walk(schema, top=True)


def property_order(schema: Any) -> list[str]:
    """Property names in the order of the schema's `required` lists (first seen first): the order the
    output writes them in. Not the order of `properties`: PostgreSQL's JSONB (the job store) sorts an
    object's keys, shortest first, so a stored schema no longer says it, while arrays keep theirs (OpenAI's
    strict schemas and pydantic's list every property in `required`, in declared order)."""
    out: dict[str, None] = {}

    def walk(s: Any) -> None:
        if isinstance(s, dict):
            req = s.get("required")
            if isinstance(req, list):
                out.update((r, None) for r in req if isinstance(r, str))
            for v in s.values():
                walk(v)
        elif isinstance(s, list):
            for v in s:
                walk(v)

    walk(schema)
    return list(out)


#: the schema of `response_format: {"type": "json_object"}`: any JSON object
JSON_OBJECT: dict[str, Any] = {"type": "object"}

__all__ = ["check", "normalise", "property_order", "SchemaError", "ANY", "JSON_OBJECT", "TYPES", "FORMATS", "ANNOTATIONS",
           "MAX_DEPTH", "MAX_NODES", "MAX_ENUM", "MAX_REPEAT"]
