"""The examples a code answer claims, read as the sandbox will check them."""

from __future__ import annotations

from router.answers import MAX_CODE_CHARS
from router.code_examples import code_job


def test_doctests_are_examples_and_leave_the_code() -> None:
    answer = (
        "Here it is:\n\n```python\ndef double(x):\n    return 2 * x\n\n"
        ">>> double(2)\n4\n>>> double(\n...     3)\n6\n```\n"
    )
    job = code_job(answer)
    assert job is not None
    assert job.examples == (("double(2)", "4"), ("double(\n    3)", "6"))
    assert ">>>" not in job.code and "\n4\n" not in job.code  # expected lines out too
    assert "def double(x):" in job.code


def test_doctests_shown_in_prose_count_too() -> None:
    answer = "```python\ndef inc(x):\n    return x + 1\n```\n\nFor example:\n\n>>> inc(1)\n2\n"
    job = code_job(answer)
    assert job is not None and job.examples == (("inc(1)", "2"),)


def test_a_result_in_a_comment_is_an_example() -> None:
    answer = (
        "```python\ndef pair(a, b):\n    return [a, b]\n\n"
        "print(pair(1, 2))  # Output: [1, 2]\n"
        "pair(3, 4)  # returns [3, 4]\n"
        "pair(5, 6)  # -> [5, 6]\n"
        "print(pair(0, 0))  # prints the pair\n"  # prose: nothing to check
        "print(pair(7, 8))\n"  # no claim
        "```"
    )
    job = code_job(answer)
    assert job is not None
    assert job.examples == (
        ("pair(1, 2)", "[1, 2]"),
        ("pair(3, 4)", "[3, 4]"),
        ("pair(5, 6)", "[5, 6]"),
    )


def test_nothing_to_check_is_no_job() -> None:
    assert code_job("The answer is 42.") is None  # no code
    assert code_job("```python\ndef f():\n    return 1\n```") is None  # no claims


def test_examples_are_bounded() -> None:
    calls = "".join(f"f({i})  # Output: {i}\n" for i in range(30))
    job = code_job(f"```python\ndef f(x):\n    return x\n{calls}```")
    assert job is not None and len(job.examples) == 10
    huge = "x" * 600
    assert code_job(f"```python\ndef f(x):\n    return x\nf(1)  # Output: {huge}\n```") is None


def test_a_long_answer_is_not_run() -> None:
    """Its code would be cut at the head read (MAX_CODE_CHARS) and fail for that alone."""
    body = "\n".join(f"    x{i} = {i}" for i in range(1200))
    answer = f"```python\ndef f():\n{body}\n    return 1\n\nf()  # Output: 1\n```"
    assert len(answer) > MAX_CODE_CHARS
    assert code_job(answer) is None


def test_a_hostile_comment_line_claims_nothing() -> None:
    spaces = " " * 7000
    assert code_job(f"```python\ndef f():\n    return 1\nf()  #{spaces}\n```") is None
    assert code_job(f"```python\ndef f():\n    return 1\n{'print(' * 2000}  # 1\n```") is None
