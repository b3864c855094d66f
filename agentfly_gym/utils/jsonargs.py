"""JSON objects given as text in settings (command-line flags, reward specs, data set rows)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ConfigError

__all__ = ["json_object"]


def json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object.

    Args:
        text: the JSON text.
        what: names the setting in the error message (e.g. ``"--env-kwargs"``).

    Raises:
        ConfigError: ``text`` does not parse, or is JSON but not an object; the message quotes it.
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} is not JSON: it does not parse ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object, got {text!r}")
    return value
