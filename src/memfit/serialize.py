"""JSON-ready dicts from memfit's result dataclasses: what every `to_dict()` is built from.

memfit's JSON keeps to a few conventions (DESIGN.md): snake_case keys, sizes in bytes under
`*_bytes` keys, times in seconds under `*_seconds` keys, a nested result as its own
`to_dict()`, lists as lists. `json_dict` builds such a dict from a dataclass's fields (or the
keys asked for, in their order), so that a result's `to_dict()` says only what differs from its
fields: keys renamed, computed, rounded or left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


def to_json(value: Any) -> Any:
    """`value` with every dataclass in it turned into a dict, recursively.

    An object with a `to_dict()` method gives that; another dataclass instance gives its
    fields (as `dataclasses.asdict` does); lists and dicts are copied with their items
    converted (a dict subclass becomes a plain dict), tuples stay tuples; anything else is
    returned as it is.

    Args:
        value: a result, a container of results, or a plain value.

    Example:
        ```python
        to_json({"budget": Budget.from_size("1GiB"), "shape": (8, 32)})
        # {'budget': {'usable_bytes': 1073741824, ...}, 'shape': (8, 32)}
        ```
    """
    if isinstance(value, type):
        return value
    if callable(getattr(value, "to_dict", None)):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [to_json(item) for item in value]
    if isinstance(value, tuple):
        return tuple(to_json(item) for item in value)
    if isinstance(value, Mapping):
        return {to_json(key): to_json(item) for key, item in value.items()}
    return value


def json_dict(
    obj: Any, keys: str | Sequence[str] | None = None, /, **values: Any
) -> dict[str, Any]:
    """The JSON-ready dict of a dataclass instance: its fields, or the keys asked for, in order.

    Each key's value is `values[key]` when given (a renamed, computed or rounded value),
    else the attribute of that name (a field or a property); every value goes through
    `to_json`.

    Args:
        obj: the dataclass instance (e.g. a result).
        keys: the dict's keys in order, as a sequence or one string of names separated by
            white space; None: `obj`'s fields in order, followed by the `values` that are not
            fields.
        **values: values for keys that are not read from `obj` as they are.

    Returns:
        A new dict; `json.dumps` takes it as it is when the values are plain.

    Raises:
        TypeError: a value is given for a key that `keys` does not list.

    Example:
        ```python
        def to_dict(self) -> dict[str, Any]:
            return json_dict(self, "ok batch_size search_seconds", search_seconds=self.seconds)
        ```
    """
    if keys is None:
        names = [f.name for f in dataclasses.fields(obj)]
        names += [key for key in values if key not in names]
    else:
        names = keys.split() if isinstance(keys, str) else list(keys)
        unknown = [key for key in values if key not in names]
        if unknown:
            raise TypeError(f"values for keys not in keys: {', '.join(unknown)}")
    return {key: to_json(values[key] if key in values else getattr(obj, key)) for key in names}


def suffixed(mapping: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    """`mapping` with `suffix` added to each key, e.g. byte counts under `*_bytes` keys.

    Args:
        mapping: names to values, e.g. `{"weights": 1024}`.
        suffix: what to add, e.g. `"_bytes"`.

    Example:
        >>> suffixed({"weights": 1024, "activations": 4096}, "_bytes")
        {'weights_bytes': 1024, 'activations_bytes': 4096}
    """
    return {f"{key}{suffix}": value for key, value in mapping.items()}
