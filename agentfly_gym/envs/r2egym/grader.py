"""Grading an R2E-Gym episode: the hidden tests run when the agent calls ``finish`` (or the episode ends).

``grading="isolated"`` (the default) grades as the SWE-bench harness does (:mod:`.isolation`): the model's work
leaves the episode's container as a filtered ``git diff`` of ``/testbed`` and the hidden tests run on a clean
copy of the task with that diff applied, in a fresh container of a separate grading pool, their statuses read
from pytest's JUnit XML report.  ``grading="in_place"`` is upstream R2E-Gym's way: the hidden tests run in the
episode's own container and the ``pytest -rA`` text summary is parsed (:mod:`.grading`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import secrets
import shlex
import tarfile
from importlib import resources
from typing import Any

from ...errors import EnvError
from ...resources.containers.api import ContainerResource, ExecResult
from .grading import compare_test_maps, parse_log_pytest, reward_from_log
from .isolation import (DiffRules, filter_diff, guard_command, hidden_test_rules, isolated_test_map, plugin_modules,
                        seal_problems, shadow_candidates, without_probes)
from .local_tasks import TESTBED
from .tasks import R2ETask
from .testbed import GIT, TOOLS_DIR, repo_tar

__all__ = ["GRADE_DIR", "GRADING_MODES", "JUNIT_REPORT", "MAX_DIFF_BYTES", "R2EGrading"]

#: ``grading=`` of :class:`~.env.R2EGymEnv`
GRADING_MODES = ("isolated", "in_place")
#: Where isolated grading keeps its files in the grading container (outside /testbed; the model never runs there).
GRADE_DIR = "/tmp/.afg_grade"
JUNIT_REPORT = f"{GRADE_DIR}/report.xml"
#: The grading launcher (``grading_guard.py``), the key it reads and deletes at start-up, and the seal it writes.
GUARD_SCRIPT = f"{GRADE_DIR}/guard.py"
_GUARD_KEY = f"{GRADE_DIR}/key"
_GUARD_SEAL = f"{GRADE_DIR}/seal.json"
#: The largest diff (bytes) that leaves an episode; a larger one scores 0 with ``info["error"]``.
MAX_DIFF_BYTES = 20_000_000
_MAX_REPORT_BYTES = 50_000_000
# the probe run by the grading container's own interpreter (-I: no PYTHONPATH, user site or cwd): which of
# the new top-level names would shadow a module importable from elsewhere (standard library, site-packages)
_SHADOW_PROBE = ("import importlib.util as u, os, sys\n"
                 "for n in sys.argv[1:]:\n"
                 "    d, _, m = n.rpartition('/')\n"
                 "    b = os.path.join('/testbed', d, m)\n"
                 "    if os.path.exists(b) or os.path.exists(b + '.py'):\n"
                 "        continue\n"
                 "    try:\n"
                 "        s = u.find_spec(m)\n"
                 "    except Exception:\n"
                 "        s = None\n"
                 "    if s is not None:\n"
                 "        print('AFG_SHADOW=' + n)\n")


class R2EGrading:
    """The grading of :class:`~.env.R2EGymEnv` (a mixin of it).

    It uses the env's episode (``_box``, ``_task``, ``_base``: the task-base commit, ``scope``), its settings
    (``grading``, ``test_timeout``, ``bash_timeout``), ``_exec_env()`` and ``grading_spec(task)``.
    """

    async def _grade(self) -> tuple[float, dict[str, Any], str]:
        """Run the hidden tests now (as ``self.grading`` says); returns (reward, info, one-line summary)."""
        if self.grading == "isolated":
            return await self._grade_isolated()
        reward, info, summary = await self._grade_in_place()
        info["grading"] = {"mode": "in_place"}
        return reward, info, summary

    @staticmethod
    def _summary(reward: float, parsed: dict[str, str], timed_out: bool, test_timeout: float) -> str:
        n_pass = sum(v == "PASSED" for v in parsed.values())
        summary = (f"Hidden tests: {n_pass}/{len(parsed)} passed; "
                   f"{'the issue is resolved' if reward == 1.0 else 'the issue is not resolved'}.")
        if timed_out:
            summary += f" (the tests ran past {test_timeout:g}s and were killed)"
        return summary

    async def _export_diff(self, box: ContainerResource) -> bytes:
        """The model's changes to /testbed against the task base: ``git diff --binary`` (new files included,
        git-ignored new files not, as SWE-bench's harness), read as base64 from the command's output.

        Raises:
            _GradingFault: git failed in the episode's container, or the diff is over ``MAX_DIFF_BYTES``.
        """
        cmd = (f"set -o pipefail; cd {TESTBED} || exit 3; d=$(mktemp -d) || exit 3; export GIT_INDEX_FILE=$d/index; "
               f"{GIT} read-tree {self._base} 2>/dev/null && {GIT} add -A >/dev/null 2>&1 && "
               f"{GIT} -c core.quotepath=on diff --cached --binary --no-renames --no-color --no-ext-diff "
               f"--no-textconv --full-index --src-prefix=a/ --dst-prefix=b/ {self._base} 2>/dev/null "
               f"| head -c {MAX_DIFF_BYTES + 1} | base64 -w0; rc=$?; rm -rf $d; echo; echo AFG_RC=$rc")
        limit = (MAX_DIFF_BYTES + 1) * 4 // 3 + 1000
        r = await box.exec(["bash", "-c", cmd], timeout=max(120.0, self.bash_timeout), workdir="/",
                           env=self._exec_env(), max_output=limit)
        body, _, rc = r.output.rpartition("\nAFG_RC=")
        if r.timed_out or r.truncated or rc.strip() != "0":
            raise _GradingFault(f"the changes to {TESTBED} could not be exported with git "
                                f"(exit {r.exit_code}{', timed out' if r.timed_out else ''}): {r.output[-500:]!r}")
        try:
            diff = base64.b64decode(body.rsplit("\n", 1)[-1].strip(), validate=True)
        except ValueError:
            raise _GradingFault("the exported diff is not valid base64") from None
        if len(diff) > MAX_DIFF_BYTES:
            raise _GradingFault(f"the changes to {TESTBED} exceed {MAX_DIFF_BYTES} bytes as a diff")
        return diff

    async def _grade_isolated(self) -> tuple[float, dict[str, Any], str]:
        """Grade the episode's filtered diff on a clean copy of the task in a fresh grading container."""
        box, task, scope = self._box, self._task, self.scope
        assert box is not None and task is not None and self._base is not None
        record: dict[str, Any] = {"mode": "isolated", "kept": [], "dropped": []}
        fail_info = {"test_results": {}, "tests_timed_out": False, "score": 0.0, "won": False, "grading": record}
        try:
            diff = await self._export_diff(box)
        except _GradingFault as e:
            return 0.0, {**fail_info, "error": str(e)}, f"Hidden tests not run: {e}."
        gspec = await self.grading_spec(task)
        gbox = await scope.acquire(gspec)
        if not isinstance(gbox, ContainerResource) or gbox is box:
            raise EnvError("the grading spec did not give a fresh container")
        try:
            return await self._grade_in(gbox, task, diff, record, fail_info)
        finally:
            await scope.release(gspec)

    async def _grade_in(self, gbox: ContainerResource, task: R2ETask, diff: bytes, record: dict[str, Any],
                        fail_info: dict[str, Any]) -> tuple[float, dict[str, Any], str]:
        env = self._exec_env()
        hidden_files, hidden_dirs = hidden_test_rules(task.hidden_tests)
        # 1. a clean copy of the task, and which new top-level modules would shadow an installed one
        names = shadow_candidates(diff)
        probe = f"python3 -I -c {shlex.quote(_SHADOW_PROBE)} {' '.join(map(shlex.quote, names))}" if names else "true"
        if task.local:
            tar = await asyncio.to_thread(repo_tar, str(task.repo_dir))
            await gbox.put_files({f"{GRADE_DIR}/repo.tar": tar})
            setup = (f"set -e; mkdir -p {TESTBED}; find {TESTBED} -mindepth 1 -delete; "
                     f"tar -xf {GRADE_DIR}/repo.tar -C {TESTBED}; rm -f {GRADE_DIR}/repo.tar; cd /; {probe}; "
                     "printf 'AFG_PLUGINS=%s\\n' \"$PYTEST_PLUGINS\"")
        else:
            setup = ("mv /r2e_tests /root/r2e_tests 2>/dev/null; mv /testbed/run_tests.sh /root/run_tests.sh 2>/dev/null; "
                     f"cd /testbed && find . -name '*.pyc' -delete 2>/dev/null; cd /; {probe}; "
                     "printf 'AFG_PLUGINS=%s\\n' \"$PYTEST_PLUGINS\"; "
                     "for f in /root/run_tests.sh /run_tests.sh; do if [ -f $f ]; then "
                     "printf 'AFG_SCRIPT=%s\\n' \"$(base64 -w0 $f)\"; break; fi; done")
        r = await gbox.exec(setup, timeout=120.0, workdir="/", env=env)
        if not r.ok:
            raise EnvError(f"R2E-Gym task {task.task_id}: preparing the grading copy failed (exit {r.exit_code}): "
                           f"{r.output[-2000:]}")
        shadowing = set(_printed(r.output, "AFG_SHADOW"))
        script = task.run_tests if task.local else _image_script(r.output)
        # 2. the filtered diff, then the hidden tests from the task
        plugins = plugin_modules(script, "".join(_printed(r.output, "AFG_PLUGINS")))
        kept = filter_diff(diff, DiffRules(hidden_files, hidden_dirs, frozenset(shadowing), plugins))
        record["kept"], record["dropped"] = kept.kept, kept.dropped
        files: dict[str, bytes | str] = {}
        if kept.diff:
            files[f"{GRADE_DIR}/model.diff"] = kept.diff
        if task.local:
            files[f"{GRADE_DIR}/hidden.tar"] = await asyncio.to_thread(_hidden_tar, task)
        # the grading launcher runs pytest in place of ``python -m pytest`` when the script does so (see isolation)
        guarded = guard_command(script, GUARD_SCRIPT) if script is not None and self.grading_guard else None
        key = secrets.token_hex(32)
        if guarded is not None:
            files[GUARD_SCRIPT] = _guard_source()
            for helper in ("guard_namespaces.py", "guard_probes.py"):  # loaded by the launcher
                files[f"{GRADE_DIR}/{helper}"] = _guard_source(helper)
            files[_GUARD_KEY] = key + ("\n" if self.tamper_probes else "\nprobes=0\n")
        if task.local or guarded is not None:
            files[f"{GRADE_DIR}/run_tests.sh"] = guarded if guarded is not None else script
        record["guard"] = {"applied": guarded is not None}
        if files:
            await gbox.put_files(files)
        apply = (f"cd {TESTBED} && {GIT} apply --whitespace=nowarn {GRADE_DIR}/model.diff 2>&1"
                 if kept.diff else "true")
        if task.local:
            apply += f" && tar -xf {GRADE_DIR}/hidden.tar -C {TESTBED}"
        r = await gbox.exec(apply, timeout=120.0, workdir="/", env=env)
        if not r.ok:
            msg = f"the model's diff does not apply to a clean copy of the task: {r.output[-1000:]}"
            return 0.0, {**fail_info, "error": msg}, f"Hidden tests not run: {msg}."
        # 3. the hidden tests, with a JUnit report outside /testbed
        test_env = {**env, "PYTEST_ADDOPTS": f"--junitxml={JUNIT_REPORT} -o junit_family=xunit1"}
        cmd = self._test_command(task, f"{GRADE_DIR}/run_tests.sh", guarded=guarded is not None)
        r = await gbox.exec(cmd, timeout=self.test_timeout, workdir=TESTBED, env=test_env, max_output=2_000_000)
        xml, seal = await _read_outputs(gbox)
        try:
            parsed = isolated_test_map(xml, r.output, test_files=task.hidden_tests)
        except ValueError as e:
            return 0.0, {**fail_info, "error": str(e)}, f"Hidden tests not graded: {e}."
        body: dict[str, Any] = {}
        if guarded is not None:
            problems, body = seal_problems(seal, key.encode(), xml, parsed, probes=self.tamper_probes)
            record["guard"].update({"sound": not problems, "problems": problems, "audit_hook": body.get("audit")})
            parsed = without_probes(parsed, body)  # the probes' failures are no hidden test's
            record["tampered"] = [p.removeprefix("tampered: ") for p in problems]
            record["probes"] = {"run": len(body.get("probes") or ()), "notes": list(body.get("probe_notes") or ())}
        reward = compare_test_maps(parsed, task.expected)
        if guarded is not None and record["guard"]["problems"] and not (xml is None and r.timed_out):
            reward = 0.0
        record["log_test_results"] = without_probes(parse_log_pytest(r.output), body)
        info = {"test_results": parsed, "tests_timed_out": r.timed_out, "score": reward, "won": reward == 1.0,
                "grading": record}
        if xml is None and not r.timed_out:
            info["error"] = "the hidden tests wrote no JUnit report (pytest did not start or crashed)"
        summary = self._summary(reward, parsed, r.timed_out, self.test_timeout)
        if record["guard"].get("problems") and not (xml is None and r.timed_out):
            summary += f" The test run was tampered with: {record['guard']['problems'][0]}."
        return reward, info, summary

    @staticmethod
    def _test_command(task: R2ETask, local_script: str, *, guarded: bool = False) -> str | list[str]:
        if task.local:
            return ["sh", local_script]
        run = (f"bash {local_script}" if guarded else
               "if [ -f /root/run_tests.sh ]; then bash /root/run_tests.sh; else bash /run_tests.sh; fi")
        return ("rm -rf /testbed/r2e_tests; if [ -d /root/r2e_tests ]; then ln -s /root/r2e_tests /testbed/r2e_tests; "
                f"elif [ -d /r2e_tests ]; then ln -s /r2e_tests /testbed/r2e_tests; fi; {run}")

    async def _grade_in_place(self) -> tuple[float, dict[str, Any], str]:
        """Upstream R2E-Gym's grading: the hidden tests run in the episode's own container."""
        box, task = self._box, self._task
        assert box is not None and task is not None
        if task.local:
            files: dict[str, bytes | str] = {f"{TESTBED}/{rel}": (task.hidden_dir / rel).read_bytes()
                                              for rel in task.hidden_tests}
            files[f"{TOOLS_DIR}/run_tests.sh"] = task.run_tests
            await box.put_files(files)
        cmd = self._test_command(task, f"{TOOLS_DIR}/run_tests.sh")
        r: ExecResult = await box.exec(cmd, timeout=self.test_timeout, workdir=TESTBED, env=self._exec_env(),
                                       max_output=2_000_000)
        reward, parsed = reward_from_log(r.output, task.expected)
        summary = self._summary(reward, parsed, r.timed_out, self.test_timeout)
        info = {"test_results": parsed, "tests_timed_out": r.timed_out, "score": reward, "won": reward == 1.0}
        return reward, info, summary


