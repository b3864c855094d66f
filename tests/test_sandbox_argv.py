"""The sandbox's exec command line (``resources/containers/sandbox/argv.py``), checked as data: no
process runs, no file is touched.  The sandbox backend and security tests run the same command lines
for real (tests/test_sandbox_backend.py, tests/test_security.py, tests/test_isolation.py)."""

from __future__ import annotations

import pytest

from agentfly_gym.errors import ConfigError
from agentfly_gym.resources.containers.sandbox.argv import DEFAULT_PATH, SandboxLayout, exec_argv


def _layout() -> SandboxLayout:
    return SandboxLayout(ro=[("/usr", "/img/usr")], links={"/bin": "usr/bin"}, masks=[("/etc/secret", True),
                         ("/etc/key", False)], writable=[("/tmp", "/state/tmp"), ("/root", "/state/root")],
                         late_ro=[("/opt/py", "/opt/py")], mounts=[("/data", "/host/data", False),
                                                                   ("/out", "/host/out", True)],
                         path_prefix="/opt/py/bin:")


def _pairs(argv: list[str], option: str, n: int = 2) -> list[tuple[str, ...]]:
    return [tuple(argv[i + 1:i + 1 + n]) for i, a in enumerate(argv) if a == option]


def test_isolation_options_binds_and_environment():
    argv = exec_argv(_layout(), ["python3", "-c", "print(1)"], workdir="/root", env={"A": "1", "PATH": "/x"},
                     uid=0, gid=0, home="/root", bwrap="/usr/bin/bwrap", seccomp_fd=7)
    assert argv[:4] == ["/usr/bin/bwrap", "--die-with-parent", "--new-session", "--unshare-all"]
    assert "--share-net" not in argv  # no network unless the spec asks
    i = argv.index("--unshare-user")
    assert argv[i:i + 8] == ["--unshare-user", "--uid", "0", "--gid", "0", "--cap-drop", "ALL", "--disable-userns"]
    assert _pairs(argv, "--ro-bind") == [("/img/usr", "/usr"), ("/proc/sys", "/proc/sys"), ("/dev/null", "/etc/key"),
                                         ("/opt/py", "/opt/py"), ("/host/data", "/data")]
    assert _pairs(argv, "--bind") == [("/state/tmp", "/tmp"), ("/state/root", "/root"), ("/host/out", "/out")]
    assert _pairs(argv, "--symlink") == [("usr/bin", "/bin")]
    assert _pairs(argv, "--tmpfs", 3) == [("/etc/secret", "--remount-ro", "/etc/secret")]
    # the interpreter's read-only bind comes after the writable state it may lie in; / is read-only last
    assert argv.index("/opt/py") > argv.index("/state/root")
    assert _pairs(argv, "--remount-ro", 1)[-1] == ("/",)
    assert argv.index("--seccomp") > argv.index("/out")
    assert _pairs(argv, "--seccomp", 1) == [("7",)]
    assert argv.index("--clearenv") < argv.index("--setenv")
    env = dict(_pairs(argv, "--setenv"))
    assert env == {"PATH": "/x", "HOME": "/root", "LANG": "C.UTF-8", "A": "1"}  # the given env wins
    assert argv[-6:] == ["--chdir", "/root", "--", "python3", "-c", "print(1)"]


def test_user_network_and_optional_parts():
    argv = exec_argv(SandboxLayout(), ["id"], workdir="/", env={}, uid=1000, gid=100, home="/home/u",
                     network=True, disable_userns=False)
    assert argv[0] == "bwrap"
    assert "--share-net" in argv
    assert "--disable-userns" not in argv
    assert "--seccomp" not in argv
    assert _pairs(argv, "--uid", 1) == [("1000",)]
    assert _pairs(argv, "--gid", 1) == [("100",)]
    assert dict(_pairs(argv, "--setenv")) == {"PATH": DEFAULT_PATH, "HOME": "/home/u", "LANG": "C.UTF-8"}


