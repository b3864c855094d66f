"""Moved to :mod:`agentfly_gym.resources.containers.images`; this name stays for existing imports.

``python3 -m agentfly_gym.images build base`` and ``from agentfly_gym.images import build_image``
keep working.
"""

from .resources.containers.images import *  # noqa: F401,F403
from .resources.containers.images import __all__, images_main  # noqa: F401

if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(images_main(sys.argv[1:]))
