"""The daemon-less sandbox container backend (bubblewrap); see :mod:`.container`."""

from .container import *  # noqa: F401,F403
from .container import __all__  # noqa: F401
