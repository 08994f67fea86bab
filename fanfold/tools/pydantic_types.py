"""Function tools' parameters described, validated and converted by pydantic.

A parameter whose type fanfold's own description (``function._schema``: JSON's
scalars, lists, dicts, ``Literal``, enums, ``X | None``, attrs classes and dataclasses)
cannot express, or whose ``Annotated`` metadata carries constraints
(``Field(ge=0)``, ``annotated_types.MaxLen``), is handed to pydantic when it is
installed: a pydantic ``BaseModel``, a ``TypedDict``, ``Union[int, str]``,
``datetime.date``... Its ``TypeAdapter`` gives the JSON schema the model is offered
and validates and converts the model's argument, so what is offered and what is
enforced come from one place. pydantic is imported only then (it costs 0.3-0.7 s to
import), and is an optional dependency (the ``pydantic`` extra; DESIGN.md,
"Dependencies"): without it such a parameter is refused when the tool is made, with a
message naming the install.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

INSTALL = "pip install pydantic, or fanfold[pydantic]"
"""How a user gets pydantic, for refusals."""


def available() -> bool:
    """Whether pydantic (version 2) can be imported."""
    try:
        pydantic = importlib.import_module("pydantic")
    except ImportError:
        return False
    return str(getattr(pydantic, "VERSION", "1")).startswith("2")


class PydanticRefused(Exception):
    """pydantic cannot describe a type either (``message``: its reason, one line)."""


def adapter(hint: Any) -> Any:
    """A ``TypeAdapter`` for ``hint`` whose JSON schema can be generated; raises
    :class:`PydanticRefused` otherwise."""
    from pydantic import TypeAdapter

    try:
        made = TypeAdapter(hint)
        made.json_schema()  # a type it validates may still have no JSON schema
    except Exception as exc:  # PydanticUserError, PydanticSchemaGenerationError...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PydanticRefused(first) from None
    return made


def schemas(adapters: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each parameter's JSON schema, and the ``$defs`` they share (models used by
    several parameters are defined once, under names pydantic keeps apart)."""
    from pydantic import TypeAdapter

    inputs = [(name, "validation", made) for name, made in adapters.items()]
    by_key, definitions = TypeAdapter.json_schemas(inputs, ref_template="#/$defs/{model}")  # type: ignore[arg-type]
    return (
        {name: dict(by_key[(name, "validation")]) for name in adapters},
        dict(definitions.get("$defs", {})),
    )


class BadArgument(ValueError):
    """An argument pydantic refuses: ``message`` names each bad part, as
    ``argument 'point.x': Input should be a valid integer``."""


def convert(made: Any, value: Any, name: str) -> Any:
    """``value`` (parsed JSON) validated and converted by ``made``; raises
    :class:`BadArgument` naming the parts it refuses."""
    from pydantic import ValidationError

    try:
        return made.validate_python(value)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False)[:5]:
            path = name
            for part in error.get("loc", ()):
                path += f"[{part}]" if isinstance(part, int) else f".{part}"
            problems.append(f"argument '{path}': {error.get('msg', 'invalid')}")
        more = exc.error_count() - len(problems)
        if more > 0:
            problems.append(f"and {more} more")
        raise BadArgument("; ".join(problems)) from None


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data if pydantic can make it so (a model through
    ``model_dump(mode="json")``, a date as ISO text...), else raises ``TypeError``."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a pydantic model: its own serialisation, aliases and all
        return dump(mode="json")
    try:
        from pydantic_core import to_jsonable_python
    except ImportError:
        raise TypeError(f"{type(value).__name__} is not JSON") from None
    return to_jsonable_python(value)
