"""The JSON schema of each `HTMLLM_*` setting's value in the chart's `extraSettings` and `extraEnv`,
derived from the service's `Settings`. values.schema.json holds the result (definitions.extraSettings and
definitions.extraEnvSetting), and test_helm_values.py keeps them equal, as test_helm.py keeps the list of
names equal: a value the server would refuse at start (pydantic exits 2, every pod in CrashLoopBackOff)
then fails `helm install` instead.

A value reaches the server as text (the chart's htmllm.settingValue: a string as given, anything else as
JSON), which pydantic-settings parses. So each setting takes its YAML type within the field's bounds, or a
string in a form the service parses; a field type or bound not handled here raises, so a new one gets a
deliberate schema rather than none. An extraEnv entry's `value` is that text itself, so it takes the
string forms only. Print both definitions' entries to paste into the schema with
`python -m tests.deploy.setting_schemas`.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic.fields import FieldInfo

from service.api.settings import Settings

Schema = dict[str, Any]

# pydantic's spellings of a boolean in text, in any case.
BOOLEAN_TEXT = "^(?i:true|false|yes|no|on|off|t|f|y|n|1|0)$"
# Decimal text at or above 0, and above 0. Exponents, signs, `inf` and `1_000` parse too, but nobody
# needs them in a values file.
DECIMAL_TEXT = r"^[0-9]+(\.[0-9]+)?$"
POSITIVE_DECIMAL_TEXT = r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)$"


def _integer_text(minimum: int, maximum: int | None = None) -> str:
    """Digits spelling an integer at least `minimum` (0 to 9) and, given, at most `maximum` (10 or more)."""
    if not 0 <= minimum <= 9:
        raise ValueError(f"no text pattern for integers from {minimum}")
    if maximum is not None:
        if maximum < 10:
            raise ValueError(f"no text pattern for integers up to {maximum}")
        return f"^0*({'0|' if minimum == 0 else ''}{_up_to(maximum, lowest=max(minimum, 1))})$"
    if minimum == 0:
        return "^[0-9]+$"
    return f"^0*([{minimum}-9]|[1-9][0-9]+)$"


def _digits(low: int, high: int) -> str:
    return str(low) if low == high else f"[{low}-{high}]"


def _repeated(pattern: str, times: int) -> str:
    return pattern if times == 1 else f"{pattern}{{{times}}}"


def _up_to(limit: int, *, lowest: int = 1) -> str:
    """Alternatives of a pattern spelling, without leading zeros, the integers from `lowest` (1 to 9) to
    `limit` (at least `lowest`): those with fewer digits than `limit`, then those with as many, below it
    from their first digit that is smaller, then `limit` itself."""
    digits = str(limit)
    if len(digits) == 1:
        return _digits(lowest, limit)
    alternatives = [_digits(lowest, 9)]
    if len(digits) > 2:
        middle = "" if len(digits) == 3 else f",{len(digits) - 2}"
        alternatives.append(f"[1-9][0-9]{{1{middle}}}")
    for position, digit in enumerate(digits):
        low = 1 if position == 0 else 0
        if int(digit) > low:
            rest = len(digits) - position - 1
            tail = _repeated("[0-9]", rest) if rest else ""
            alternatives.append(digits[:position] + _digits(low, int(digit) - 1) + tail)
    alternatives.append(digits)
    return "|".join(alternatives)


def _decimal_text(*, positive: bool, maximum: int | None) -> str:
    """Decimal text at or above 0 (above it where `positive`) and, given, at most `maximum` (10 or more)."""
    if maximum is None:
        return POSITIVE_DECIMAL_TEXT if positive else DECIMAL_TEXT
    if maximum < 10:
        raise ValueError(f"no text pattern for decimals up to {maximum}")
    below = _up_to(maximum - 1)  # any fraction after these; after `maximum` itself, zeros only
    if positive:
        return rf"^0*(({below})(\.[0-9]+)?|{maximum}(\.0+)?|0\.[0-9]*[1-9][0-9]*)$"
    return rf"^0*((0|{below})(\.[0-9]+)?|{maximum}(\.0+)?)$"


def _bounds(name: str, field: FieldInfo) -> tuple[tuple[float, bool] | None, int | None]:
    """The field's lower bound and whether it is exclusive (None when it has none), and its upper bound,
    inclusive and whole (None when it has none: the durations have one, `MAX_DURATION_S`)."""
    lower: tuple[float, bool] | None = None
    upper: int | None = None
    for constraint in field.metadata:
        if isinstance(constraint, annotated_types.Ge):
            lower = (float(constraint.ge), False)  # type: ignore[arg-type]
        elif isinstance(constraint, annotated_types.Gt):
            lower = (float(constraint.gt), True)  # type: ignore[arg-type]
        elif isinstance(constraint, annotated_types.Le) and isinstance(constraint.le, int):
            upper = constraint.le
        else:
            raise ValueError(f"{name}: no value schema for the constraint {constraint!r}")
    return lower, upper


def _without_none(name: str, annotation: Any) -> Any:
    """The annotation less an optional None: unset is the default, and no text of the variable means None."""
    if get_origin(annotation) in (Union, types.UnionType):
        kept = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(kept) != 1:
            raise ValueError(f"{name}: no value schema for the union {annotation}")
        return kept[0]
    return annotation


def value_schema(name: str, field: FieldInfo) -> Schema:
    """What extraSettings may hold for the setting `name` (its Settings field `field`)."""
    annotation = _without_none(name, field.annotation)
    bound, maximum = _bounds(name, field)
    if get_origin(annotation) is Literal:
        return {"enum": list(get_args(annotation))}
    if annotation is bool:
        return {"anyOf": [{"type": "boolean"}, {"type": "string", "pattern": BOOLEAN_TEXT}]}
    if annotation is Path:
        return {"type": "string", "minLength": 1}
    at_most = {} if maximum is None else {"maximum": maximum}
    if annotation is int and bound is not None:
        minimum = int(bound[0]) + 1 if bound[1] else int(bound[0])
        return {
            "anyOf": [
                {"type": "integer", "minimum": minimum, **at_most},
                {"type": "string", "pattern": _integer_text(minimum, maximum)},
            ]
        }
    if annotation is float and bound is not None and bound[0] == 0:
        exclusive = bound[1]
        number = {"type": "number", "exclusiveMinimum" if exclusive else "minimum": 0, **at_most}
        text = _decimal_text(positive=exclusive, maximum=maximum)
        return {"anyOf": [number, {"type": "string", "pattern": text}]}
    raise ValueError(f"{name}: no value schema for {annotation} with the bounds {bound}, {maximum}")


def _fields() -> dict[str, FieldInfo]:
    """Each Settings field by its variable's name."""
    return {f"HTMLLM_{field.upper()}": info for field, info in Settings.model_fields.items()}


