"""Runs inside the sandbox (`router.sandbox`): defines a cheap model's code, then runs
the examples it claimed and reports what each gave, as plain data, never a verdict.

Reads ``{"code": str, "sources": [str, ...], "cpu_seconds": int, "text_chars": int}``
on stdin: the examples' sources only, never the results they claim (those stay with
the gateway, which compares). Writes ``defined`` once the code ran, then one JSON line
per example as each finishes (so an example that hangs leaves the earlier ones):
``null`` if it raised, else ``{"printed", "as_str", "as_repr", "as_data"}``: what it
printed, its value's str and repr, and its value as plain data (`_data`), each a
string (null where there is none, or where its JSON form is over ``text_chars``). The
lines go out on a descriptor of their own; the code's stdout and stderr are /dev/null.

Nothing here is out of the code's reach (it runs in this interpreter, and can rewrite
these functions or write lines of its own): the gateway takes what comes back as the
code's word, and refuses a channel holding anything but this shape. Everything the
harness needs is imported and the limits are set before the code runs; then an audit
hook refuses what the code has no business doing (files outside the Python
installation, writes, sockets, processes, signals): a tripwire for mistakes; the
namespaces around the process are the boundary. Standard library only: it runs under
``python -s -S -P``.
"""

import contextlib
import io
import itertools
import json
import numbers
import os
import resource
import sys
from collections.abc import Callable
from typing import Any

DENIED_EVENTS = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.chflags",
    "os.truncate",
    "os.symlink",
    "os.link",
    "os.utime",
    "os.putenv",
    "os.unsetenv",
    "os.setxattr",
    "os.removexattr",
    "shutil.",
    "ctypes.",
    "mmap.",
    "pty.",
    "fcntl.",
    "resource.setrlimit",
    "signal.",
    "builtins.input",
    "sys.addaudithook",
    "webbrowser.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "sqlite3.",
)
# Modules whose import alone opens a way around the events above.
DENIED_IMPORTS = frozenset(
    {"ctypes", "_ctypes", "_posixsubprocess", "subprocess", "multiprocessing", "socket", "_socket"}
)
PATH_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "glob.glob"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
MEMORY_BYTES = 512 << 20
PROCESSES = 16
# Values as plain data: these types as themselves (a subclass as its base type: an
# IntEnum as an int; another real number, a Fraction, as a float), in lists, tuples,
# dicts and sets of at most PLAIN_ITEMS in all.
PLAIN_SCALARS: tuple[tuple[type, Callable[[Any], object]], ...] = (
    (bool, bool),
    (int, int.__int__),
    (float, float.__float__),
    (numbers.Real, float),
    (complex, complex.__complex__),
    (str, str.__str__),
    (bytes, bytes.__bytes__),
)
PLAIN_ITEMS = 10_000
REPORT_KEYS = ("printed", "as_str", "as_repr", "as_data")
Report = dict[str, str | None]


def main() -> None:
    job = json.loads(sys.stdin.read())
    results = _channel()
    sink = io.StringIO()
    roots = tuple(
        os.path.realpath(p) + os.sep for p in {sys.base_prefix, sys.base_exec_prefix, sys.prefix}
    )
    _limit(int(job["cpu_seconds"]))
    _confine()
    sys.addaudithook(_guard(roots))
    namespace: dict[str, object] = {"__name__": "__answer__", "__builtins__": __builtins__}
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            exec(compile(job["code"], "<answer>", "exec"), namespace)
        except BaseException:  # any failure of the code is its result
            return
        results.write("defined\n")
        for source in job["sources"]:
            report = _report(source, namespace, sink, int(job["text_chars"]))
            results.write(json.dumps(report) + "\n")


def _channel() -> io.TextIOWrapper:
    """The results' own descriptor (a copy of stdout, the pipe to the gateway); stdout
    and stderr then go to /dev/null, so what the code writes there reaches no one."""
    results = os.fdopen(os.dup(1), "w", encoding="ascii", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    return results


def _limit(cpu_seconds: int) -> None:
    for name, value in (
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_AS, MEMORY_BYTES),
        (resource.RLIMIT_FSIZE, 0),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 32),
        (resource.RLIMIT_NPROC, PROCESSES),  # enforced where the gateway is not root
    ):
        resource.setrlimit(name, (value, value))


# A seccomp filter (x86_64 system call numbers): what no answer's code needs and the
# kernel's riskiest paths offer. Refused with EPERM: new namespaces (nested user
# namespaces reach netfilter, raw sockets, fresh IPC limits), mounts, keyrings,
# io_uring, SysV IPC, bpf, perf, ptrace and other processes' memory, new processes and
# programs (threads stay: `clone` with CLONE_THREAD); `clone3` answers ENOSYS, so the C
# library falls back to `clone`, whose flags the filter can read; another architecture's
# calls (x32 too) kill the process.
DENIED_SYSCALLS = (
    *(272, 308),  # unshare, setns
    *(165, 166, 155, 161, 428, 429, 430, 431, 432, 433, 442),  # mount family, chroot
    *(248, 249, 250),  # add_key, request_key, keyctl
    *(425, 426, 427),  # io_uring
    *(29, 64, 68),  # shmget, semget, msgget
    *(321, 298, 323, 101, 310, 311),  # bpf, perf_event_open, userfaultfd, ptrace, vm r/w
    *(57, 58, 59, 322),  # fork, vfork, execve, execveat
)
CLONE, CLONE3, X32_BIT = 56, 435, 0x40000000
CLONE_THREAD, CLONE_NEW_ANY = 0x00010000, 0x7E020080
AUDIT_ARCH_X86_64 = 0xC000003E
EPERM, ENOSYS = 1, 38


