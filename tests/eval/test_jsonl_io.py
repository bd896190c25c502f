"""ast_t5.eval.jsonl_io: line-numbered errors and atomic writes."""
import pytest

from ast_t5.eval.jsonl_io import read_jsonl, write_jsonl_atomic
from ast_t5.eval.tasks import EvalInputError


def test_round_trip_and_errors(tmp_path):
    path = tmp_path / "out" / "records.jsonl"
    write_jsonl_atomic(str(path), [{"a": 1}, {"b": "ü"}])
    assert read_jsonl(str(path)) == [{"a": 1}, {"b": "ü"}]
    (tmp_path / "list.jsonl").write_text('{"a": 1}\n\n[1, 2]\n')
    with pytest.raises(EvalInputError, match=r"list.jsonl:3: expected a JSON object"):
        read_jsonl(str(tmp_path / "list.jsonl"))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"a": "\xe9"}\n')
    with pytest.raises(EvalInputError, match="cannot read"):
        read_jsonl(str(tmp_path / "latin1.jsonl"))


def test_interrupted_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "results.jsonl"
    write_jsonl_atomic(str(path), [{"old": True}])

    def records():
        yield {"new": 1}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_jsonl_atomic(str(path), records())
    assert read_jsonl(str(path)) == [{"old": True}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]
