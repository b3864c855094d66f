"""Bridges to neighbouring projects, each through the other project's published package.

* :mod:`agentfly_gym.bridges.openenv_serving`: serve any agentfly env through OpenEnv's server
  interface; :mod:`agentfly_gym.bridges.openenv`: wrap an OpenEnv environment as an agentfly Gymnasium env
  (both ``pip install 'agentfly-gym[openenv]'``).

Importing this package imports none of them.
"""
