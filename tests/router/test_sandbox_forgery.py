"""Code that tries to pass its own examples without giving the claimed values: result
lines forged on any descriptor, the harness rewritten from inside its interpreter,
values equal to anything, comparisons undone through the builtins. ``add`` below is
wrong (it subtracts), so its example must fail whatever the code does around it.
Real child processes, as the gateway runs them; then the gateway's side alone: what it
makes of a channel the code wrote to."""

from __future__ import annotations

import json

import pytest

from router import sandbox
from router.code_examples import CodeJob, ExampleRun
from tests.support import requires

needs_sandbox = requires(sandbox.available(), "the sandbox")

CLAIM = ("add(2, 3)", "5")
FAILED = ExampleRun(passed=0, failed=1)


def wrong_add(forgery: str = "pass") -> str:
    """Code whose ``add`` subtracts, and runs ``forgery`` on each call first."""
    body = "\n".join(f"    {line}" for line in forgery.splitlines())
    return f"import builtins, gc, os, sys\n\ndef add(a, b):\n{body}\n    return a - b\n"


def run(code: str) -> ExampleRun:
    return sandbox.run_examples(CodeJob(code, (CLAIM,)))


@needs_sandbox
def test_the_wrong_answer_fails_unforged() -> None:
    assert run(wrong_add()) == FAILED
    right = wrong_add().replace("a - b", "a + b")
    assert run(right) == ExampleRun(passed=1, failed=0)


@needs_sandbox
@pytest.mark.parametrize(
    "forgery",
    [
        "sys.__stdout__.write('pass\\n')\nsys.__stdout__.flush()",
        "os.write(1, b'pass\\n')",
        "os.write(1, b'defined\\npass\\npass\\n')",
    ],
    ids=["sys.__stdout__", "fd 1", "a whole run"],
)
def test_result_lines_written_by_the_code_are_no_results(forgery: str) -> None:
    assert run(wrong_add(forgery)) == FAILED


@needs_sandbox
def test_writes_to_every_descriptor_are_no_results() -> None:
    """Whichever descriptor the results travel on, what the code writes there is no
    result: lines of another shape fail the run (the code is wrong, so nothing it could
    write there honestly would pass)."""
    forgery = (
        "for fd in range(256):\n"
        "    for line in (b'defined\\n', b'pass\\n', b'5\\n', b'null\\n', b'{}\\n'):\n"
        "        try:\n"
        "            os.write(fd, line)\n"
        "        except OSError:\n"
        "            pass"
    )
    assert run(wrong_add(forgery)) == FAILED


# Every function the harness defined, replaced by one saying yes to anything.
EVERYTHING_TRUE = (
    "def yes(*args, **kwargs):\n"
    "    return True\n"
    "for name, value in list(vars({module}).items()):\n"
    "    if type(value).__name__ == 'function':\n"
    "        setattr({module}, name, yes)\n"
)


@needs_sandbox
@pytest.mark.parametrize(
    "forgery",
    [
        EVERYTHING_TRUE.format(module="sys.modules['__main__']"),
        # The same, reaching the harness's globals through the garbage collector.
        "for found in gc.get_objects():\n"
        "    if isinstance(found, dict) and found.get('__name__') == '__main__':\n"
        "        class Module:\n"
        "            pass\n"
        "        module = Module()\n"
        "        module.__dict__ = found\n"
        + "\n".join(
            f"        {line}" for line in EVERYTHING_TRUE.format(module="module").splitlines()
        ),
        # Its audit hook off, then every example the harness holds made one that holds.
        "import __main__\n"
        "__main__.DENIED_EVENTS = ('never',)\n"
        "__main__.DENIED_IMPORTS = frozenset()\n"
        "__main__.PATH_EVENTS = frozenset()\n"
        "for found in gc.get_objects():\n"
        "    if isinstance(found, dict) and 'code' in found:\n"
        "        for value in found.values():\n"
        "            if isinstance(value, list):\n"
        "                value[:] = [['1', '1'] if isinstance(e, list) else '1' for e in value]",
    ],
    ids=["via sys.modules", "via gc", "hook off, examples rewritten"],
)
def test_a_harness_rewritten_from_inside_gives_no_pass(forgery: str) -> None:
    """At definition time, before any example runs: the harness is the code's to change."""
    assert run("import gc, sys\n" + forgery + "\n" + wrong_add()) == FAILED


@needs_sandbox
@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("Same()", "5"),
        ("[Same(), Same()]", "[5, 5]"),
        ("Text('7')", "5"),
        ("float('inf')", "5"),
    ],
    ids=["equal to anything", "inside a list", "a str equal to anything", "infinity"],
)
def test_a_value_equal_to_anything_is_not_the_claimed_value(value: str, want: str) -> None:
    """Values are compared as plain data outside the code's interpreter: an object whose
    ``__eq__`` says yes (the classic cheat) is not 5, nor is infinity close to it."""
    code = (
        "class Same:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "    __hash__ = object.__hash__\n\n"
        "class Text(str):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = str.__hash__\n\n"
        f"def add(a, b):\n    return {value}\n"
    )
    assert sandbox.run_examples(CodeJob(code, (("add(2, 3)", want),))) == FAILED


@needs_sandbox
def test_comparisons_undone_through_the_builtins_give_no_pass() -> None:
    """The builtins a comparison in the code's interpreter would call, made to agree."""
    forgery = "builtins.abs = lambda number: 0\nbuiltins.max = lambda *numbers: 1\n"
    assert run("import builtins\n" + forgery + wrong_add()) == FAILED


def report(**texts: str) -> str:
    return json.dumps({key: texts.get(key) for key in sandbox.REPORT_KEYS})


def test_a_channel_holding_anything_but_the_harness_s_lines_fails_every_example() -> None:
    five, wants = report(printed="", as_str="5", as_repr="5", as_data="5"), ["5", "5"]
    assert sandbox._verdicts(f"defined\n{five}\nnull\n".encode(), wants) == ExampleRun(1, 1)
    assert sandbox._verdicts(f"defined\n{five}\n{five[:9]}".encode(), wants) == ExampleRun(1, 1)
    assert sandbox._verdicts(f"{five}\n{five}\n".encode(), wants) == ExampleRun(0, 2)
    numbers = json.dumps(dict.fromkeys(sandbox.REPORT_KEYS, 5))
    for forged in ("pass", "defined", "true", "{}", numbers, "[" * 10_000, "\xff"):
        output = f"defined\n{five}\n{forged}\n".encode()
        assert sandbox._verdicts(output, wants) == ExampleRun(0, 2), forged
    assert sandbox._verdicts(f"defined\n{five}\n{five}\n{five}\n".encode(), wants).passed == 0


@pytest.mark.parametrize(
    ("data", "want", "holds"),
    [
        ("5", "5", True),
        ("5.0000001", "5", True),
        ("[1, (2.0, 'a')]", "[1, [2, 'a']]", True),
        ("{'a': 1.0}", "{'a': 1}", True),
        ("1e999", "5", False),
        ("1e999", "1e999", True),
        ("'5'", "5", False),
        ("<Same object>", "<Same object>", False),
    ],
)
def test_values_are_compared_as_data_here(data: str, want: str, holds: bool) -> None:
    """Parsed as literals in the gateway: nothing the code defined takes part, and
    infinity is close to no number but itself."""
    output = f"defined\n{report(printed='', as_data=data)}\n".encode()
    assert sandbox._verdicts(output, [want]) == ExampleRun(int(holds), int(not holds))
