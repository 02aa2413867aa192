"""The code sandbox: examples counted as they hold, and the code kept from the host
(files, network, environment, processes, time and memory). Real child processes, as
the gateway runs them."""

from __future__ import annotations

import os
import shutil
import site
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from router import sandbox
from router.code_examples import CodeJob, ExampleRun
from tests.support import requires

pytestmark = requires(sandbox.available(), "the sandbox")


# The harness's audit hook is a tripwire, not the boundary: code in its interpreter can
# turn it off, as this does. The tests below marked "hook off" show the kernel holds.
HOOK_OFF = (
    "import __main__\n"
    "__main__.DENIED_EVENTS = ('never',)\n"
    "__main__.DENIED_IMPORTS = frozenset()\n"
    "__main__.PATH_EVENTS = frozenset()\n"
)


def run(code: str, *examples: tuple[str, str], **limits: float) -> ExampleRun:
    return sandbox.run_examples(CodeJob(code, examples), **limits)  # type: ignore[arg-type]


def test_examples_are_counted_as_they_hold() -> None:
    code = (
        "import math\n\ndef add(a, b):\n    return a + b\n\ndef root(x):\n    return math.sqrt(x)\n"
    )
    found = run(
        code,
        ("add(1, 2)", "3"),  # its str
        ("add('a', 'b')", "'ab'"),  # its repr
        ("root(2)", "1.41421356"),  # a number shown rounded
        ("print(add(2, 2))", "4"),  # what it prints
        ("add(1, 1)", "3"),  # wrong
        ("missing(1)", "1"),  # raises
    )
    assert found == ExampleRun(passed=4, failed=2)
    assert found.checked == 6


def test_code_that_does_not_define_fails_every_example() -> None:
    assert run("def f(:\n    pass\n", ("f()", "1"), ("1", "1")) == ExampleRun(0, 2)
    assert run("raise SystemExit(0)\n", ("1", "1")) == ExampleRun(0, 1)


def test_the_code_writes_no_file(tmp_path: Path) -> None:
    target = tmp_path / "written"
    code = f"def write():\n    open({str(target)!r}, 'w').write('x')\n    return 1\n"
    assert run(code, ("write()", "1")) == ExampleRun(0, 1)
    remove = f"import os\ndef remove():\n    os.remove({str(tmp_path / 'kept')!r})\n    return 1\n"
    (tmp_path / "kept").write_text("kept")
    assert run(remove, ("remove()", "1")) == ExampleRun(0, 1)
    assert not target.exists() and (tmp_path / "kept").read_text() == "kept"


