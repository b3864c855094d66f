"""``agentfly/WebShop-v0``: WebShop's text environment on one shared, global WebShop server."""

from __future__ import annotations

import logging
import os
from types import MappingProxyType
from typing import Any, ClassVar

from ...data.paths import resolve_data_dir
from ...errors import ConfigError, ResetNeeded, ResourceDied
from ...limits import check_int
from ...resources.scope import RolloutScope
from ...resources.spec import InProcessSpec
from ...utils.aio import run_sync
from ..base import AgentFlyEnv, StepResult
from ..prompting import AgentPrompt
from .catalog import DATA_MARKER, HOW_TO_GET, find_data_files
from .reward import DEFAULT_SPACY_MODEL
from .server import OBSERVATION_MODES, SERVER_FACTORY, SPLITS, WebShopServerProxy

__all__ = ["WebShopEnv"]

log = logging.getLogger(__name__)

_SYSTEM = (
    "You are shopping on WebShop, a simulated online store, to buy the product that best matches an "
    "instruction (its attributes, options such as size or colour, and price limit).\n"
    "Each observation is the current web page as text, with elements separated by [SEP].\n"
    "Actions:\n"
    "- search[<keywords>]: search the store (on the search page);\n"
    "- click[<element>]: click a button, a product ID, or an option value shown on the page, e.g. "
    "click[back to search], click[next >], click[< prev], click[b09abc1234], click[large], "
    "click[description], click[buy now].\n"
    "Buying (click[buy now]) ends the episode; the reward says how well the product matches.\n"
    "Think briefly, then end each reply with exactly one line 'Action: <action>', for example\n"
    "Action: search[red running shoes size 9]"
)


