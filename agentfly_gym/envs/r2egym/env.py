"""The R2E-Gym software-engineering environment (``agentfly/R2EGym-v0``).

An episode is one task: a repository with a bug at ``/testbed`` in a container, an issue
text, and hidden tests.  The agent acts with R2E-Gym's tools (``file_editor``, ``search``,
``execute_bash``, ``finish``; see :mod:`.actions` for the action formats) until it calls
``finish`` or reaches the step limit; then the hidden tests run and the reward is 1.0 only
when their parsed results equal the task's expected map exactly (R2E-Gym's rule, see
:mod:`.grading`).

Grading (``grading=``, :mod:`.grader`): ``"isolated"`` (the default) grades as the SWE-bench harness does (see
:mod:`.isolation`): the model's work leaves the episode's container as a filtered ``git diff`` of
``/testbed``, the hidden tests run on a clean copy of the task with that diff applied in a fresh
container of a separate grading pool, and their statuses are read from pytest's JUnit XML report.
``"in_place"`` is upstream R2E-Gym's way: the hidden tests run in the episode's own container and the
``pytest -rA`` text summary is parsed.  In place is hackable by the policy being graded (a
``conftest.py`` hook, a ``pytest.py`` or ``sitecustomize.py`` on the path, a wrapper around
``python3``, a background process, an exception message containing ``PASSED``); use it only to
reproduce upstream exactly.

Containers: one per rollout, acquired from the episode's rollout scope and reused for all
its turns.  Local tasks share ONE container spec (a generic image with python3 + pytest +
git), so the pool's containers are reused across rollouts and tasks; at reset the task's
repository is copied into ``/testbed`` and the backend's pool reset restores the clean
state afterwards.  Upstream rows run in their own ``docker_image`` as in R2E-Gym.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from ...errors import ConfigError, DataNotFoundError, EnvError
from ...limits import check_int
from ...resources.containers.api import ContainerResource
from ...resources.protocol import Manager
from ...resources.scope import RolloutScope
from ...resources.spec import ContainerSpec, Mount, check_max_idle_time
from ...tools.env import ToolPrompt, tool_call_id
from ...tools.formats import ToolCallError, format_tool_call, parse_tool_calls
from ...tools.tool import Tool
from ..base import AgentFlyEnv, StepResult
from ..prompting import AgentPrompt
from .actions import ActionParseError, ToolCall, check_call, find_blocks, parse_action
from .grader import GRADING_MODES, R2EGrading
from .local_tasks import TESTBED, default_tasks_dir
from .tasks import R2ETask, load_tasks
from .testbed import GIT, GIT_IDENT, TOOL_SCRIPT, TOOLS_DIR, repo_tar, tool_script
from .tools import SCHEMAS, TOOL_NAMES, r2e_tools

__all__ = ["DOCKER_IMAGE", "NATIVE_SYSTEM_PROMPT", "SYSTEM_PROMPT", "TOOL_FORMATS", "R2EAgentPrompt", "R2EGymEnv"]

log = logging.getLogger(__name__)

#: The generic Docker image of local tasks, built by ``agentfly_gym.images.build.build_image("envs/r2egym")``.
DOCKER_IMAGE = "agentfly/r2egym:latest"
#: PATH of upstream R2E-Gym images (their venv first), as in R2E-Gym's DockerRuntime.
UPSTREAM_PATH = "/root/.venv/bin:/root/.local/bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: A spec variable that keeps grading containers in a pool of their own (same image and limits).
_GRADING_POOL_ENV = ("AFG_R2E_POOL", "grading")

SYSTEM_PROMPT = """You are a programming agent working in a repository at /testbed.
Goal: make minimal changes to non-test files so that the issue described by the user is resolved.

Tools (call exactly ONE tool per reply, as the last thing in your reply):
- file_editor: view, create and edit files.
  command: one of view, create, str_replace, insert, undo_edit; path: absolute path (e.g. /testbed/pkg/mod.py).
  view: shows a file with line numbers (view_range=[start, end], end -1 = to the end) or lists a directory 2 levels deep.
  create: file_text = the new file's content (the path must not exist).
  str_replace: old_str must match exactly one place in the file (whitespace included); new_str replaces it.
  insert: new_str is inserted after line insert_line (0 = at the top).
  undo_edit: reverts the last edit of path.
