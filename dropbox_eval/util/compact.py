"""Pydantic models kept by the ten thousand (a big batch's tasks), made smaller in place.

A validated model keeps a set of the fields it was given (`__pydantic_fields_set__`): 728
bytes for a task record of 11 fields, more than its values. Nothing here asks which fields
were set, so every model of a class shares one set naming all of them (a field assigned
later adds a name it already holds). Values that repeat in every task of a batch (its id,
its repo, its creation time) are shared through a memo instead of parsed once per task.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

Model = TypeVar("Model", bound=BaseModel)
_EVERY_FIELD: dict[type[BaseModel], set[str]] = {}


def compacted(model: Model, memo: dict[Any, Any], shared: tuple[str, ...] = ()) -> Model:
    """`model` (and the models in its fields) with one fields set per class, and the
    values of its `shared` fields taken from `memo` when an equal one is there."""
    values = model.__dict__
    for name in shared:
        value = values.get(name)
        if value is not None:
            values[name] = memo.setdefault(value, value)
    stack: list[BaseModel] = [model]
    while stack:
        each = stack.pop()
        kind = type(each)
        every = _EVERY_FIELD.get(kind)
        if every is None:
            every = _EVERY_FIELD.setdefault(kind, set(kind.model_fields))
        object.__setattr__(each, "__pydantic_fields_set__", every)
        stack.extend(value for value in each.__dict__.values() if isinstance(value, BaseModel))
    return model
