"""Which line of an error's text names it (``common.error_text.error_line``)."""

from common.error_text import error_line

# What Ray reports for a task that raised: its header, the remote traceback, then the exception.
RAY_TASK_ERROR = (
    "ray::build() (pid=12, ip=10.0.0.2)\n"
    '  File "/work/measure/cluster_nodes.py", line 40, in build\n'
    "    raise ValueError(message)\n"
    "ValueError: the schedule binds no GPU threads\n"
    "  while building candidate 7"
)


def test_a_message_leads_with_what_went_wrong_unless_told_it_ends_with_it():
    text = "unsupported operator Foo\nhint: set TORCH_LOGS=+dynamo for details"
    assert error_line(ValueError(text)) == "unsupported operator Foo"
    assert error_line(ValueError(text), last=True) == "hint: set TORCH_LOGS=+dynamo for details"


def test_a_traceback_is_passed_over_to_the_exception_after_it():
    assert error_line(RuntimeError(RAY_TASK_ERROR)) == "ValueError: the schedule binds no GPU threads"
    assert error_line(RAY_TASK_ERROR, last=True) == "while building candidate 7"
    cpp = "Traceback (most recent call last):\n  1: tvm::Foo\n  0: tvm::Bar\nInternalError: Check failed: x > 0"
    assert error_line(cpp) == "InternalError: Check failed: x > 0"


def test_a_line_that_only_looks_like_a_frame_is_kept():
    assert error_line("at least 2 inputs are needed\n  at 0x7f00 in main") == "at least 2 inputs are needed"


def test_an_empty_message_gives_the_type_name():
    assert error_line(MemoryError()) == "MemoryError"
    assert error_line("  \n") == ""