- search: search_term (plain text) in path (a file: matching lines; a folder: files and match counts). Default path: /testbed.
- execute_bash: cmd, a bash command run in /testbed (time-limited, long output is cut).
- finish: submit your changes; the hidden tests are then run. Call it when you are done.

Format, XML:
<function=file_editor>
<parameter=command>view</parameter>
<parameter=path>/testbed</parameter>
</function>
or JSON: {"name": "execute_bash", "arguments": {"cmd": "python -m pytest -q"}}
Do not modify existing test files."""

#: The system prompt of ``tool_format="native"``: the chat template describes the tools (their ``tools=`` schemas).
NATIVE_SYSTEM_PROMPT = """You are a programming agent working in a repository at /testbed.
Goal: make minimal changes to non-test files so that the issue described by the user is resolved.

Use the tools you are given: search, file_editor (view, create and edit files), execute_bash (a bash command run in
/testbed; time-limited, long output is cut) and finish (submits your changes; the hidden tests are then run; call it
when you are done). Call exactly ONE tool per reply, as the last thing in your reply; only the first call of a
reply is run.
Do not modify existing test files."""

#: ``R2EGymEnv(tool_format=...)``: R2E-Gym's XML (the default), or native tool calls in the model family's format
#: (``"native"``: the family whose markers the reply holds; or one named, as in :data:`agentfly_gym.tools.FORMATS`).
TOOL_FORMATS = ("xml", "native", "hermes", "llama3", "mistral")

_NATIVE_HELP = ("Call exactly one tool per reply with your model's tool-call format, e.g. "
                '<tool_call>\n{"name": "execute_bash", "arguments": {"cmd": "ls /testbed"}}\n</tool_call>; '
                f"the tools are {', '.join(TOOL_NAMES)}.")

INSTANCE_TEMPLATE = """Repository root: /testbed

<github_issue>
{issue}
</github_issue>

Resolve the issue with minimal changes to non-test files, then call finish."""

_XML_OPEN = re.compile(r"<function\s*=")
_TOOL_CALL_OPEN = re.compile(r"<tool_call>")


class R2EAgentPrompt(AgentPrompt):
    """R2E-Gym's prompt; :meth:`parse_action` keeps the last tool-call block of a reply."""

    def parse_action(self, text: str) -> str:
        """The last ``<function=...>...</function>`` or ``<tool_call>...</tool_call>`` block of ``text``;
        else ``text`` stripped (the environment then parses a bare JSON call or reports the error)."""
        for opening, closing in ((_XML_OPEN, "</function>"), (_TOOL_CALL_OPEN, "</tool_call>")):
            blocks = find_blocks(text, opening, closing)  # linear; a lazy-body regex is quadratic here
            if blocks:
                m, body = blocks[-1]
                return m.group(0) + body + closing
        return text.strip()


