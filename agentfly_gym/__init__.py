"""agentfly-gym: vectorised, asynchronous Gymnasium environments for agentic RL with language models.

``import agentfly_gym`` registers ``agentfly/Chess-v0``, ``agentfly/ScienceWorld-v0``,
``agentfly/ALFWorld-v0``, ``agentfly/WebShop-v0`` and ``agentfly/R2EGym-v0`` with Gymnasium;
it starts nothing and writes nothing.  Multi-agent (PettingZoo) environments such as
``agentfly/ChessSelfPlay-v0`` come from :func:`make_multiagent`.
"""

from .errors import AgentFlyError
from .registration import make_multiagent, register_envs

__version__ = "0.1.0"
__all__ = ["AgentFlyError", "__version__", "make_multiagent", "register_envs"]

register_envs()
