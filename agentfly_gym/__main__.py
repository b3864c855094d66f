"""``python -m agentfly_gym`` is the ``agentfly-gym`` command."""

import sys

from .cli import main

sys.exit(main())