def value_schemas(names: list[str]) -> dict[str, Schema]:
    """The value schema of each setting in `names` (HTMLLM_* variables), in Settings' field order."""
    fields = _fields()
    unknown = sorted(set(names) - set(fields))
    if unknown:
        raise ValueError(f"not Settings fields: {unknown}")
    return {name: value_schema(name, info) for name, info in fields.items() if name in names}


def env_value_schema(name: str, field: FieldInfo) -> Schema:
    """What an extraEnv entry named `name` may hold as its `value`: the string forms of its extraSettings
    value (a variable's value is text, and the API server refuses a number there)."""
    schema = value_schema(name, field)
    if "anyOf" in schema:
        (text,) = [option for option in schema["anyOf"] if option.get("type") == "string"]
        return dict(text)
    if "enum" in schema and all(isinstance(choice, str) for choice in schema["enum"]):
        return schema
    if schema.get("type") == "string":
        return schema
    raise ValueError(f"{name}: no text form of the value schema {schema}")


def env_value_rules(names: list[str]) -> list[Schema]:
    """values.schema.json's definitions.extraEnvSetting.allOf: for each setting in `names`, an extraEnv
    entry of that name has a `value` in one of the setting's string forms (Settings' field order)."""
    return [
        {
            "if": {"required": ["name"], "properties": {"name": {"const": name}}},
            "then": {"properties": {"value": env_value_schema(name, field)}},
        }
        for name, field in _fields().items()
        if name in names
    ]


def main() -> None:
    """Print values.schema.json's definitions.extraSettings properties, then its definitions.extraEnvSetting
    allOf entries, one setting a line."""
    schema = json.loads((Path(__file__).resolve().parents[2] / "helm/htmllm/values.schema.json").read_text())
    names = schema["definitions"]["extraSettingName"]["enum"]
    lines = [f"{json.dumps(name)}: {json.dumps(value)}" for name, value in value_schemas(names).items()]
    print(",\n".join(lines))
    print()
    print(",\n".join(json.dumps(rule) for rule in env_value_rules(names)))


if __name__ == "__main__":
    main()