def test_root_manager_drops_to_host_user_and_stages_unreachable_sources():
    closed = {"/root/.pyenv/versions/3.11/lib": "/root/.pyenv", "/root/.pyenv/bin": "/root/.pyenv",
              "/srv/sbx/state/tmp": "/srv/sbx"}
    layout = SandboxLayout(ro=[("/lib", "/root/.pyenv/versions/3.11/lib")], writable=[("/tmp", "/srv/sbx/state/tmp")],
                           late_ro=[("/py", "/root/.pyenv/bin")])
    calls = []

    def unshare() -> str:
        calls.append(1)
        return "/usr/bin/unshare"

    argv = exec_argv(layout, ["true"], workdir="/", env={}, uid=0, gid=0, home="/root",
                     drop_to=("/usr/bin/setpriv", 1_600_000_123, 1_600_000_123), stage_point=closed.get,
                     is_dir=lambda p: True, unshare=unshare, cgroup_dirs=["/sys/fs/cgroup/agentfly/x"], file_blocks=8)
    # outermost: join the cgroup and cap file sizes, then stage as root, then drop to the host user
    assert argv[:3] == ["/bin/sh", "-ec", "echo $$ > /sys/fs/cgroup/agentfly/x/cgroup.procs; ulimit -f 8; exec \"$@\""]
    i = argv.index("/usr/bin/unshare")
    assert argv[i:i + 5] == ["/usr/bin/unshare", "--mount", "--propagation", "private", "--"]
    assert calls == [1]
    stage_script = argv[i + 7]
    assert "mount --rbind /root/.pyenv /run/0" in stage_script
    assert "mount --rbind /srv/sbx /run/1" in stage_script
    j = argv.index("/usr/bin/setpriv")
    assert argv[j:j + 5] == ["/usr/bin/setpriv", "--reuid=1600000123", "--regid=1600000123", "--clear-groups", "--"]
    assert argv[j + 5] == "bwrap"
    # one staged folder serves every source below it
    assert _pairs(argv, "--ro-bind")[0] == ("/run/0/versions/3.11/lib", "/lib")
    assert ("/run/0/bin", "/py") in _pairs(argv, "--ro-bind")
    assert _pairs(argv, "--bind") == [("/run/1/state/tmp", "/tmp")]


def test_no_staging_without_privilege_drop_and_no_unshare_lookup():
    def unshare() -> str:
        raise AssertionError("unshare looked up without a staged source")

    argv = exec_argv(SandboxLayout(ro=[("/lib", "/root/x")]), ["true"], workdir="/", env={}, uid=0, gid=0,
                     home="/root", stage_point=lambda p: "/root", unshare=unshare)
    assert _pairs(argv, "--ro-bind")[0] == ("/root/x", "/lib")
    assert argv[0] == "bwrap"


def test_a_source_to_stage_below_run_is_refused():
    with pytest.raises(ConfigError, match="'/run/user/0/x' is below /run"):
        exec_argv(SandboxLayout(ro=[("/x", "/run/user/0/x")]), ["true"], workdir="/", env={}, uid=0, gid=0,
                  home="/root", drop_to=("setpriv", 1, 1), stage_point=lambda p: "/run/user")


def test_network_uses_its_own_namespace_and_options_can_be_hidden():
    """With ``user_net_fds`` a network never means the host's namespace (no ``--share-net``): bwrap says its
    child's pid and waits before the command; ``hide_options`` replaces every option (and host path) on the
    command line, leaving bwrap, the stand-in and the command."""
    seen: list[list[str]] = []

    def hide(options: list[str]) -> list[str]:
        seen.append(options)
        return ["--args", "9"]

    argv = exec_argv(_layout(), ["id"], workdir="/root", env={}, uid=0, gid=0, home="/root", network=True,
                     user_net_fds=(5, 6), hide_options=hide)
    assert argv == ["bwrap", "--args", "9", "--", "id"]
    options = seen[0]
    assert "--share-net" not in options
    assert "--unshare-all" in options
    assert _pairs(options, "--info-fd", 1) == [("5",)]
    assert _pairs(options, "--block-fd", 1) == [("6",)]
    assert ("/state/tmp", "/tmp") in _pairs(options, "--bind")
    assert options[-2:] == ["--chdir", "/root"]
