"""Bring your own task: tools from typed functions, an environment from task rows, tools and a reward.

::

    from agentfly_gym.tools import tool, make_tool_env

    @tool
    def add(a: int, b: int) -> int:
        '''Add two integers.

        Args:
            a: the first number
            b: the second number
        '''
        return a + b

    env_id = make_tool_env("my/Add-v0", tasks=[{"prompt": "What is 2+3?", "answer": "5"}], tools=[add],
                           reward=lambda completion, answer, **row: float(answer in completion))

The model calls tools in its family's native format (:mod:`.formats`); the rollout layer renders the tools
through the tokenizer's chat template (``tools=``) and appends the results as ``role: "tool"`` messages
(:class:`~agentfly_gym.rollout.chat.ChatTokenizer`), keeping sampled token ids verbatim.

Tools from an MCP server: :mod:`agentfly_gym.tools.mcp` (``mcp_tools(mcp_server_spec(...))``; imported on use).
R2E-Gym's tools: :func:`agentfly_gym.envs.r2egym.tools.r2e_tools`.
"""

from .env import DEFAULT_SYSTEM_PROMPT, ToolEnv, ToolPrompt, make_tool_env, tool_call_id
from .formats import (FORMATS, ToolCall, ToolCallError, detect_tool_format, format_tool_call, hermes_tool_prompt,
                      parse_tool_calls)
from .stalls import ToolBlockedLoop
from .tasks import load_tasks
from .tool import DEFAULT_TOOL_TIMEOUT, Tool, check_tools, tool

__all__ = ["DEFAULT_SYSTEM_PROMPT", "DEFAULT_TOOL_TIMEOUT", "FORMATS", "Tool", "ToolBlockedLoop", "ToolCall",
           "ToolCallError", "ToolEnv", "ToolPrompt", "check_tools", "detect_tool_format", "format_tool_call", "hermes_tool_prompt", "load_tasks",
           "make_tool_env", "parse_tool_calls", "tool", "tool_call_id"]