def _confine() -> None:
    """Install the seccomp filter (no_new_privs is set already: `setpriv`). Anywhere it
    cannot be installed the harness stops before the code runs, and the sandbox's probe
    (`router.sandbox.available`) reports the host unable."""
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        raise SystemExit("the sandbox's seccomp filter is for x86_64 only")

    class Instruction(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint),
        ]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno, kill = 0x7FFF0000, 0x00050000, 0x80000000
    # Labels are resolved into forward jumps once the program's length is known.
    code: list[tuple[int, object, object, int]] = [
        (load, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, "kill", AUDIT_ARCH_X86_64),
        (load, 0, 0, 0),  # seccomp_data.nr
        (jge, "kill", 0, X32_BIT),
        *((jeq, "deny", 0, number) for number in DENIED_SYSCALLS),
        (jeq, "enosys", 0, CLONE3),
        (jeq, 0, "allow", CLONE),
        (load, 0, 0, 16),  # clone's flags: the low half of seccomp_data.args[0]
        (jset, "deny", 0, CLONE_NEW_ANY),
        (jset, "allow", "deny", CLONE_THREAD),
    ]
    targets = {"allow": len(code), "deny": len(code) + 1, "enosys": len(code) + 2}
    targets["kill"] = len(code) + 3
    code += [(ret, 0, 0, allow), (ret, 0, 0, errno | EPERM), (ret, 0, 0, errno | ENOSYS)]
    code += [(ret, 0, 0, kill)]

    def offset(at: int, jump: object) -> int:
        return jump if isinstance(jump, int) else targets[str(jump)] - at - 1

    program = (Instruction * len(code))(
        *(
            Instruction(op, offset(i, jt), offset(i, jf), k)
            for i, (op, jt, jf, k) in enumerate(code)
        )
    )
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_seccomp, seccomp_mode_filter = 22, 2
    fprog = Program(len(code), program)
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0:
        raise SystemExit(f"seccomp refused: errno {ctypes.get_errno()}")


def _guard(roots: tuple[str, ...]) -> Callable[[str, tuple[object, ...]], None]:
    def hook(event: str, args: tuple[object, ...]) -> None:
        if event.startswith(DENIED_EVENTS):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and str(args[0]).split(".")[0] in DENIED_IMPORTS:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event in PATH_EVENTS:
            path = args[0] if args else None
            if not isinstance(path, str | bytes) or not _inside(os.fsdecode(path), roots):
                raise PermissionError(f"sandbox: {event} outside the Python installation")
            if event == "open" and not _reading(args):
                raise PermissionError("sandbox: files are read-only")

    return hook


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return (os.path.realpath(path) + os.sep).startswith(roots)


def _reading(args: tuple[object, ...]) -> bool:
    mode, flags = (args[1] if len(args) > 1 else "r"), (args[2] if len(args) > 2 else 0)
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return False
    return not isinstance(flags, int) or flags & WRITE_FLAGS == 0


def _report(
    source: str, namespace: dict[str, object], sink: io.StringIO, chars: int
) -> Report | None:
    """What ``source`` gave: what it printed and, if it is an expression, its value's
    str, repr and plain data (`_data`, as a literal); None if it raised. A text whose
    JSON form is longer than ``chars`` is left out (None)."""
    start = sink.tell()
    try:
        try:
            expression, evaluated = compile(source, "<example>", "eval"), True
        except SyntaxError:
            expression, evaluated = compile(source, "<example>", "exec"), False
        value = eval(expression, namespace)
    except BaseException:  # the example failed
        return None
    renders = (str, repr, _as_literal) if evaluated else ()
    texts = (sink.getvalue()[start:].strip(), *(_text(render, value) for render in renders))
    return {
        key: text if text is not None and len(json.dumps(text)) <= chars else None
        for key, text in itertools.zip_longest(REPORT_KEYS, texts)
    }


def _as_literal(value: object) -> str:
    return repr(_data(value, [PLAIN_ITEMS]))


def _text(render: Callable[[object], str], value: object) -> str | None:
    """``render(value)``, or None if it fails (the value's own methods run)."""
    try:
        text = render(value)
    except BaseException:  # its __str__ or __repr__ failed, or it is not plain data
        return None
    return text if isinstance(text, str) else None


def _data(value: object, budget: list[int]) -> object:
    """``value`` as plain data (`PLAIN_SCALARS` in lists, tuples, dicts and sets: a
    namedtuple as a tuple, a Counter as a dict), ``budget[0]`` items at most; ValueError
    for any other value."""
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("too many items")
    if value is None:
        return None
    for kind, plain in PLAIN_SCALARS:
        if isinstance(value, kind):
            return plain(value)
    if isinstance(value, list | tuple):
        items = [_data(item, budget) for item in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {_data(k, budget): _data(v, budget) for k, v in dict.items(value)}
    if isinstance(value, set | frozenset):
        return {_data(item, budget) for item in value}
    raise ValueError(f"{type(value).__name__} is not plain data")


if __name__ == "__main__":
    main()