def test_the_code_reads_no_file_outside_python(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("fake-secret")
    code = f"def peek():\n    return open({str(secret)!r}).read()\n"
    assert run(code, ("peek()", "fake-secret")) == ExampleRun(0, 1)
    environ = "def peek(pid):\n    return open(f'/proc/{pid}/environ').read()\n"
    assert run(environ, (f"len(peek({os.getpid()})) > 0", "True")) == ExampleRun(0, 1)
    # The standard library imports (the interpreter reads its own files).
    assert run("import json, re, collections\n", ("json.dumps([1])", "[1]")) == ExampleRun(1, 0)


def test_the_code_sees_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_TEST_SECRET", "fake-key")
    code = "import os\n"
    assert run(code, ("os.environ.get('CASCADE_TEST_SECRET')", "None")) == ExampleRun(1, 0)


def test_the_code_reaches_no_network() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = f"import socket\ndef call():\n    socket.create_connection(('127.0.0.1', {port}))\n"
        assert run(code, ("call()", "None")) == ExampleRun(0, 1)
        # Even with the module its import refuses, a namespace has no route out.
        raw = (
            "def call():\n    import _socket\n"
            f"    _socket.socket().connect(('127.0.0.1', {port}))\n"
        )
        assert run(raw, ("call()", "None")) == ExampleRun(0, 1)
        with pytest.raises(TimeoutError):
            server.accept()


def test_the_code_cannot_signal_or_start_processes() -> None:
    here = os.getpid()
    kill = f"import os, signal\ndef stop():\n    os.kill({here}, signal.SIGTERM)\n"
    assert run(kill, ("stop()", "None")) == ExampleRun(0, 1)
    fork = "import os\ndef spawn():\n    return os.fork() >= 0\n"
    assert run(fork, ("spawn()", "True")) == ExampleRun(0, 1)
    shell = "import os\ndef shell():\n    return os.system('true')\n"
    assert run(shell, ("shell()", "0")) == ExampleRun(0, 1)
    assert os.getpid() == here  # still running: the signal never came


def test_a_loop_or_a_sleep_is_cut_off_and_the_earlier_results_kept() -> None:
    start = time.monotonic()
    spin = "def spin():\n    while True:\n        pass\n"
    assert run(spin, ("1", "1"), ("spin()", "1"), ("1", "1"), cpu_seconds=1) == ExampleRun(1, 2)
    sleep = "import time\ndef nap():\n    time.sleep(60)\n"
    assert run(sleep, ("1", "1"), ("nap()", "None"), wall_seconds=1.0) == ExampleRun(1, 1)
    assert time.monotonic() - start < 10


def test_memory_and_output_are_bounded() -> None:
    assert run("x = 'a' * 10**10\n", ("1", "1")) == ExampleRun(0, 1)
    flood = "import os\nos.write(1, b'pass\\n' * 10**6)\n"  # forged results, and many
    found = run(flood, ("1", "1"))
    assert found.checked == 1


def test_runs_repeat_exactly() -> None:
    """The hash seed is fixed (0): a set of strings prints in that seed's order every
    run, so training on these results is deterministic."""
    tags = "{'alpha', 'beta', 'gamma', 'delta', 'epsilon'}"
    seeded = subprocess.run(
        [sys.executable, "-c", f"print(list({tags}))"],
        env={"PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    example = ("print(list(tags()))", seeded.stdout.strip())
    code = f"def tags():\n    return {tags}\n"
    assert {run(code, example) for _ in range(4)} == {ExampleRun(1, 0)}


def test_hook_off_the_host_files_and_kernel_settings_are_out_of_reach(tmp_path: Path) -> None:
    """A root of its own, never the host's uid 0: a secret beside the gateway cannot be
    read, nor a file written, nor the read-only mounts made writable again, nor a
    kernel setting changed (no /proc), nor SysV shared memory taken."""
    secret, probe = tmp_path / "secret.txt", tmp_path / "probe"
    secret.write_text("fake-secret")
    code = HOOK_OFF + (
        "import os, subprocess, ctypes\n"
        f"def peek():\n    return open({str(secret)!r}).read()\n"
        f"def write():\n    open({str(probe)!r}, 'w').write('x')\n"
        "def remount():\n"
        "    return subprocess.run(['mount', '-o', 'remount,bind,rw', '/']).returncode\n"
        "def sysctl():\n"
        "    open('/proc/sys/kernel/core_pattern', 'w').write('core')\n"
        "def null():\n    os.chmod('/dev/null', 0o600)\n"
        "def shm():\n    return ctypes.CDLL(None).shmget(0, 1 << 20, 0o1000 | 0o600)\n"
    )
    found = run(
        code,
        ("peek()", "fake-secret"),
        ("write()", "None"),
        ("remount() == 0", "True"),
        ("sysctl()", "None"),
        ("null()", "None"),
        ("shm()", "-1"),  # holds: refused
        ("sorted(os.listdir('/'))[:3]", "['bin', 'dev', 'etc']"),  # holds: its own root
    )
    assert found == ExampleRun(passed=2, failed=5)
    assert not probe.exists()
    assert (os.stat("/dev/null").st_mode & 0o777) == 0o666


def test_hook_off_only_the_interpreter_s_own_files_are_shown() -> None:
    """Its standard library, not the packages installed beside it (site-packages is an
    empty directory there), nor the virtual environment the gateway runs in."""
    installed = [p for p in site.getsitepackages([sys.base_prefix]) if os.path.isdir(p)]
    examples = [(f"os.listdir({path!r})", "[]") for path in installed]
    if sys.prefix != sys.base_prefix:
        examples.append((f"os.path.exists({sys.prefix!r})", "False"))
    examples.append(("__import__('json').dumps([1])", "[1]"))  # the standard library's there
    assert run(HOOK_OFF + "import os\n", *examples) == ExampleRun(len(examples), 0)


@requires(
    None if os.geteuid() == 0 and shutil.which("unshare") else "not root, or no unshare",
    "root and unshare: it mounts a file system in a mount namespace of its own",
)
def test_hook_off_a_mount_nested_in_a_shown_directory_stays_out() -> None:
    """A writable file system mounted inside the standard library's directory (a tmpfs,
    in a mount namespace of the test's own) is not brought into the new root: the
    directory there is the read-only one beneath it."""
    nested = os.path.join(sysconfig.get_path("stdlib"), "wsgiref")
    probe = os.path.join(nested, "probe")
    code = HOOK_OFF + f"import os\ndef write():\n    open({probe!r}, 'w').write('x')\n"
    examples = (("write()", "None"), (f"'__init__.py' in os.listdir({nested!r})", "True"))
    script = (
        "import os\n"
        "from router import sandbox\n"
        "from router.code_examples import CodeJob\n"
        f"print(sandbox.run_examples(CodeJob({code!r}, {examples!r})), os.path.exists({probe!r}))\n"
    )
    mount_then_run = 'mount -t tmpfs -o mode=1777 nested "$1" && exec "$2" -c "$3"'
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_then_run]
    finished = subprocess.run(
        [*command, "sh", nested, sys.executable, script],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert finished.stdout.split() == [
        "ExampleRun(passed=1,",
        "failed=1,",
        "tests=0,",
        "tests_failed=0)",
        "False",
    ]


def test_hook_off_no_socket_and_no_process_of_the_host_is_reachable(tmp_path: Path) -> None:
    """A unix socket on the host's disk is not in its root, and there is no /proc: the
    gateway can be neither seen nor signalled."""
    path = tmp_path / "gateway.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        server.settimeout(0.5)
        code = HOOK_OFF + (
            "import os, socket\n"
            "def call():\n"
            f"    socket.socket(socket.AF_UNIX).connect({str(path)!r})\n"
            f"def stop():\n    os.kill({os.getpid()}, 9)\n"
        )
        found = run(
            code, ("call()", "None"), ("os.path.exists('/proc')", "False"), ("stop()", "None")
        )
        assert found == ExampleRun(passed=1, failed=2)
        with pytest.raises(TimeoutError):
            server.accept()


def test_hook_off_the_code_neither_outlives_the_deadline_nor_multiplies() -> None:
    """Code that sleeps past the deadline, or a child that leaves its session holding
    the results pipe, dies with the namespace then (the run returns at the deadline,
    not when it wakes); a fork bomb makes nothing (seccomp; the process cap, too)."""
    start = time.monotonic()
    lingers = HOOK_OFF + (  # seccomp refuses the fork now; were it let through...
        "import os, time\ntry:\n    if os.fork() == 0:\n        os.setsid()\n"
        "        time.sleep(60)\nexcept OSError:\n    pass\n"
    )
    sleeps = ("__import__('time').sleep(60)", "None")
    assert run(lingers, ("1", "1"), sleeps, wall_seconds=1.0) == ExampleRun(1, 1)
    assert time.monotonic() - start < 5
    bomb = HOOK_OFF + (
        "import os, time\n"
        "def forks():\n"
        "    made = 0\n"
        "    for _ in range(64):\n"
        "        try:\n"
        "            if os.fork() == 0:\n"
        "                time.sleep(5)\n"
        "                os._exit(0)\n"
        "        except OSError:\n"
        "            break\n"
        "        made += 1\n"
        "    return made\n"
    )
    assert run(bomb, ("forks() < 20", "True")) == ExampleRun(1, 0)


def test_hook_off_the_kernel_s_riskiest_calls_are_refused() -> None:
    """The seccomp filter: no new process, program, namespace, keyring, SysV IPC or
    io_uring (each refused with EPERM); threads still work, as answers use them."""
    code = HOOK_OFF + (
        "import ctypes, os, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def refused(result):\n    return result == -1 and ctypes.get_errno() == 1\n"
        "def fork():\n"
        "    try:\n        os.fork()\n    except OSError as e:\n        return e.errno\n"
        "def execute():\n"
        "    try:\n        os.execv('/usr/bin/true', ['true'])\n"
        "    except OSError as e:\n        return e.errno\n"
        "def thread():\n"
        "    out = []\n    t = threading.Thread(target=out.append, args=(1,))\n"
        "    t.start()\n    t.join()\n    return out\n"
    )
    found = run(
        code,
        ("fork()", "1"),
        ("execute()", "1"),
        ("refused(libc.unshare(0x10000000))", "True"),  # a nested user namespace
        ("refused(libc.syscall(250, 0, -3, 0))", "True"),  # keyctl: the session keyring
        ("refused(libc.semget(0, 1, 0o1600))", "True"),
        ("refused(libc.syscall(425, 8, 0))", "True"),  # io_uring_setup
        ("thread()", "[1]"),
    )
    assert found == ExampleRun(passed=7, failed=0)


def test_a_batch_runs_each_distinct_job_once() -> None:
    job = CodeJob("def f():\n    return 2\n", (("f()", "2"),))
    assert sandbox.run_all([job, None, job]) == [ExampleRun(1, 0), None, ExampleRun(1, 0)]


def test_no_sandbox_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "available", lambda: "no user namespaces (test)")
    with pytest.raises(sandbox.SandboxUnavailable, match="no user namespaces"):
        run("x = 1\n", ("x", "1"))
