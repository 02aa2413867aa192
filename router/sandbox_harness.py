"""Runs inside the sandbox (`router.sandbox`): defines a cheap model's code, then checks
the examples it claimed, one result line each on stdout.

Reads ``{"code": str, "examples": [[source, want], ...], "cpu_seconds": int}`` on
stdin; writes ``defined`` once the code ran, then ``pass`` or ``fail`` per example (a
line as each finishes, so an example that hangs still leaves the earlier results).
Everything the harness needs is imported and the limits are set before the code runs;
then an audit hook refuses what the code has no business doing (files outside the
Python installation, writes, sockets, processes, signals): a tripwire for mistakes,
since code in this interpreter can get around it; the namespaces around the process
are the boundary. Standard library only: it runs under ``python -s -S -P``.
"""

import ast
import contextlib
import io
import json
import os
import resource
import sys
from collections.abc import Callable

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


def main() -> None:
    job = json.loads(sys.stdin.read())
    results = os.fdopen(os.dup(1), "w", buffering=1)  # the code's own output is dropped
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
        for source, want in job["examples"]:
            results.write("pass\n" if _holds(source, want, namespace, sink) else "fail\n")


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


def _holds(source: str, want: str, namespace: dict[str, object], sink: io.StringIO) -> bool:
    """Whether ``source`` gives ``want``: as what it prints, or as its value (its str,
    its repr, or equal to the literal, numbers within 1e-6)."""
    start = sink.tell()
    try:
        try:
            value, evaluated = eval(compile(source, "<example>", "eval"), namespace), True
        except SyntaxError:
            exec(compile(source, "<example>", "exec"), namespace)
            value, evaluated = None, False
        printed = sink.getvalue()[start:].strip()
        if printed and (printed == want or _equal_to_literal(_literal(printed), want)):
            return True  # print(f(x)) and the like
        if not evaluated:
            return False
        return str(value) == want or repr(value) == want or _equal_to_literal(value, want)
    except BaseException:  # the example (or its value's __eq__) failed
        return False


def _equal_to_literal(value: object, want: str) -> bool:
    """``value`` equals the literal ``want`` (numbers within 1e-6)."""
    try:
        return _close(value, ast.literal_eval(want))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def _literal(text: str) -> object:
    """The literal ``text`` is, else ``text`` itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _close(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


if __name__ == "__main__":
    main()
