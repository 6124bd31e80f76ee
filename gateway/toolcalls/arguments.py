"""A forced tool call's arguments, synthesized from the tool's JSON schema.

Knows: how to make a value that satisfies a JSON schema's common keywords (`type`,
`properties` with `required`, `items` / `prefixItems` with `minItems` / `maxItems`, `enum`
and `const` (their first value), `anyOf` / `oneOf` (the first non-null option), `allOf`
(merged), local `$ref` (`#/$defs/...`, `#/definitions/...`), numeric bounds and
`multipleOf`, string `minLength` / `maxLength` and the usual `format`s); not `pattern`,
`not`, `if` / `then` or `dependentRequired`. Only required properties are written. Nesting
deeper than MAX_DEPTH (objects, arrays, `anyOf` / `oneOf` options, `$ref` hops) is cut to
`{}` / `[]` / null, and a schema that asks for more than MAX_TEXT characters (minLength,
minItems, a recursive `$ref`, a large `const` repeated) is cut short there: a client's
schema never makes a reply larger than that or holds the gateway's loop for long. Numbers and booleans are drawn from a
`random.Random` seeded by the caller, so the same request gets the same arguments.

How the text follows the engine's tokens (the engine decides how many a reply has; the
call has to fit them): the arguments are `prefix + fragment * tokens + suffix`. The first
required string property without constraints (no enum, const, format, pattern or length
bounds) is the growing one: its value is the placeholder fragment (" token") once per
generated token. Without such a property the fragment is a space of JSON whitespace
before the object's closing brace (`{"n":3   }`), which every JSON parser skips. So each
generated token is one fragment of the arguments, the text always parses, and its
length follows the engine's count as a model's would.

Does not know: any API's shapes, HTTP or the engine.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 8  # nesting (objects, arrays, $ref hops) beyond this is cut short
MAX_ITEMS = 16  # an array's items, whatever its minItems says
MAX_TEXT = 16384  # characters of arguments a schema may ask for (the growing string aside)
WORD = "token"  # a string property's value (repeated to its minLength)
_PAD = "\x00pad\x00"  # stands for the growing string while the skeleton is encoded
_PAD_JSON = json.dumps(_PAD)
_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z", "date": "2026-01-01", "time": "00:00:00Z",
    "email": "user@example.com", "idn-email": "user@example.com", "hostname": "example.com",
    "uri": "https://example.com/", "url": "https://example.com/", "iri": "https://example.com/",
    "uri-reference": "https://example.com/", "ipv4": "192.0.2.1", "ipv6": "2001:db8::1",
    "duration": "PT1S",
}
_STRING_BOUNDS = ("enum", "const", "format", "pattern", "minLength", "maxLength")


@dataclass(frozen=True, slots=True)
class Arguments:
    """A call's arguments as JSON text: `prefix`, one `fragment` per generated token,
    `suffix`."""

    prefix: str
    fragment: str
    suffix: str

    def text(self, tokens: int) -> str:
        return self.prefix + self.fragment * tokens + self.suffix

    def value(self, tokens: int) -> dict:
        """The arguments as an object (Anthropic's `input`)."""
        return json.loads(self.text(tokens))


def synthesize(schema: Any, seed: str, fragment: str) -> Arguments:
    """The arguments of a call to a tool with this parameters schema (None or not an
    object schema: `{}`); `seed` picks the numbers and booleans; `fragment` is what each
    generated token adds to the growing string."""
    maker = _Maker(schema, random.Random(seed))
    value = maker.value(schema, 0)
    if not isinstance(value, dict):
        value, maker.padded = {}, False
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if maker.padded:
        before, after = text.split(_PAD_JSON)
        return Arguments(before + '"', fragment, '"' + after)
    return Arguments(text[:-1], " ", "}")


class _Maker:
    """One schema's value: the root (for `$ref`), the seeded draws, whether the growing
    string was placed."""

    def __init__(self, root: Any, rng: random.Random) -> None:
        self.root = root
        self.rng = rng
        self.padded = False
        self.room = MAX_TEXT  # characters still allowed

    def value(self, schema: Any, depth: int) -> Any:
        self.room -= 2  # every value costs something, so recursion always ends
        if self.room <= 0 or depth > MAX_DEPTH:
            return None
        schema = self._resolve(schema, depth)
        if schema is True or schema == {}:
            return self._string({})
        if not isinstance(schema, dict):
            return None
        if "const" in schema:
            return self._literal(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return self._literal(enum[0])
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                usable = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
                return self.value((usable or options)[0], depth + 1)
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema)

    def _literal(self, value: Any) -> Any:
        """A `const` or `enum` value, charged its size (None once the room is used)."""
        self.room -= len(json.dumps(value, ensure_ascii=False))
        return value if self.room > 0 else None

    def _resolve(self, schema: Any, depth: int) -> Any:
        """A schema with its local `$ref` followed and its `allOf` merged."""
        hops = 0
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and hops < MAX_DEPTH:
            target = self._pointer(schema["$ref"])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if isinstance(target, dict) else target
            hops += 1
        if isinstance(schema, dict) and isinstance(schema.get("allOf"), list) and depth < MAX_DEPTH:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                part = self._resolve(part, depth + 1)
                if not isinstance(part, dict):
                    continue
                for key, value in part.items():
                    if key == "properties" and isinstance(value, dict):
                        merged["properties"] = {**merged.get("properties", {}), **value}
                    elif key == "required" and isinstance(value, list):
                        merged["required"] = [*merged.get("required", []), *value]
                    else:
                        merged.setdefault(key, value)
            schema = merged
        return schema

    def _pointer(self, ref: str) -> Any:
        """A local JSON pointer (`#/$defs/Name`) into the root schema; {} when it leads
        nowhere (a remote ref, a typo)."""
        if not ref.startswith("#"):
            return {}
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return {}
        return node

    def _object(self, schema: dict, depth: int) -> dict:
        if depth >= MAX_DEPTH:
            return {}
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = [r for r in schema.get("required") or () if isinstance(r, str)]
        # in the schema's order (as a model writes them), then required ones it lacks
        names = [p for p in properties if p in required]
        names += [r for r in dict.fromkeys(required) if r not in properties]
        return {name: self.value(properties.get(name, {}), depth + 1) for name in names}

    def _array(self, schema: dict, depth: int) -> list:
        if depth >= MAX_DEPTH:
            return []
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        low = schema.get("minItems")
        count = low if isinstance(low, int) and low > 0 else max(len(prefix), 1)
        high = schema.get("maxItems")
        if isinstance(high, int) and high >= 0:
            count = min(count, high)
        count = min(count, MAX_ITEMS)
        items = schema.get("items", {})
        out = []
        for i in range(count):
            if self.room <= 0:
                break
            value = self.value(prefix[i] if i < len(prefix) else items, depth + 1)
            if schema.get("uniqueItems") and value in out:
                break
            out.append(value)
        return out

    def _integer(self, schema: dict) -> int:
        (low, strict_low), (high, strict_high) = _bounds(schema)
        first = math.floor(low) + 1 if strict_low else math.ceil(low)
        last = math.ceil(high) - 1 if strict_high else math.floor(high)
        step = schema.get("multipleOf")
        if _number(step) and step > 0 and float(step).is_integer():
            step = int(step)
            first, last = -(-first // step), last // step
            return self.rng.randint(first, max(first, last)) * step
        return self.rng.randint(first, max(first, last))

    def _number(self, schema: dict) -> float | int:
        (low, _), (high, _) = _bounds(schema)
        step = schema.get("multipleOf")
        if _number(step) and step > 0 and math.isfinite(low / step) and math.isfinite(high / step):
            first, last = math.ceil(low / step), math.floor(high / step)
            return self.rng.randint(first, max(first, last)) * step
        value = round(self.rng.uniform(low, high), 2)
        return value if low < value < high or low == high else (low + high) / 2

    def _string(self, schema: dict) -> str:
        if not self.padded and not any(key in schema for key in _STRING_BOUNDS):
            self.padded = True
            return _PAD
        fmt = schema.get("format")
        if fmt == "uuid":
            return "%08x-%04x-4%03x-8%03x-%012x" % tuple(
                self.rng.getrandbits(bits) for bits in (32, 16, 12, 12, 48))
        text = _FORMATS.get(fmt, WORD) if isinstance(fmt, str) else WORD
        low, high = schema.get("minLength"), schema.get("maxLength")
        if isinstance(low, int) and len(text) < low:
            low = min(low, max(self.room, 0))
            text += (" " + WORD) * -(-(low - len(text)) // (len(WORD) + 1))
        text = text[:high] if isinstance(high, int) and high >= 0 else text
        self.room -= len(text)
        return text


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bounds(schema: dict) -> tuple[tuple[float, bool], tuple[float, bool]]:
    """(low, exclusive), (high, exclusive): `minimum` / `maximum`, `exclusiveMinimum` /
    `exclusiveMaximum` as numbers (draft 6 on) or booleans (draft 4); a range of 100 where
    a side is open."""
    ends = []
    for bound, exclusive, tighter in (("minimum", "exclusiveMinimum", max),
                                      ("maximum", "exclusiveMaximum", min)):
        value, strict = schema.get(bound), schema.get(exclusive)
        end = (value, strict is True) if _number(value) else None
        if _number(strict) and (end is None or tighter(strict, end[0]) == strict):
            end = (strict, True)
        ends.append(end)
    low, high = ends
    if low is None and high is None:
        return (0, False), (100, False)
    if low is None:
        return (high[0] - 100, False), high
    if high is None:
        return low, (low[0] + 100, False)
    return low, (high if high[0] >= low[0] else low)


def _kind(schema: dict) -> str:
    """The schema's type (the first non-null of a list), else what its keywords imply."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if kinds else "null"
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return "string"