def _guard_source(name: str = "grading_guard.py") -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _printed(setup_output: str, name: str) -> list[str]:
    """The values the grading container's setup printed as ``NAME=value`` lines, in order."""
    prefix = name + "="
    return [line[len(prefix):] for line in setup_output.splitlines() if line.startswith(prefix)]


def _image_script(setup_output: str) -> str | None:
    """The task image's ``run_tests.sh``, as the grading container's setup printed it (None if there is none)."""
    for value in _printed(setup_output, "AFG_SCRIPT")[:1]:
        try:
            return base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except ValueError:
            return None
    return None


async def _read_outputs(gbox: ContainerResource) -> tuple[bytes | None, bytes | None]:
    """The JUnit report and the launcher's seal from the grading container (None for a missing or unreadable one)."""
    cmd = (f"for f in {JUNIT_REPORT} {_GUARD_SEAL}; do if [ -f $f ]; then head -c {_MAX_REPORT_BYTES} $f | base64 -w0; "
           "else printf -; fi; echo; done")
    rep = await gbox.exec(cmd, timeout=120.0, workdir="/", max_output=2 * (_MAX_REPORT_BYTES * 4 // 3) + 1000)
    out: list[bytes | None] = [None, None]
    if rep.ok and not rep.truncated:
        for i, line in enumerate(rep.output.splitlines()[:2]):
            if line.strip() not in ("", "-"):
                try:
                    out[i] = base64.b64decode(line.strip(), validate=True)
                except ValueError:
                    out[i] = None
            elif line.strip() == "":
                out[i] = b""
    return out[0], out[1]


class _GradingFault(Exception):
    """The episode's work could not leave its container as a diff (scored 0 with ``info["error"]``)."""


def _hidden_tar(task: R2ETask) -> bytes:
    """The hidden test files of a local task as a tar at their repository paths."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for rel in task.hidden_tests:
            tf.add(task.hidden_dir / rel, arcname=rel, recursive=False)
    return buf.getvalue()
