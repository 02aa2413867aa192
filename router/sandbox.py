"""Run a cheap model's code against the examples it claimed, isolated from the host.

This is how the cascade verifier checks code (opt-in: a cascade route's
`run_code_examples: true`, `router verify --run-code`): an answer whose own examples
do not hold is more often wrong (on the shipped MBPP answers of the ten cheap models,
37% of those whose every checked example fails are right, 70% of those whose every
example holds). Model-written code is untrusted, so the kernel keeps it apart:

- new mount, network, PID, IPC and UTS namespaces (`unshare`; a gateway not run as
  root adds a user namespace, which needs no privilege): no network at all (no
  loopback, no abstract unix sockets), no SysV shared memory;
- a root of its own (`pivot_root` onto an empty tmpfs), holding only read-only,
  nosuid views of the system's programs and libraries (`SYSTEM_DIRS`), of the
  interpreter's own files (its executable, standard library and shared library, not
  the packages installed beside them nor a virtual environment: `_installation`) and
  a read-only /dev/null; each a bind mount without the mounts nested in it, so none
  is writable there; no /proc, none of the host's files, sockets or processes to reach;
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
  die first); what comes back read up to a bound.

The verdicts are this process's, where the code never runs. The harness
(`router/sandbox_harness.py`) gets the examples' sources, never the results they
claim, and sends back what each gave: what it printed, its value's str and repr, and
its value as plain data (a literal). Here those are compared with the claims, the
data parsed with `ast.literal_eval`, so a value is equal only as data (an object
whose `__eq__` says yes to anything is not 5). Whatever the harness sends is the
code's word, as it shares the harness's interpreter: the code can rewrite it or write
lines of its own. So a channel holding anything but the harness's lines fails every
example; and code that presents its claimed values (returning them, or sending them
itself) makes those examples hold, as a lookup table would: the check catches
mistaken answers and values that only pretend, not a table of the answers.

The harness also installs an audit hook refusing files outside the Python
installation, sockets and processes: a tripwire, not the boundary (code in the same
interpreter can get around it).

    run = run_examples(CodeJob(code, examples))  # ExampleRun(passed=2, failed=1)
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import math
import os
import platform
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from router.code_examples import CodeJob, ExampleRun

HARNESS = Path(__file__).resolve().parent / "sandbox_harness.py"
CPU_SECONDS = 2
WALL_SECONDS = 5.0
# Each text of a report, JSON-encoded, at most (longer ones come as null: no claimed
# result is nearly that long); so a report line is at most REPORT_BYTES.
TEXT_CHARS = 4096
REPORT_KEYS = ("printed", "as_str", "as_repr", "as_data")
REPORT_BYTES = len(REPORT_KEYS) * (TEXT_CHARS + 16) + 8
TOLERANCE = 1e-6  # numbers within it, relative or absolute, are equal
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
# Arguments: interpreter, harness, setpriv's uid options, the paths to show, "--",
# the directories among them to hide.
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
# A host path at the same place, read-only (mount binds, then remounts). A bind, not
# rbind: the mounts nested in it stay out (the remount reaches the top mount only).
show() {
  if [ -d "$1" ]; then mkdir -p "$R$1"; else mkdir -p "$R${1%/*}"; touch "$R$1"; fi
  mount -o bind,ro,nosuid,nodev "$1" "$R$1"
}
for path in "$@"; do
  shift
  if [ "$path" = -- ]; then break; fi
  show "$path"
done
for path in "$@"; do  # an empty, read-only file system over each
  mount -t tmpfs -o ro,nosuid,nodev,noexec,size=4k,mode=0555 hidden "$R$path"
done
mkdir -p "$R/etc" "$R/dev" "$R/proc"
if [ -f /etc/ld.so.cache ]; then show /etc/ld.so.cache; fi
cp "$HARNESS" "$R/harness.py"
touch "$R/dev/null"
mount -o bind,ro,nosuid,noexec /dev/null "$R/dev/null"
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


@dataclass(frozen=True, slots=True)
class Installation:
    """The interpreter to run, the host paths the new root shows (read-only, at the
    same places) and the directories among them it hides (shown empty)."""

    python: str
    shown: tuple[str, ...]
    hidden: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Report:
    """What an example gave in the sandbox, as the harness sent it (the code's word):
    what it printed, and its value's str, repr and plain data (a literal). None where
    there is none: not an expression, not plain data, or too long."""

    printed: str | None
    as_str: str | None
    as_repr: str | None
    as_data: str | None


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


@functools.cache
def _installation() -> Installation:
    """The base interpreter (a virtual environment's is a link to it) and the paths to
    show: the system's directories, then the interpreter's own files outside them (its
    executable, standard library and shared library; not its prefix's other programs,
    nor a virtual environment); the site-packages among them are hidden."""
    python = os.path.realpath(sys.executable)
    prefix, exec_prefix = map(os.path.realpath, (sys.base_prefix, sys.base_exec_prefix))
    bases = {"base": prefix, "installed_base": prefix}
    bases |= {"platbase": exec_prefix, "installed_platbase": exec_prefix}
    paths = sysconfig.get_paths(vars=bases)
    own = [python, *map(os.path.realpath, (paths["stdlib"], paths["platstdlib"]))]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        # Where the build put it, or where it was installed to (a link there is fine:
        # its file is shown at the link's path, the one the loader looks up).
        library = str(sysconfig.get_config_var("INSTSONAME"))
        own += [os.path.join(str(sysconfig.get_config_var("LIBDIR")), library)]
        own += [os.path.join(prefix, "lib", library)]
    shown = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    for path in dict.fromkeys(own):
        if os.path.exists(path) and not _under(path, shown):
            shown.append(path)
    installed = map(os.path.realpath, site.getsitepackages([prefix]))
    hidden = [p for p in dict.fromkeys(installed) if os.path.isdir(p) and _under(p, shown)]
    return Installation(python, tuple(shown), tuple(hidden))


def _under(path: str, dirs: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d + "/") for d in dirs)


@functools.cache
def available() -> str | None:
    """None when code can be run isolated here, else the reason it cannot."""
    if platform.machine() != "x86_64":
        return f"the seccomp filter knows x86_64 system calls only, not {platform.machine()}"
    tools = _tools()
    if isinstance(tools, str):
        return tools
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
    found = _installation()
    sources = [source for source, _ in job.examples]
    payload = json.dumps(
        {"code": job.code, "sources": sources, "cpu_seconds": cpu_seconds, "text_chars": TEXT_CHARS}
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
        found.python,
        str(HARNESS),
        drop,
        *found.shown,
        "--",
        *found.hidden,
    ]
    path = os.pathsep.join(dict.fromkeys(os.path.dirname(p) for p in tools.values()))
    limit = len(b"defined\n") + len(sources) * REPORT_BYTES
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
            output = child.stdout.read(limit + 1)
        finally:
            deadline.cancel()
            _kill(child)
    if len(output) > limit:  # more than the harness writes: the code wrote too
        return ExampleRun(0, len(sources), job.stated, job.stated)
    return _verdicts(output, [want for _, want in job.examples], job.stated)


def _kill(child: subprocess.Popen[bytes]) -> None:
    if child.returncode is None:  # not reaped yet: its group id is still its own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)


def _verdicts(output: bytes, wants: Sequence[str], stated: int = 0) -> ExampleRun:
    """Each example judged from its report; those the run never reached (killed, or the
    code did not define) failed, and a channel holding anything but ``defined`` and
    one report per example (the code wrote to it) fails them all. The first ``stated``
    are the prompt's tests, counted apart too."""
    failed = ExampleRun(0, len(wants), stated, stated)
    lines = output.split(b"\n")[:-1]  # a last line without its end was cut short
    if lines[:1] != [b"defined"] or len(lines) - 1 > len(wants):
        return failed
    try:
        reports = [_report(line) for line in lines[1:]]
    except ValueError:
        return failed
    held = [_holds(report, want) for report, want in zip(reports, wants, strict=False)]
    held += [False] * (len(wants) - len(held))  # not reached: failed
    return ExampleRun(sum(held), len(wants) - sum(held), stated, stated - sum(held[:stated]))


def _report(line: bytes) -> Report | None:
    """The harness's report on one line (None: the example raised); ValueError for a
    line of any other shape."""
    try:
        fields = json.loads(line.decode("ascii"))
    except RecursionError as exc:
        raise ValueError("a report nested too deep") from exc
    if fields is None:
        return None
    if not isinstance(fields, dict) or sorted(fields) != sorted(REPORT_KEYS):
        raise ValueError(f"a report has the keys {', '.join(REPORT_KEYS)}, not {line[:80]!r}")
    if not all(text is None or isinstance(text, str) for text in fields.values()):
        raise ValueError(f"a report's fields are strings or null, not {line[:80]!r}")
    return Report(**fields)


def _holds(report: Report | None, want: str) -> bool:
    """Whether the example gave ``want``: as what it printed, or as its value (its str,
    its repr, or as data equal to the literal ``want``, numbers within TOLERANCE)."""
    if report is None:
        return False
    expected = _literal(want)
    if (printed := report.printed) and (
        printed == want or _equal(_literal(printed, otherwise=printed), expected)
    ):
        return True  # print(f(x)) and the like
    if want in (report.as_str, report.as_repr):
        return True
    return report.as_data is not None and _equal(_literal(report.as_data), expected)


# What `_literal` gives for a text that writes no literal: equal to nothing.
NO_LITERAL = object()


def _literal(text: str, otherwise: object = NO_LITERAL) -> object:
    """The plain data the literal ``text`` writes, else ``otherwise``."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return otherwise


def _equal(value: object, expected: object) -> bool:
    return value is not NO_LITERAL and expected is not NO_LITERAL and _close(value, expected)


def _close(a: object, b: object) -> bool:
    """Plain data ``a`` equals ``b``, numbers within TOLERANCE (infinity only itself)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        try:
            return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
        except OverflowError:  # an int too large for a float
            return a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b