class R2EGymEnv(R2EGrading, AgentFlyEnv):
    """R2E-Gym repository-repair tasks with R2E-Gym's tools and reward.

    Args:
        tasks: a task file (``tasks.jsonl`` of the local set or of R2E-Gym rows, ``.parquet``),
            a folder holding ``tasks.jsonl``, or a list of :class:`R2ETask`; default: the local
            task set in :func:`~.local_tasks.default_tasks_dir` (build it first with
            :func:`~.local_tasks.build_local_tasks`).
        backend: ``"auto"`` (Docker when an engine answers, else the sandbox), ``"docker"`` or ``"sandbox"``.
        image: the image of local tasks; default :data:`DOCKER_IMAGE` on Docker, ``"host"`` (the
            host's python3 + pytest) on the sandbox.  Upstream rows always use their ``docker_image``.
        cpus, memory, pids: container limits (cores, bytes or ``"2g"``, processes).
        disk: limit on what an episode may write in its container (bytes or ``"1g"``; ``None``: no
            limit): a model that fills the disk ends its own episode, never the host's disk.
        max_instances: pool capacity (containers alive at once for this spec).
        max_idle_time: seconds a container the pool keeps idle waits for the next episode before it
            is removed (default 300, ``ContainerSpec``'s); ``None`` keeps it until the manager closes.
        bash_timeout: seconds an ``execute_bash`` command may run before it is killed.
        test_timeout: seconds the hidden tests may run at grading.
        max_output: characters of tool output kept per observation.
        max_episode_steps: steps before the episode is graded and truncated.
        step_timeout: seconds per step (default ``bash_timeout + test_timeout + 60``, plus 180 with isolated
            grading: the diff's export and a grading container, which may have to start).
        grading: ``"isolated"`` (default: the model's filtered diff is graded in a fresh container, statuses
            from pytest's JUnit XML; see :mod:`.isolation`) or ``"in_place"`` (upstream R2E-Gym's: the
            hidden tests run in the episode's container and the text summary is parsed; hackable by the
            policy, for reproducing upstream only).
        grading_guard: with isolated grading, run the hidden tests through the grading launcher
            (:mod:`.grading_guard`: audit hooks, a snapshot of pytest's state and a signed seal, so that task
            code that rewrites pytest's reports scores 0).  ``False`` only to reproduce the grading without it.
        tamper_probes: with the launcher, add tamper probes to the graded run (:mod:`.guard_probes`: tests that
            must fail when the test framework, the standard library and builtins are honest, in every hidden test
            file under names and at places drawn per grading from its secret key; one that passes, or whose report
            is missing or doubled, scores 0 with ``info["grading"]["tampered"]``; they are left out of
            ``info["test_results"]``).  ``False`` only to measure what they add.
        tool_format: how the model calls the tools (:data:`TOOL_FORMATS`).  ``"xml"`` (the default): R2E-Gym's
            ``<function=...>`` format (or a JSON call), described in :data:`SYSTEM_PROMPT`; the observation goes
            back as a user message.  ``"native"``: the model family's own tool calls; ``agent_prompt.tools`` holds
            the tools' schemas (upstream R2E-Gym's function-calling definitions, :mod:`.tools`) for the chat
            template's ``tools=``, the reply is parsed in the format whose markers it holds (Hermes/Qwen
            ``<tool_call>``, Llama-3 JSON, Mistral ``[TOOL_CALLS]``; or name one: ``"hermes"``, ``"llama3"``,
            ``"mistral"``), and the result goes back as a ``role: "tool"`` message (``info["tool_messages"]``).
            As upstream's agent does with function calling, only the first call of a reply is run, and a reply
            with no call gets its error as a user message.  The same call gives the same observation and
            reward in both formats.
        manager, reset_timeout, render_mode: see :class:`~agentfly_gym.envs.base.AgentFlyEnv`.

    Reset options: ``{"task_id": str}`` or ``{"task_index": int}``; default a task drawn with
    ``self.np_random``.

    Info keys besides the standard ones: ``repo_name``, ``backend``, ``container`` (resource
    id), ``tool`` (the tool called), with native tool calls ``tool_calls`` (the calls parsed from the reply, as
    dicts) and ``tool_messages`` (the result as a ``role: "tool"`` message; absent when no call was made),
    ``test_results`` (the parsed ``{test: status}`` map, at
    grading), ``tests_timed_out``.  The step that grades sets ``score`` (= reward) and ``won``, and
    ``grading``: ``{"mode", "kept", "dropped"}`` (isolated: the paths whose changes were applied and
    ``{"path", "reason"}`` of those taken from the task instead, plus ``"log_test_results"``, upstream's
    parse of the same run's text log, for audit only, and ``"guard"``: ``{"applied", "sound", "problems",
    "audit_hook"}``, the launcher's verdict on the run; a run it finds tampered with scores 0) or
    ``{"mode": "in_place"}``.  A diff that cannot be
    exported or applied scores 0 with ``info["error"]`` set.

    Raises:
        DataNotFoundError: the default local task set is not built, or the task file is missing.
        ConfigError: bad arguments.
    """

    env_name = "R2EGym"
    reset_options = MappingProxyType({"task_id": "a task's id", "task_index": "int index into the task list"})
    agent_prompt = R2EAgentPrompt(system=SYSTEM_PROMPT)
    max_observation_length = 1 << 20
    #: well-formed tool calls the ``random`` policy chooses among (the action space is free text, so there
    #: are no ``admissible_actions``): look around, run a command, search, or give up
    random_actions: tuple[str, ...] = (
        f"<function=file_editor>\n<parameter=command>view</parameter>\n<parameter=path>{TESTBED}</parameter>\n"
        "</function>",
        f"<function=execute_bash>\n<parameter=cmd>ls {TESTBED}</parameter>\n</function>",
        f"<function=search>\n<parameter=search_term>def </parameter>\n<parameter=path>{TESTBED}</parameter>\n"
        "</function>",
        "<function=finish>\n</function>",
    )

    def __init__(self, *, tasks: str | os.PathLike | Sequence[R2ETask] | None = None, backend: str = "auto",
                 image: str | None = None, cpus: float = 1.0, memory: int | str | None = "2g", pids: int = 512,
                 disk: int | str | None = "1g",
                 max_instances: int = 4, max_idle_time: float | None = 300.0, bash_timeout: float = 90.0,
                 test_timeout: float = 300.0,
                 max_output: int = 10_000, max_episode_steps: int | None = 40, step_timeout: float | None = None,
                 grading: str = "isolated", grading_guard: bool = True, tamper_probes: bool = True,
                 tool_format: str = "xml",
                 manager: Manager | None = None, reset_timeout: float | None = 900.0,
                 render_mode: str | None = None, mounts: Sequence[Mount] = ()) -> None:
        if grading not in GRADING_MODES:
            raise ConfigError(f"grading={grading!r} is not one of {', '.join(map(repr, GRADING_MODES))}")
        if tool_format not in TOOL_FORMATS:
            raise ConfigError(f"tool_format={tool_format!r} is not one of {', '.join(map(repr, TOOL_FORMATS))}")
        if backend not in ("auto", "docker", "sandbox"):
            raise ConfigError(f"backend={backend!r} is not one of 'auto', 'docker', 'sandbox'")
        for name, v in (("bash_timeout", bash_timeout), ("test_timeout", test_timeout)):
            if not v or v <= 0:
                raise ConfigError(f"{name}={v!r} must be > 0 seconds")
        check_int("max_output", max_output, minimum=100, unit="characters")
        check_int("max_instances", max_instances)
        # isolated grading also exports the diff and prepares a fresh container (a start when none is idle)
        extra = 180.0 if grading == "isolated" else 0.0
        super().__init__(manager=manager, step_timeout=step_timeout or (bash_timeout + test_timeout + 60.0 + extra),
                         reset_timeout=reset_timeout, max_episode_steps=max_episode_steps, render_mode=render_mode)
        if tasks is None:
            path = default_tasks_dir() / "tasks.jsonl"
            if not path.is_file():
                raise DataNotFoundError(
                    f"the local R2E-Gym task set is not built ({path} missing). Build it with "
                    "`agentfly-gym r2e build-tasks` (downloads pinned sdists with pip; a few minutes), "
                    "or pass tasks=<R2E-Gym rows as .jsonl/.parquet>.")
            self.tasks = load_tasks(path)
        elif isinstance(tasks, (str, os.PathLike)):
            self.tasks = load_tasks(tasks)
        else:
            self.tasks = list(tasks)
            if not self.tasks or not all(isinstance(t, R2ETask) for t in self.tasks):
                raise ConfigError("tasks must be a path or a non-empty list of R2ETask")
        self._by_id = {t.task_id: t for t in self.tasks}
        self.backend = backend
        self.image = image
        self.cpus, self.memory, self.pids, self.disk = cpus, memory, pids, disk
        self.max_instances = max_instances
        check_max_idle_time(max_idle_time)
        self.max_idle_time = max_idle_time
        self.bash_timeout, self.test_timeout, self.max_output = bash_timeout, test_timeout, max_output
        self.grading = grading
        self.grading_guard = bool(grading_guard)
        self.tamper_probes = bool(tamper_probes)
        if not all(isinstance(m, Mount) for m in mounts):
            raise ConfigError(f"mounts must be Mount objects, got {[type(m).__name__ for m in mounts]}")
        self.mounts = tuple(mounts)
        self.tool_format = tool_format
        if tool_format != "xml":  # the class attributes stay R2E-Gym's XML prompt and actions
            self.agent_prompt = ToolPrompt(system=NATIVE_SYSTEM_PROMPT, tools=tuple(SCHEMAS[n] for n in TOOL_NAMES))
            self.random_actions = tuple(self._native_call(name, args) for name, args in (
                ("file_editor", {"command": "view", "path": TESTBED}), ("execute_bash", {"cmd": f"ls {TESTBED}"}),
                ("search", {"search_term": "def ", "path": TESTBED}), ("finish", {"command": "submit"})))
        self._tools: dict[str, Tool] = {}
        self._toolsets: dict[tuple[str, bool], dict[str, Tool]] = {}
        self._base: str | None = None
        self._task: R2ETask | None = None
        self._box: ContainerResource | None = None
        self._gold_applied = False
        self._plan: list[str] | None = None
        self._plan_episode: str | None = None

    # ------------------------------------------------------------------ specs
    async def atask_ids(self, split: str | None = None) -> list[str]:
        """The ids of the env's tasks, in list order.  The task list is the split (upstream's are separate data
        sets, e.g. R2E-Gym-Subset to train, SWE-Bench-Verified to test): one env per task file.

        Raises:
            ConfigError: a ``split`` other than None.
        """
        if split is not None:
            raise ConfigError(f"R2E-Gym has no split={split!r}: its tasks are the list it was given (tasks=); "
                              "make one env per split from separate task files")
        return [t.task_id for t in self.tasks]

    async def container_spec(self, task: R2ETask) -> ContainerSpec:
        """The container spec of ``task``: one generic spec for all local tasks (``image``, else the
        project's R2E image on Docker and the host's system in the sandbox), the row's image otherwise."""
        common = {"cpus": self.cpus, "memory": self.memory, "pids": self.pids, "disk": self.disk,
                  "workdir": TESTBED, "max_instances": self.max_instances, "max_idle_time": self.max_idle_time,
                  "name": "r2egym", "mounts": self.mounts}
        if task.local:
            if self.image is not None:
                return ContainerSpec(image=self.image, backend=self.backend, **common)
            return ContainerSpec(image=DOCKER_IMAGE, sandbox_image="host", backend=self.backend, **common)
        return ContainerSpec(image=task.docker_image or "", backend=self.backend, **common)

    async def grading_spec(self, task: R2ETask) -> ContainerSpec:
        """The spec of ``task``'s grading containers: :meth:`container_spec` in a pool of its own (a spec
        variable tells them apart), so grading never runs in a container the model used in its episode."""
        spec = await self.container_spec(task)
        env = dict(spec.env or ())
        env[_GRADING_POOL_ENV[0]] = _GRADING_POOL_ENV[1]
        return dataclasses.replace(spec, env=tuple(sorted(env.items())), name=f"{spec.name}-grading", mounts=())

    @property
    def container(self) -> ContainerResource | None:
        """The episode's container (None before the first reset): what an agent run outside the env's own
        loop (:func:`agentfly_gym.gateway.run_agent`) works in before the env grades it (``finish``)."""
        return self._box

    # ------------------------------------------------------------------ episode
    async def _reset_episode(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if "task_id" in options:
            task = self._by_id.get(options["task_id"])
            if task is None:
                raise ConfigError(f"task_id={options['task_id']!r} is not a known task; e.g. {list(self._by_id)[:5]}")
        elif "task_index" in options:
            i = options["task_index"]
            if not isinstance(i, int) or not 0 <= i < len(self.tasks):
                raise ConfigError(f"task_index={i!r} must be an integer in [0, {len(self.tasks)})")
            task = self.tasks[i]
        else:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self._task, self._task_id, self._gold_applied = task, task.task_id, False
        spec = await self.container_spec(task)
        box = await scope.acquire(spec)
        if not isinstance(box, ContainerResource):
            raise EnvError(f"the container spec gave a {type(box).__name__}, not a ContainerResource")
        self._box = box
        self._tools = self._toolset(spec, task)
        if task.local:
            tar = await asyncio.to_thread(repo_tar, str(task.repo_dir))
            await box.put_files({f"{TOOLS_DIR}/repo.tar": tar, TOOL_SCRIPT: tool_script()})
            setup = (f"set -e; mkdir -p {TESTBED}; find {TESTBED} -mindepth 1 -delete; "
                     f"tar -xf {TOOLS_DIR}/repo.tar -C {TESTBED}; rm -f {TOOLS_DIR}/repo.tar; cd {TESTBED}; "
                     "if command -v git >/dev/null 2>&1; then git init -q . && git add -A && "
                     "git -c user.name=agent -c user.email=agent@localhost commit -q -m 'initial state' "
                     ">/dev/null 2>&1 || true; fi")
        else:
            await box.put_files({TOOL_SCRIPT: tool_script()})
            # as R2E-Gym's DockerRuntime.setup_env: hide the tests and run_tests.sh from the agent
            setup = ("mv /r2e_tests /root/r2e_tests 2>/dev/null; mv /testbed/run_tests.sh /root/run_tests.sh 2>/dev/null; "
                     "cd /testbed && find . -name '*.pyc' -delete 2>/dev/null; true")
        r = await box.exec(setup, timeout=120.0, workdir="/", env=self._exec_env())
        if not r.ok:
            raise EnvError(f"R2E-Gym task {task.task_id}: preparing /testbed failed (exit {r.exit_code}): {r.output[-2000:]}")
        self._base = None
        if self.grading == "isolated":
            self._base = await self._snapshot_base(box, task)
        obs = INSTANCE_TEMPLATE.format(issue=task.issue)
        return obs, {"repo_name": task.repo_name, "backend": box.backend_name, "container": box.id}

    async def _snapshot_base(self, box: ContainerResource, task: R2ETask) -> str:
        """Record /testbed as the task gives it (a commit under ``refs/agentfly/base``, HEAD untouched); the
        model's diff is taken against it.  Local tasks: every file of the copy (also git-ignored ones);
        upstream rows: HEAD plus the files git does not ignore."""
        seed = "true" if task.local else f"({GIT} read-tree HEAD 2>/dev/null || true)"
        force = "-f" if task.local else ""
        cmd = (f"set -e; cd {TESTBED}; {GIT} rev-parse --git-dir >/dev/null 2>&1 || {GIT} init -q .; "
               f"d=$(mktemp -d); export GIT_INDEX_FILE=$d/index; {seed}; {GIT} add -A {force} >/dev/null 2>&1; "
               f"t=$({GIT} write-tree); c=$({GIT_IDENT} {GIT} commit-tree $t -m 'agentfly: task base'); "
               f"{GIT} update-ref refs/agentfly/base $c; rm -rf $d; echo AFG_BASE=$c")
        r = await box.exec(["bash", "-c", cmd], timeout=120.0, workdir="/", env=self._exec_env())
        m = re.search(r"AFG_BASE=([0-9a-f]{40,64})", r.output)
        if not r.ok or not m:
            raise EnvError(f"R2E-Gym task {task.task_id}: recording the base of /testbed with git failed "
                           f"(exit {r.exit_code}; isolated grading needs git in the image): {r.output[-2000:]}")
        return m.group(1)

    def _exec_env(self) -> dict[str, str]:
        if self._task is not None and not self._task.local:
            return {"PATH": UPSTREAM_PATH}
        return {}

    def _toolset(self, spec: ContainerSpec, task: R2ETask) -> dict[str, Tool]:
        """R2E-Gym's tools (:func:`.tools.r2e_tools`) on the container of ``spec``, by name (one set per spec)."""
        key = (spec.key, task.local)
        tools = self._toolsets.get(key)
        if tools is None:
            built = r2e_tools(spec, bash_timeout=self.bash_timeout, max_output=self.max_output, env=self._exec_env())
            tools = self._toolsets[key] = {t.name: t for t in built}
        return tools

    def _native_call(self, name: str, arguments: dict[str, Any]) -> str:
        """A reply calling ``name`` in this env's native format (Hermes for ``"native"``)."""
        return format_tool_call(name, arguments, "hermes" if self.tool_format == "native" else self.tool_format)

    def _parse_native(self, action: str, info: dict[str, Any]) -> tuple[ToolCall | None, str | None, str | None]:
        """``(call, call id, error)`` of a reply in native format: the first call (upstream's agent runs only that
        one), checked by R2E-Gym's rules; ``error`` is the observation when there is no valid call (with a call id
        when the model did make a call, to be answered by a tool message)."""
        try:
            calls = parse_tool_calls(action, "auto" if self.tool_format == "native" else self.tool_format)
        except ToolCallError as e:
            return None, None, f"ERROR: could not parse the tool call: {e}. {_NATIVE_HELP}"
        info["tool_calls"] = [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in calls]
        if not calls:
            return None, None, f"ERROR: could not parse the tool call: no tool call found in the reply. {_NATIVE_HELP}"
        first = calls[0]
        call_id = first.id or tool_call_id(self._steps + 1, 0)
        if not isinstance(first.arguments, dict):
            return None, call_id, (f"ERROR: could not parse the tool call: the arguments of {first.name!r} must be a "
                                   f"JSON object, got {type(first.arguments).__name__}")
        try:  # JSON's \ud800 escapes decode to lone surrogates, which no command line or file name can hold
            json.dumps(first.arguments, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return None, call_id, ("ERROR: could not parse the tool call: its arguments contain a lone surrogate, "
                                   "which is not valid Unicode text; write the character itself or leave it out.")
        try:
            return check_call(first.name, first.arguments, format_help=_NATIVE_HELP), call_id, None
        except ActionParseError as e:
            return None, call_id, f"ERROR: could not parse the tool call: {e}"

    async def _step_episode(self, action: str) -> StepResult:
        box, task = self._box, self._task
        assert box is not None and task is not None
        last = self.max_episode_steps is not None and self._steps + 1 >= self.max_episode_steps
        info: dict[str, Any] = {"repo_name": task.repo_name, "backend": box.backend_name, "container": box.id}
        native = self.tool_format != "xml"
        call_id: str | None = None
        if native:
            call, call_id, obs = self._parse_native(action, info)
            info["tool"] = None
        else:
            try:
                call = parse_action(action)
            except ActionParseError as e:
                obs = f"ERROR: could not parse the tool call: {e}"
                info["tool"] = None
                call = None
        if call is not None:
            info["tool"] = call.name
            if call.name == "finish":
                reward, ginfo, summary = await self._grade()
                info.update(ginfo)
                return self._answer(f"Submitted. {summary}", call, call_id, info), reward, True, False, info
            obs = await self._run_tool(call)
            if self._expert_plan_cache and action == self._expert_plan_cache[0]:
                self._gold_applied = True
        assert obs is not None
        if last:
            reward, ginfo, summary = await self._grade()
            info.update(ginfo)
            obs = f"{obs}\n\nStep limit reached; your changes were submitted. {summary}"
            return self._answer(obs, call, call_id, info), reward, False, True, info
        return self._answer(obs, call, call_id, info), 0.0, False, False, info

    def _answer(self, obs: str, call: ToolCall | None, call_id: str | None, info: dict[str, Any]) -> str:
        """``obs``; with native tool calls, also as the ``role: "tool"`` message answering the call (when the
        model made one) in ``info["tool_messages"]``."""
        if call_id is not None:
            name = call.name if call is not None else str(info["tool_calls"][0]["name"])
            info["tool_messages"] = [{"role": "tool", "name": name, "tool_call_id": call_id, "content": obs}]
        return obs

    async def _run_tool(self, call: ToolCall) -> str:
        """The observation of ``call`` (checked; not ``finish``): its tool run with its resources, acquired in the
        episode's rollout scope (the container of this episode)."""
        t = self._tools[call.name]
        resources = {name: await self.scope.acquire(spec) for name, spec in t.resources.items()}
        return await t(call.arguments, resources)

    # ------------------------------------------------------------------ expert
    @property
    def _expert_plan_cache(self) -> list[str] | None:
        """The expert plan of the running episode, if computed."""
        return self._plan if self._plan_episode == self._episode_id else None

    async def expert_action(self) -> str:
        """The next action of the expert: apply the task's gold patch (``execute_bash``), then ``finish``, in the
        env's ``tool_format``.

        The plan is computed once per episode.  The patch goes through a here-document and is
        applied with ``git apply`` (falling back to ``patch -p1``).

        Raises:
            ResetNeeded: no episode is running.
            EnvError: the task has no gold patch (an upstream row without a ``patch`` column).
        """
        _ = self.scope
        task = self._task
        assert task is not None
        plan = self._expert_plan_cache
        if plan is None:
            if not task.gold_patch:
                raise EnvError(f"task {task.task_id} has no gold patch (the row has no 'patch' column)")
            delim = "AFG_GOLD_PATCH_EOF"
            while delim in task.gold_patch:
                delim += "_"
            cmd = (f"cat > {TOOLS_DIR}/gold.patch <<'{delim}'\n{task.gold_patch.rstrip(chr(10))}\n{delim}\n"
                   f"cd {TESTBED} && (git apply --whitespace=nowarn {TOOLS_DIR}/gold.patch 2>/dev/null "
                   f"|| patch -p1 --forward --batch < {TOOLS_DIR}/gold.patch)")
            if self.tool_format == "xml":
                plan = [f"<function=execute_bash>\n<parameter=cmd>\n{cmd}\n</parameter>\n</function>",
                        "<function=finish>\n<parameter=command>submit</parameter>\n</function>"]
            else:  # the same calls in the native format
                plan = [self._native_call("execute_bash", {"cmd": cmd}),
                        self._native_call("finish", {"command": "submit"})]
            self._plan, self._plan_episode = plan, self._episode_id
        return plan[1] if self._gold_applied else plan[0]

    async def _end_of_episode(self) -> None:
        self._box = None


