"""ALFWorld fidelity: our ``ALFWorldEnv`` against alfworld 0.4.2's own ``AlfredTWEnv``, step for step.

Both environments play the same games with the same commands; after the reset and after every
step the script compares the observation string, the admissible command list (order included),
the reward and the done flag (ours: ``terminated or truncated``).

Reference side, built only from upstream pieces: ``AlfredTWEnv(config, "train").init_env(1)``
(``alfworld/agents/environment/alfred_tw_env.py``: TextWorld's gym env with ``AlfredDemangler``,
``AlfredInfos``, the ``AlfredExpert`` wrapper and TextWorld's ``Limit`` of 50 steps), on a copy
of each game.  alfworld 0.4.2's ``alfworld-download`` fetches the game files of release 2.1.2;
this project's data (like older downloads) holds release 2.1.1, so the copy is brought to 2.1.2
the way alfworld's repository script ``scripts/patch_tw-pddl.py`` does (three grammar rules
replaced, an inline ``help`` action appended to the grammar and a ``help`` action to the domain;
the script is not in the wheel, its steps are re-done here from the installed package's
``alfred.twl2``/``alfred.pddl`` text).  Our side upgrades in memory by other means
(``agentfly_gym.envs.alfworld.logic``), so agreement checks both.  With ``--as-stored`` both sides
play the files unchanged (``upgrade_games=False``).

Commands: by default ALFWorld's hand-coded expert (``AlfredExpert``, ``extra.expert_plan``), with
probes mixed in at fixed steps (``help``, ``look``, ``inventory``, ``go to`` a place that is not
admissible such as the one the agent stands at, a command in upper case, a made-up command, and
a random admissible command that the expert then has to recover from).  ``--policy planner``
replays our planner expert (Fast Downward plans, cached) with only the probes that change nothing.

Writes ``results/fidelity_alfworld.json`` (per game: steps compared, mismatches with both sides'
values, won) and ``results/fidelity_alfworld.png``.  ``tests/test_alfworld_fidelity.py`` runs the
same comparison on a few games.

    python benchmarks/fidelity_alfworld.py                 # 36 games + the Bowl-308 example
    python benchmarks/fidelity_alfworld.py --scale 0       # 6 games
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import re
import shutil
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The issue's example (valid_unseen): go to drawer 1, 2, 3.
EXAMPLE = "valid_unseen/look_at_obj_in_light-Bowl-None-DeskLamp-308/trial_T20190907_133919_856963"

_PROBES_ANY = ("help", "upper", "not_here", "look", "random", "inventory", "made_up")
_PROBES_INERT = ("not_here", "upper", "made_up")  # never admissible: change nothing, keep a plan valid


# --------------------------------------------------------------------------------------- reference
def _package_data() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("alfworld")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def upstream_patch(data: dict[str, Any]) -> dict[str, Any]:
    """A 2.1.1 game's JSON brought to 2.1.2 as alfworld's ``scripts/patch_tw-pddl.py`` does it.

    Its steps: the domain gets the ``help`` action before its last ``)``; the grammar gets
    ``You arrive at {lend.name}.`` -> ``You arrive at {r.name}.``, ``put {o} in/on {r}`` ->
    ``move {o} to {r}``, ``You put the {o.name} in/on the {r.name}.`` -> ``You move the {o.name}
    to the {r.name}.`` and, appended, an ``action help`` whose feedback is the help text inline.
    The help action's PDDL and text are taken from the installed package's data files.
    """
    pkg = _package_data()
    pddl = (pkg / "alfred.pddl").read_text()
    help_pddl = pddl[pddl.index("(:action help"):pddl.rindex(")")].rstrip() + "\n"
    twl2 = (pkg / "alfred.twl2").read_text()
    m = re.search(r'"help\.feedback":\s*\[\s*\{\s*"rhs":\s*"((?:[^"\\]|\\.)*)"', twl2)
    help_text = json.loads('"' + m.group(1) + '"')  # the JSON escapes (\n) decoded, as the script's literal
    help_grammar = '\naction help {\n    template :: "help";\n    feedback :: "' + help_text + '";\n}\n'
    out = dict(data)
    before, after = out["pddl_domain"].rsplit(")", 1)
    out["pddl_domain"] = f"{before}{help_pddl}){after}"
    g = out["grammar"]
    g = g.replace("You arrive at {lend.name}.", "You arrive at {r.name}.")
    g = g.replace("put {o} in/on {r}", "move {o} to {r}")
    g = g.replace("You put the {o.name} in/on the {r.name}.", "You move the {o.name} to the {r.name}.")
    out["grammar"] = g + help_grammar
    return out


def make_reference_copy(game_file: Path, dest: Path, *, patch: bool) -> Path:
    """Copy a trial folder (``game.tw-pddl`` + ``traj_data.json``) to ``dest``; patched to 2.1.2 if ``patch``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(game_file.parent / "traj_data.json", dest / "traj_data.json")
    data = json.loads(game_file.read_text())
    (dest / "game.tw-pddl").write_text(json.dumps(upstream_patch(data) if patch else data))
    return dest / "game.tw-pddl"


