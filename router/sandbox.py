"""Run a cheap model's code against the examples it claimed, isolated from the host.

This is how the cascade verifier checks code (opt-in: a cascade route's
`run_code_examples: true`, `router verify --run-code`): an answer whose own examples
do not hold is more often wrong (on the shared MBPP answers of the ten cheap models,
37% of those whose every checked example fails are right, 70% of those whose every
example holds). Model-written code is untrusted, so the kernel keeps it apart:

- new mount, network, PID, IPC and UTS namespaces (`unshare`; a gateway not run as
  root adds a user namespace, which needs no privilege): no network at all (no
  loopback, no abstract unix sockets), no SysV shared memory;
- a root of its own (`pivot_root` onto an empty tmpfs), holding only read-only,
  nosuid views of the system's programs and libraries (`SYSTEM_DIRS`) and the Python
  installation and a read-only /dev/null: no
  /proc, none of the host's files, sockets or processes to reach;
- never the host's root: a gateway run as root starts the code as an unprivileged
  uid (`UNPRIVILEGED_UID`), for the kernel trusts uid 0 with /proc/sys and root's keys
  whatever its capabilities; every capability dropped and no new privileges
  (`setpriv`), so nothing can remount, unmount or regain what was taken;
- a seccomp filter (the harness's `_confine`, x86_64) refusing new namespaces, mounts,
  keyrings, io_uring, SysV IPC, bpf, perf, ptrace, new processes and programs;
- the setup shell stays the namespace's PID 1 (the code cannot outlive it: killing it
  ends every process there); an empty environment; rlimits (CPU seconds, 512 MB of
  address space, no file written, few descriptors, 16 processes of its uid); killed
  at a wall-clock deadline, by `timeout` too (which outlives the gateway, should it
  die first); its output read up to a few kB.

The harness (`router/sandbox_harness.py`) also installs an audit hook refusing files
outside the Python installation, sockets and processes: a tripwire, not the boundary
(code in the same interpreter can get around it). Only counts come back (examples
held / failed), never what the code printed; the code can forge them, so the check
catches mistaken answers, not a model set on deceiving it.

    run = run_examples(CodeJob(code, examples))  # ExampleRun(passed=2, failed=1)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from router.code_examples import CodeJob, ExampleRun

HARNESS = Path(__file__).resolve().parent / "sandbox_harness.py"
CPU_SECONDS = 2
WALL_SECONDS = 5.0
MAX_RESULT_BYTES = 4096
TOOLS = ("timeout", "unshare", "setpriv", "pivot_root", "mount", "umount", "sh", "cp")
NAMESPACES = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child")
# A gateway not run as root makes a user namespace too (its uid as the namespace's
# root, for the mounts); one run as root must not (uid 0 inside would be the host's,
# which the kernel trusts with /proc/sys and root's keys whatever the capabilities):
# it does the mounts as itself, then the code runs as this unprivileged uid.
UNPRIVILEGED_UID = 65534
# The system's programs and libraries the interpreter and setpriv need (not /usr/local,
# /usr/share or /usr/etc: installed tools and their settings stay out of sight).
SYSTEM_DIRS = ("/usr/bin", "/usr/lib", "/usr/lib64", "/usr/libexec")
# Run inside the namespaces, as their root: build the new root, move into it, start
# the harness with every capability dropped. It stays PID 1, so the harness can
# neither outlive it nor leave the namespace: killing it ends every process there.
# Arguments: interpreter, harness, setpriv's uid options, the directories to show.
SETUP = r"""
set -eu
PYTHON="$1"; HARNESS="$2"; DROP="$3"; shift 3
exec 3<&0  # the job, on stdin: a background command's own stdin would be /dev/null
mount --make-rprivate /
echo 0 > /proc/sys/kernel/shmmni  # no SysV IPC (seccomp refuses it too): its memory
echo 0 > /proc/sys/kernel/msgmni  # is no process's, beyond RLIMIT_AS
echo "0 0 0 0" > /proc/sys/kernel/sem
mount -t tmpfs -o size=2m,mode=0755 sandbox /dev/shm
R=/dev/shm/root
mkdir "$R"
mount --bind "$R" "$R"
for link in bin lib lib64 sbin; do
  if [ -L "/$link" ]; then ln -s "$(readlink "/$link")" "$R/$link"; fi
done
for dir in "$@"; do
  mkdir -p "$R$dir"
  mount --rbind "$dir" "$R$dir"
  mount -o remount,bind,ro,nosuid,nodev "$R$dir"
done
mkdir -p "$R/etc" "$R/dev" "$R/proc"
if [ -f /etc/ld.so.cache ]; then
  touch "$R/etc/ld.so.cache"
  mount --bind /etc/ld.so.cache "$R/etc/ld.so.cache"
  mount -o remount,bind,ro "$R/etc/ld.so.cache"
fi
cp "$HARNESS" "$R/harness.py"
touch "$R/dev/null"
mount --bind /dev/null "$R/dev/null"
mount -o remount,bind,ro,nosuid,noexec "$R/dev/null"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"  # umount reads it; gone below
mkdir "$R/old"
cd "$R"
pivot_root . old
umount -l /old
rmdir /old
umount /proc
rmdir /proc
mount -o remount,bind,ro /
setpriv $DROP --bounding-set=-all --inh-caps=-all --no-new-privs \
  "$PYTHON" -s -S -P /harness.py <&3 3<&- 2>/dev/null &