class WebShopEnv(AgentFlyEnv):
    """WebShop (Yao et al. 2022, princeton-nlp/WebShop) as a text environment.

    Observations are upstream's text observations (``observation_mode="text"``: page text nodes
    joined by ``" [SEP] "``, as upstream's ``WebAgentTextEnv(observation_mode="text")``; or
    ``"text_rich"``).  Actions are ``search[keywords]`` and ``click[element]``; an invalid action
    leaves the page unchanged (upstream).  ``click[buy now]`` ends the episode (``terminated``) with
    WebShop's goal reward in [0, 1]; every other step gives 0.

    The catalog, search index, spaCy model and goals are loaded once into a WebShop server, a
    *global* resource shared by every env on the same resource manager; each episode holds its own
    session there (session id = episode id), opened at reset and dropped when the episode ends.

    Args:
        data_dir: folder with WebShop's data files; default: ``$WEBSHOP_DATA``, then
            ``$AGENTFLY_GYM_DATA/webshop``, then ``~/.cache/agentfly-gym/webshop``, then the 29-product
            sample shipped in the package (no human instructions; ``agentfly-gym data download
            webshop-small`` fetches the 1,000-product set).
        products_file, attributes_file, human_file: file names (or absolute paths) overriding the
            standard names ``items_shuffle_1000.json`` / ``items_shuffle.json``,
            ``items_ins_v2_1000.json`` / ``items_ins_v2.json``, ``items_human_ins.json``.
        human_goals: human instructions (``items_human_ins.json``; the paper's evaluation) or
            synthetic ones from the attribute file (default False, as upstream's text env when
            ``human_goals`` is not given).
        num_products: keep only the first N product records.
        split: goals to sample at reset when no ``task_id`` is given: ``"all"`` (weighted by goal
            weight, as upstream's ``SimServer``), or upstream's baseline splits ``"test"`` (goals
            0-499), ``"eval"`` (500-1499; also named ``"validation"``), ``"train"`` (1500-) sampled uniformly.
        observation_mode: ``"text"`` (default) or ``"text_rich"``.
        show_attrs: show the Attributes button on item pages.
        price_seed: seed of the catalog's price draws (see :mod:`.catalog`).
        spacy_model: spaCy model for the reward's noun matching.
        isolation: ``"thread"`` (default; the server runs on its own thread in this process) or
            ``"process"`` (a child process: ``InProcessSpec(isolation="process")``; it dies with this
            process, and a crashed server ends the running episodes with a handled fault and is
            restarted at the next reset).
        max_idle_time: seconds the shared server stays up once every env using it has been closed,
            so that envs made one after another (a training loop) reuse it warm (default 300); then it
            is stopped (its child process with it in ``"process"`` mode, its memory in ``"thread"``
            mode), and the next env starts a new one.  ``None`` keeps it until the resource manager
            closes (the default manager: process exit).  Close envs (``env.close()``) for this to apply.
        search_requires_search_bar: refuse ``search[...]`` outside the search page (default False:
            upstream's text env searches from any page).
        max_episode_steps: default 15 steps.
        **kwargs: :class:`AgentFlyEnv` arguments (manager, step_timeout, reset_timeout, render_mode).

    Reset options: ``task_id`` (int goal index, or its decimal string), or ``instruction`` (a
    goal's instruction text, as shown on the search page: the first goal with that text, matched
    exactly, else up to case and whitespace; ``info["task_id"]`` then says its index), ``split``
    (overrides the constructor's; ignored when a goal is picked).  Info keys beyond the standard
    ones: ``admissible_actions`` (upstream's ``get_available_actions`` as actions:
    ``"search[<your query>]"`` when the page has the search bar, then ``click[x]`` for every
    clickable), ``has_search_bar``, ``page``, ``instruction``, ``action_valid``, and after the
    purchase ``reward_info`` (the reward's components) and ``asin``, ``options``.

    Raises:
        DataNotFoundError: at construction, when the data files are missing.
        ConfigError: bad arguments.
    """

    env_name: ClassVar[str] = "WebShop"
    agent_prompt: ClassVar[AgentPrompt] = AgentPrompt(system=_SYSTEM)
    reset_options = MappingProxyType({
        "task_id": "goal index (int, or its decimal string)",
        "instruction": "a goal's instruction text (picks the first goal with that text)",
        "split": "'all', 'train', 'eval' (or 'validation') or 'test' (overrides the constructor's)",
    })

    def __init__(self, *, data_dir: str | os.PathLike | None = None, products_file: str | None = None,
                 attributes_file: str | None = None, human_file: str | None = None, human_goals: bool = False,
                 num_products: int | None = None, split: str = "all", observation_mode: str = "text",
                 show_attrs: bool = False, price_seed: int = 42, spacy_model: str = DEFAULT_SPACY_MODEL,
                 isolation: str = "thread", search_requires_search_bar: bool = False,
                 max_idle_time: float | None = 300.0, max_episode_steps: int | None = 15, **kwargs: Any) -> None:
        super().__init__(max_episode_steps=max_episode_steps, **kwargs)
        if observation_mode not in OBSERVATION_MODES:
            raise ConfigError(f"observation_mode={observation_mode!r} is not one of {OBSERVATION_MODES}")
        self._check_split(split)
        if isolation not in ("thread", "process"):
            raise ConfigError(f"isolation={isolation!r} is not 'thread' or 'process'")
        seconds = isinstance(max_idle_time, (int, float)) and not isinstance(max_idle_time, bool)
        if max_idle_time is not None and not (seconds and max_idle_time > 0):
            raise ConfigError(f"max_idle_time={max_idle_time!r} must be None or a number of seconds > 0")
        check_int("num_products", num_products, optional=True)
        folder = resolve_data_dir("webshop", data_dir, how_to_get=HOW_TO_GET,
                                  must_contain=DATA_MARKER if attributes_file is None else None)
        products, attributes, human = find_data_files(folder, products_file=products_file,
                                                      attributes_file=attributes_file, human_file=human_file,
                                                      human_goals=bool(human_goals))
        self.observation_mode = observation_mode
        self.split = split
        self.server_spec = InProcessSpec(
            factory=SERVER_FACTORY, isolation=isolation,
            kwargs={"products_path": str(products.resolve()),
                    "attributes_path": str(attributes.resolve()),
                    "human_path": str(human.resolve()) if human is not None else None,
                    "num_products": num_products, "human_goals": bool(human_goals), "show_attrs": bool(show_attrs),
                    "price_seed": int(price_seed), "spacy_model": spacy_model,
                    "search_requires_search_bar": bool(search_requires_search_bar)},
            max_instances=1, start_timeout=900.0, max_idle_time=max_idle_time, name="webshop-server")
        self._server: WebShopServerProxy | None = None
        self._session: str | None = None
        self._split_cache: dict[str, list[int]] = {}
        self._weights: list[float] | None = None

    @staticmethod
    def _check_split(split: Any) -> None:
        if split != "all" and split not in SPLITS:
            raise ConfigError(f"split={split!r} is not one of 'all', 'train', 'eval' (or 'validation'), 'test'")

    async def atask_ids(self, split: str | None = None) -> list[str]:
        """The goal indices (as decimal strings, ascending) of ``split`` (None: the env's ``split``),
        clipped to the goals of this catalog (see :meth:`WebShopServer.split_indices`).

        Raises:
            ConfigError: an unknown split.
        """
        split = self.split if split is None else split
        self._check_split(split)
        return [str(i) for i in await (await self.server()).split_indices(split)]

    # ------------------------------------------------------------------ server
    async def server(self) -> WebShopServerProxy:
        """The shared WebShop server (a global resource, acquired on first use), through its typed proxy."""
        if self._server is None or self._server.resource.obj is None:
            self._server = WebShopServerProxy(await self.manager.acquire_global(self.server_spec, user=self))
        return self._server

    async def aclose(self) -> None:
        """End the running episode and stop using the shared server: once no open env uses it, it is
        stopped after ``max_idle_time`` seconds (see the class docstring)."""
        await super().aclose()
        server, self._server = self._server, None
        manager = self._manager
        if server is not None and manager is not None and not manager.closed:
            manager.leave_global(self.server_spec, self)

    def close(self) -> None:
        """Sync wrapper of :meth:`aclose` (also when no episode is running: the env may still hold the server)."""
        if self._server is not None and not self._closed:
            run_sync(self.aclose())
            return
        super().close()

    async def _choose_goal(self, options: dict[str, Any]) -> int:
        split = options.get("split", self.split)
        self._check_split(split)
        instruction = options.get("instruction")
        if instruction is not None:
            if options.get("task_id") is not None:
                raise ConfigError(f"reset options task_id={options['task_id']!r} and instruction={instruction!r} "
                                  "both pick a goal; give one of them")
            return await (await self.server()).goal_index(instruction)
        if "task_id" in options and options["task_id"] is not None:
            tid = options["task_id"]
            try:
                idx = int(tid) if not isinstance(tid, bool) else None
            except (TypeError, ValueError):
                idx = None
            if idx is None or (isinstance(tid, float) and not tid.is_integer()):
                raise ConfigError(f"task_id={tid!r} must be a goal index (an int or its decimal string)")
            n = await (await self.server()).num_goals()
            if not 0 <= idx < n:
                raise ConfigError(f"task_id={tid!r} is out of range: {n} goals (0..{n - 1})")
            return idx
        if split not in self._split_cache:
            self._split_cache[split] = await (await self.server()).split_indices(split)
        indices = self._split_cache[split]
        if not indices:
            n = await (await self.server()).num_goals()
            raise ConfigError(f"split={split!r} has no goals in this catalog ({n} goals; upstream's splits assume "
                              f"the full catalog: test 0-499, eval 500-1499, train 1500-); use split='all'")
        if split == "all":
            if self._weights is None:
                self._weights = await (await self.server()).goal_weights()
            w = [self._weights[i] for i in indices]
            total = sum(w)
            return int(self.np_random.choice(indices, p=[x / total for x in w]))
        return int(indices[int(self.np_random.integers(len(indices)))])

    # ------------------------------------------------------------------ episode hooks
    async def _reset_episode(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        for attempt in (0, 1):
            try:
                idx = await self._choose_goal(options)
                seed = int(self.np_random.integers(2**31))
                view = await (await self.server()).new_session(self.episode_id or "", idx, self.observation_mode, seed)
                break
            except ResourceDied:
                if attempt:
                    raise
                log.warning("WebShop server died; starting a new one")
                await self.manager.destroy_global(self.server_spec)
                self._server = None
        self._session = self.episode_id
        self._task_id = str(idx)
        return view["observation"], self._info(view)

    async def _step_episode(self, action: str) -> StepResult:
        if self._session is None:
            raise ResetNeeded("WebShop: no session; call reset() first")
        view = await (await self.server()).step(self._session, action)
        info = self._info(view)
        info["action_valid"] = view["valid"]
        if view["done"]:
            info.update(score=view["reward"], won=view["reward"] >= 1.0, reward_info=view["reward_info"],
                        asin=view["asin"], options=view["options"])
        return view["observation"], float(view["step_reward"]), bool(view["done"]), False, info

    async def _end_of_episode(self) -> None:
        sid, self._session = self._session, None
        if sid is None or self._server is None or self._server.resource.obj is None:
            return
        try:
            await self._server.end_session(sid)
        except Exception as e:  # noqa: BLE001 - a dead server has no session to drop
            log.debug("WebShop: end_session(%s) failed: %s", sid, e)

    @staticmethod
    def _info(view: dict[str, Any]) -> dict[str, Any]:
        return {"admissible_actions": view["admissible_actions"], "has_search_bar": view["has_search_bar"],
                "page": view["page"], "instruction": view["instruction"]}

    # ------------------------------------------------------------------ expert and goal
    async def expert_action(self) -> str:
        """The scripted expert's next action (see ``WebShopServer.expert_action``).

        Its plan (search query and results page of the target) is computed once per episode.

        Raises:
            ResetNeeded: no episode is running.
        """
        if self._session is None:
            raise ResetNeeded("WebShop: no episode is running; call reset() first")
        action = await (await self.server()).expert_action(self._session)
        if action is None:
            raise ResetNeeded("WebShop: the episode has ended")
        return action

    async def goal(self) -> dict[str, Any]:
        """The current episode's goal (asin, instruction_text, attributes, goal_options, price_upper, ...).

        Raises:
            ResetNeeded: no episode is running.
        """
        if self._session is None:
            raise ResetNeeded("WebShop: no episode is running; call reset() first")
        return await (await self.server()).goal(int(self._task_id))
