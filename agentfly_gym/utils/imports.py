"""The one ``"package.module:attr.path"`` loader of the project.

Backends, in-process factories, vector env entry points, reward functions and the delegated
command-line commands all name Python objects this way (as setuptools entry points do).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ConfigError

__all__ = ["load_object"]


def load_object(path: str, *, what: str = "object", require_callable: bool = True,
                import_error: type[Exception] = ConfigError) -> Any:
    """Import ``"package.module:attr"`` (``attr`` may be dotted, e.g. ``"mod:Class.method"``).

    Args:
        path: the module and the attribute, separated by one colon.
        what: what the object is, for error messages (e.g. ``"factory"``, ``"backend"``).
        require_callable: refuse an object that is not callable.
        import_error: the exception raised when the module cannot be imported (e.g.
            :class:`~agentfly_gym.errors.ResourceUnavailable` for an optional dependency that is
            not installed); chained from the ``ImportError``.

    Returns:
        The object.

    Raises:
        ConfigError: ``path`` is not ``"module:attr"``, the attribute does not exist, or (with
            ``require_callable``) it is not callable.
        import_error: the module (or something it imports) cannot be imported.
    """
    if not isinstance(path, str):
        raise ConfigError(f"{what} {path!r} must be a string 'package.module:attr'")
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name or not attr:
        raise ConfigError(f"{what} {path!r} must look like 'package.module:attr'")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise import_error(f"{what} {path!r}: cannot import module {mod_name!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{what} {path!r}: module {mod_name!r} has no attribute {attr!r}") from None
    if require_callable and not callable(obj):
        raise ConfigError(f"{what} {path!r} is not callable")
    return obj