wait $!
"""


class SandboxUnavailable(RuntimeError):
    """The host cannot isolate a child this way (tools missing, no user namespaces)."""


@functools.cache
def _tools() -> dict[str, str] | str:
    """Each tool's path, or why one is missing (setpriv must sit in /usr/bin: it is run
    from inside the new root, which shows the system directories only)."""
    found = {name: shutil.which(name) for name in TOOLS}
    missing = sorted(name for name, path in found.items() if path is None)
    if missing:
        return f"{', '.join(missing)} not installed (util-linux, coreutils)"
    setpriv = os.path.realpath(found["setpriv"] or "")
    if not setpriv.startswith("/usr/bin/"):
        return f"setpriv is at {setpriv}, outside /usr/bin"
    return {name: str(path) for name, path in found.items()}


def _python() -> tuple[str, list[str]]:
    """The interpreter to run (the base one: a virtual environment's is a link to it)
    and the directories the new root shows."""
    python = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    shown = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    if prefix != "/usr" and not any(prefix.startswith(d + "/") for d in shown):
        shown.append(prefix)  # e.g. /usr/local, /opt/python, ~/.pyenv/versions/3.11.7
    return python, shown


@functools.cache
def available() -> str | None:
    """None when code can be run isolated here, else the reason it cannot."""
    if platform.machine() != "x86_64":
        return f"the seccomp filter knows x86_64 system calls only, not {platform.machine()}"
    tools = _tools()
    if isinstance(tools, str):
        return tools
    python, shown = _python()
    if not any(python.startswith(d + "/") for d in shown):
        return f"the interpreter {python} is outside {', '.join(shown)}"
    probe = CodeJob("x = 1\n", (("x", "1"),))
    try:
        if _run(tools, probe, CPU_SECONDS, 20.0) != ExampleRun(1, 0):
            return "the sandbox starts but runs nothing (unshare, pivot_root or setpriv refused)"
    except OSError as exc:
        return f"the sandbox cannot start: {exc}"
    return None


def run_examples(
    job: CodeJob, *, cpu_seconds: int = CPU_SECONDS, wall_seconds: float = WALL_SECONDS
) -> ExampleRun:
    """Run ``job`` in the sandbox (blocking: call it from a worker thread on a server).
    Raises SandboxUnavailable on a host that cannot, OSError when a child cannot start."""
    reason = available()
    if reason is not None:
        raise SandboxUnavailable(reason)
    tools = _tools()
    assert not isinstance(tools, str)
    return _run(tools, job, cpu_seconds, wall_seconds)


def run_all(jobs: Sequence[CodeJob | None]) -> list[ExampleRun | None]:
    """``run_examples`` of each job (None: nothing to run), the distinct ones in
    parallel, one per CPU: for batches (training, `router verify --run-code`)."""
    unique = list(dict.fromkeys(job for job in jobs if job is not None))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        runs = dict(zip(unique, pool.map(run_examples, unique), strict=True))
    return [runs[job] if job is not None else None for job in jobs]


def _run(tools: dict[str, str], job: CodeJob, cpu_seconds: int, wall_seconds: float) -> ExampleRun:
    python, shown = _python()
    payload = json.dumps(
        {"code": job.code, "examples": job.examples, "cpu_seconds": cpu_seconds}
    ).encode()
    as_root = os.geteuid() == 0
    user = () if as_root else ("--user", "--map-root-user")
    drop = (
        f"--reuid={UNPRIVILEGED_UID} --regid={UNPRIVILEGED_UID} --clear-groups" if as_root else ""
    )
    command = [
        tools["timeout"],
        "-s",
        "KILL",
        f"{wall_seconds + 1:.1f}",  # the backstop: the timer below kills it first
        tools["unshare"],
        *user,
        *NAMESPACES,
        tools["sh"],
        "-c",
        SETUP,
        "sandbox",
        python,
        str(HARNESS),
        drop,
        *shown,
    ]
    path = os.pathsep.join(dict.fromkeys(os.path.dirname(p) for p in tools.values()))
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={"PATH": path, "PYTHONHASHSEED": "0"},  # set orders, so results, repeat
        cwd="/",
        start_new_session=True,  # its own process group: killed whole
    ) as child:
        deadline = threading.Timer(wall_seconds, _kill, (child,))
        deadline.start()
        try:
            assert child.stdin is not None and child.stdout is not None
            with contextlib.suppress(BrokenPipeError):  # it died before reading
                child.stdin.write(payload)
                child.stdin.close()
            output = child.stdout.read(MAX_RESULT_BYTES)
        finally:
            deadline.cancel()
            _kill(child)
    return _parse(output.decode(errors="replace"), len(job.examples))


def _kill(child: subprocess.Popen[bytes]) -> None:
    if child.returncode is None:  # not reaped yet: its group id is still its own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)


def _parse(output: str, examples: int) -> ExampleRun:
    """Counts from the harness's lines; examples it never reached (killed) failed."""
    lines = output.splitlines()
    if "defined" not in lines[:1]:
        return ExampleRun(0, examples)
    passed = min(lines.count("pass"), examples)
    return ExampleRun(passed, examples - passed)
