"""WebShop (Yao et al. 2022, princeton-nlp/WebShop, MIT) as ``agentfly/WebShop-v0``.

- :class:`WebShopEnv`: the Gymnasium text environment (search[...] / click[...]).
- :class:`WebShopServer`: catalog + BM25 index + spaCy + goals loaded once, many sessions; shared by
  every env of a resource manager as a global resource.
- :func:`get_reward`: WebShop's goal reward.

Importing this package loads nothing heavy; the server loads its data when first acquired.
"""

from typing import TYPE_CHECKING

from ...utils.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and the API reference read; at run time each name is imported on
    # first use (agentfly_gym.utils.lazy), so `agentfly-gym envs` imports no engine or simulator module
    from .catalog import Catalog, load_catalog
    from .env import WebShopEnv
    from .pages import to_text
    from .reward import get_reward, normalize_color, token_set_ratio
    from .search import ProductSearch
    from .server import WebShopServer, WebShopServerProxy, parse_action

__getattr__, __dir__ = lazy_exports(__name__, {
    "Catalog": "catalog",
    "ProductSearch": "search",
    "WebShopEnv": "env",
    "WebShopServer": "server",
    "WebShopServerProxy": "server",
    "get_reward": "reward",
    "load_catalog": "catalog",
    "normalize_color": "reward",
    "parse_action": "server",
    "to_text": "pages",
    "token_set_ratio": "reward",
})

__all__ = [
           "Catalog",
           "ProductSearch",
           "WebShopEnv",
           "WebShopServer",
           "WebShopServerProxy",
           "get_reward",
           "load_catalog",
           "normalize_color",
           "parse_action",
           "to_text",
           "token_set_ratio",
]
