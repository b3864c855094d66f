"""Bridges to neighbouring projects, each through the other project's published package.

* :mod:`agentfly_gym.bridges.openenv`: serve any agentfly env through OpenEnv's server
  interface, and wrap an OpenEnv environment as an agentfly Gymnasium env
  (``pip install 'agentfly-gym[openenv]'``).

Importing this package imports none of them.
"""