class Reference:
    """alfworld's ``AlfredTWEnv`` for one game (a trial folder), built as its ``init_env`` builds it."""

    def __init__(self, trial_dir: Path, *, max_steps: int = 50) -> None:
        from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

        config = {
            "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6], "domain_randomization": False,
                    "expert_type": "handcoded"},
            "dataset": {"data_path": str(trial_dir), "eval_id_data_path": str(trial_dir),
                        "eval_ood_data_path": str(trial_dir), "num_train_games": -1, "num_eval_games": -1},
            "general": {"training_method": "dagger"},
            "dagger": {"training": {"max_nb_steps_per_episode": max_steps}},
        }
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            tw = AlfredTWEnv(config, train_eval="train")  # "train": the expert wrapper is added
        if len(tw.game_files) != 1:
            raise RuntimeError(f"AlfredTWEnv found {len(tw.game_files)} games in {trial_dir}")
        self.env = tw.init_env(batch_size=1)

    def reset(self) -> tuple[str, dict[str, Any]]:
        obs, infos = self.env.reset()
        return obs[0], {k: v[0] for k, v in infos.items()}

    def step(self, command: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs, scores, dones, infos = self.env.step([command])
        return obs[0], float(scores[0]), bool(dones[0]), {k: v[0] for k, v in infos.items()}

    def close(self) -> None:
        self.env.close()


# --------------------------------------------------------------------------------------- comparison
_SEE = re.compile(r"you see (.*?)\.\s*\n", re.S)


def _receptacles(intro: str) -> list[str]:
    """The receptacles the intro lists ("you see a bed 1, a desk 2, ..., and a shelf 1.")."""
    m = _SEE.search(intro)
    if not m:
        return []
    parts = re.split(r",\s*(?:and\s+)?|\s+and\s+", m.group(1))
    return [re.sub(r"^(a|an)\s+", "", p.strip()) for p in parts if p.strip()]


def _probe(kind: str, admissible: list[str], receptacles: list[str], rng: random.Random) -> str | None:
    if kind in ("help", "look", "inventory"):
        return kind
    if kind == "not_here":  # e.g. the place the agent stands at, or one at the same location
        gone = [f"go to {r}" for r in receptacles if f"go to {r}" not in admissible]
        return rng.choice(gone) if gone else None
    if kind == "upper":
        return rng.choice(admissible).upper() if admissible else None
    if kind == "made_up":
        return "jump over the " + (rng.choice(receptacles) if receptacles else "table")
    if kind == "random":
        return rng.choice(admissible) if admissible else None
    raise ValueError(kind)


def _short(x: Any, n: int = 400) -> Any:
    s = x if isinstance(x, str) else json.dumps(x)
    return s if len(s) <= n else s[:n] + f"... ({len(s)} chars)"


async def compare_game(env, task_id: str, ref: Reference, *, policy: str = "handcoded", probe_every: int = 3,
                       seed: int = 0, max_steps: int = 50, script: list[str] | None = None,
                       engine_lock=None) -> dict[str, Any]:
    """Play one game through ``env`` (our ``ALFWorldEnv``, reset to ``task_id``) and ``ref`` side by side.

    Commands: ``script`` when given (played to its end or until done), else ``policy``
    (``"handcoded"``: the reference's hand-coded expert, ``"planner"``: our planner expert) with a
    probe every ``probe_every`` steps.

    Returns ``{"task_id", "steps", "compared", "mismatches": [{"step", "command", "field", "ours",
    "upstream"}], "won", "commands", "observations"}``; ``compared`` counts compared values
    (4 per step, 2 for the reset).
    """
    lock = engine_lock or contextlib.nullcontext()
    rng = random.Random(seed * 1_000_003 + zlib.crc32(task_id.encode()))
    probes = _PROBES_ANY if policy == "handcoded" else _PROBES_INERT
    out: dict[str, Any] = {"task_id": task_id, "policy": policy, "steps": 0, "compared": 0, "mismatches": [],
                           "won": None, "commands": [], "observations": []}

    def check(step: int, command: str | None, field: str, ours: Any, theirs: Any) -> None:
        out["compared"] += 1
        if ours != theirs:
            out["mismatches"].append({"step": step, "command": command, "field": field, "ours": _short(ours),
                                      "upstream": _short(theirs)})

    obs, info = await env.areset(options={"task_id": task_id})
    with lock:
        r_obs, r_info = ref.reset()
    check(0, None, "observation", obs, r_obs)
    check(0, None, "admissible", info["admissible_actions"], list(r_info["admissible_commands"]))
    out["observations"].append(r_obs)
    receptacles = _receptacles(r_obs)
    admissible = list(r_info["admissible_commands"])
    k = 0
    done = False
    for step in range(1, (len(script) if script is not None else max_steps) + 1):
        command = script[step - 1] if script is not None else None
        if command is None and step % probe_every == 0:
            command = _probe(probes[k % len(probes)], admissible, receptacles, rng)
            k += 1
        if command is None:
            if policy == "handcoded":
                command = (r_info.get("extra.expert_plan") or ["look"])[0]
            else:
                command = await env.expert_action()
        obs, reward, terminated, truncated, info = await env.astep(command)
        try:
            with lock:
                r_obs, r_reward, r_done, r_info = ref.step(command)
        except Exception as e:  # the hand-coded expert gives up with a bare Exception("Timeout")
            out["reference_error"] = f"{type(e).__name__}: {e}"
            break
        out["steps"] = step
        out["commands"].append(command)
        out["observations"].append(r_obs)
        check(step, command, "observation", obs, r_obs)
        check(step, command, "admissible", info["admissible_actions"], list(r_info["admissible_commands"]))
        check(step, command, "reward", float(reward), r_reward)
        check(step, command, "done", bool(terminated or truncated), r_done)
        admissible = list(r_info["admissible_commands"])
        done = bool(terminated or truncated or r_done)
        if done:
            break
    out["won"] = bool(r_info.get("won"))
    if not done:
        await env.aend_episode()
    return out


async def run_comparison(games: list[str], *, data_root: Path, work_dir: Path, upgrade: bool = True,
                         policy: str = "handcoded", seed: int = 0, probe_every: int = 3,
                         on_game=None) -> list[dict[str, Any]]:
    """Compare ``games`` (task ids ``<split>/<task>/<trial>``) through both environments, one after another."""
    from agentfly_gym.envs.alfworld import ALFWorldEnv
    from agentfly_gym.envs.alfworld import simulator as sim_module
    from agentfly_gym.resources.manager import ResourceManager

    results = []
    async with ResourceManager() as manager:
        envs: dict[str, Any] = {}
        for i, task_id in enumerate(games):
            split = task_id.split("/", 1)[0]
            if split not in envs:
                envs[split] = ALFWorldEnv(data_dir=data_root, split=split, manager=manager, max_instances=1,
                                          upgrade_games=upgrade)
            env = envs[split]
            game = env.index.by_task_id(task_id)
            trial = make_reference_copy(game.game_file, work_dir / f"g{i:03d}", patch=upgrade).parent
            ref = Reference(trial)
            try:
                res = await compare_game(env, task_id, ref, policy=policy, seed=seed, probe_every=probe_every,
                                         engine_lock=sim_module._ENGINE_LOCK)
            finally:
                ref.close()
            res["task_type"] = game.task_type
            results.append(res)
            if on_game is not None:
                on_game(res)
        for env in envs.values():
            await env.aclose()
    return results


def pick_games(data_root: Path, per_type: int, seed: int) -> list[str]:
    """``per_type`` games of each task type from each of valid_seen and valid_unseen (seeded), plus EXAMPLE."""
    from agentfly_gym.envs.alfworld import TASK_TYPES, load_index

    rng = random.Random(seed)
    picked = [EXAMPLE]
    for split in ("valid_seen", "valid_unseen"):
        index = load_index(data_root, split)
        for name in TASK_TYPES.values():
            ids = sorted(g.task_id for g in index.games if g.task_type == name and g.task_id != EXAMPLE)
            picked += rng.sample(ids, min(per_type, len(ids)))
    return picked


# --------------------------------------------------------------------------------------- script
def main() -> int:
    import _common as C

    C.setup_env_vars()
    p = C.base_parser(__doc__.split("\n", 1)[0])
    p.add_argument("--per-type", type=int, default=3, help="games per task type and split at --scale 1")
    p.add_argument("--policy", choices=("handcoded", "planner"), default="handcoded")
    p.add_argument("--as-stored", action="store_true", help="play the game files unchanged on both sides")
    p.add_argument("--probe-every", type=int, default=3)
    args = p.parse_args()
    from agentfly_gym.envs.alfworld import resolve_alfworld_root

    name = "fidelity_alfworld" + ("_as_stored" if args.as_stored else "") + ("_planner" if args.policy == "planner" else "")
    res = C.Result(name, args)
    root = resolve_alfworld_root()
    per_type = C.scaled(args.per_type, args.scale, minimum=0)
    games = pick_games(root, per_type, args.seed) if per_type else [EXAMPLE]
    if per_type == 0:  # smoke size: the example and one game of each other task type
        games = [EXAMPLE] + pick_games(root, 1, args.seed)[1:6]

    def progress(r: dict[str, Any]) -> None:
        print(f"[{name}] {r['task_id']}: {r['steps']} steps, {r['compared']} values, "
              f"{len(r['mismatches'])} mismatches, won={r['won']}", flush=True)

    with tempfile.TemporaryDirectory(prefix="alfworld-fidelity-") as tmp:
        results = asyncio.run(run_comparison(games, data_root=root, work_dir=Path(tmp), upgrade=not args.as_stored,
                                             policy=args.policy, seed=args.seed, probe_every=args.probe_every,
                                             on_game=progress))
    for r in results:
        r.pop("observations", None)
    res.data.update({
        "games": len(results), "upgrade_games": not args.as_stored, "policy": args.policy,
        "steps": sum(r["steps"] for r in results), "values_compared": sum(r["compared"] for r in results),
        "mismatches": sum(len(r["mismatches"]) for r in results),
        "games_with_mismatch": sum(bool(r["mismatches"]) for r in results),
        "won": sum(bool(r["won"]) for r in results), "reference_errors": sum("reference_error" in r for r in results),
        "per_game": results,
    })
    print(f"[{name}] {res.data['games']} games, {res.data['steps']} steps, {res.data['values_compared']} values "
          f"compared, {res.data['mismatches']} mismatches, {res.data['won']} won", flush=True)

    def plot(res: C.Result) -> None:
        by_type: dict[str, list[dict[str, Any]]] = {}
        for r in res.data["per_game"]:
            by_type.setdefault(r["task_type"], []).append(r)
        names = sorted(by_type)
        fig, ax = C.subplots(figsize=(9, 4))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [sum(r["steps"] for r in by_type[n]) for n in names], 0.4, label="steps compared")
        ax.bar([x + 0.2 for x in xs], [sum(len(r["mismatches"]) for r in by_type[n]) for n in names], 0.4,
               label="mismatches", color="tab:red")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([n.replace("_", "\n") for n in names], fontsize=7)
        ax.set_title(f"ALFWorld vs alfworld {res.data['packages'].get('alfworld')} AlfredTWEnv: "
                     f"{res.data['games']} games, {res.data['mismatches']} mismatches")
        ax.legend(fontsize=8)
        C.save_figure(res, fig)

    C.finish(res, plot)
    return 0 if res.data["mismatches"] == 0 and not res.data["reference_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
