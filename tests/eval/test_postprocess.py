"""ast_t5.eval.postprocess: sentinel spans, stop patterns, indentation repair."""
from ast_t5.eval.postprocess import (AST_T5_BODY, HUMANEVAL_PLAIN, MBPP_PLAIN, NO_POSTPROCESS,
                                     first_sentinel_span, indent_body, postprocess_completion,
                                     truncate_at_stop)


def test_plain_humaneval_stops():
    body = "    x = 1\n    return x\n"
    for tail in ("\ndef helper():\n", "\nclass A:\n", "\nif __name__ == '__main__':\n",
                 "\nprint(f(1))\n", "\n# test\n"):
        assert postprocess_completion(body + tail, HUMANEVAL_PLAIN) == body
    nested = "    def inner():\n        return 1\n    # note\n    return inner()\n"
    assert postprocess_completion(nested, HUMANEVAL_PLAIN) == nested  # indented: kept


def test_truncate_takes_the_earliest_stop():
    assert truncate_at_stop("a\n#b\ndef c", ("\ndef ", "\n#")) == "a"
    assert truncate_at_stop("abc", ()) == "abc"


def test_sentinel_span():
    assert first_sentinel_span("<extra_id_0>return 1<extra_id_1>junk") == "return 1"
    assert first_sentinel_span("<sen001>return 1<sen002>junk") == "return 1"
    assert first_sentinel_span("return 1") == "return 1"


def test_indent_body_first_line_only_or_all():
    assert indent_body("return x") == "    return x"
    repaired = "    if x:\n        return 1\n    return 2"
    assert indent_body("if x:\n        return 1\n    return 2") == repaired  # first line only
    assert indent_body("if x:\n    return 1\nreturn 2") == repaired  # every line
    assert indent_body("y = 1\n\n    return y") == "    y = 1\n\n    return y"  # blank ignored


def test_ast_t5_pipeline_order():
    raw = "<extra_id_0>total = sum(xs)\n    return total\nprint(f([1]))\nimport os<extra_id_1>"
    assert postprocess_completion(raw, AST_T5_BODY) == "    total = sum(xs)\n    return total"
    kept = postprocess_completion("return a\nprinter = 1", AST_T5_BODY)
    assert kept == "    return a\n    printer = 1"  # `printer` is not `print`


def test_mbpp_plain_and_none():
    code = "def f(a):\n    return a\n\ndef g():\n    return 2\nassert f(1) == 1\n"
    expected = "def f(a):\n    return a\n\ndef g():\n    return 2"
    assert postprocess_completion(code, MBPP_PLAIN) == expected
    assert postprocess_completion(code, NO_POSTPROCESS) == code
