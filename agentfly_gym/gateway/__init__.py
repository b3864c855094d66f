"""An OpenAI-compatible gateway that trains any agent harness on the token ids its policy sampled.

An agent written with the OpenAI SDK, the OpenAI Agents SDK, smolagents or any other harness talks to a session's
base URL (``http://HOST:PORT/sessions/{id}/v1``); the gateway renders each request with the policy's chat
template, samples with the policy, answers in OpenAI's format and records prompt ids, sampled ids and logprobs,
stitched into segments (:mod:`.session`).  Nothing is re-tokenized: the recorded ids are those the policy saw and
sampled.

* :class:`Gateway` (:mod:`.app`): sessions and the ASGI app; :func:`serve_gateway` (:mod:`.server`) runs it.
* :func:`run_agent` / :func:`run_agents` (:mod:`.agents`): an agent as a rollout, with time and turn limits.
* :func:`segment_rows` (:mod:`.rows`): a gateway trajectory as trainer rows (TRL bridge, verl plugin).

``agentfly-gym gateway --policy POLICY --host 127.0.0.1 --port PORT`` serves one from the command line.
"""

from .agents import AgentRollout, run_agent, run_agents
from .app import Gateway
from .messages import BadRequest
from .rows import segment_rows
from .server import serve_gateway
from .session import Segment, Session

__all__ = [
           "AgentRollout",
           "BadRequest",
           "Gateway",
           "Segment",
           "Session",
           "run_agent",
           "run_agents",
           "segment_rows",
           "serve_gateway",
]
