"""ast_t5/data/seq2seq_dataset.py: JSONL reading, truncation, batching."""
import json

import numpy as np
import pytest

from ast_t5.data.seq2seq_dataset import (
    Seq2SeqDataError,
    Seq2SeqDataset,
    inference_dataset,
    read_jsonl_pairs,
)
from ast_t5.data.text_codec import TextCodec



@pytest.fixture(scope="module")
def codec(tokenizer_dir):
    return TextCodec.from_dir(str(tokenizer_dir))


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_reads_pairs_and_skips_blank_lines(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", [json.dumps({"source": "s1", "target": "t1"}), "",
                                              json.dumps({"src": "s2", "tgt": "t2", "source": 1})])
    with pytest.raises(Seq2SeqDataError, match=r"a.jsonl:3: needs a string field 'source'"):
        read_jsonl_pairs(path)
    path = write_lines(tmp_path / "b.jsonl", [json.dumps({"src": "s", "tgt": "t"})])
    assert read_jsonl_pairs(path, "src", "tgt") == (["s"], ["t"])


@pytest.mark.parametrize("content,message", [
    ('{"source": "x", "target": "y"}\n{oops\n', r"c.jsonl:2: invalid JSON"),
    ('["source", "target"]\n', r"c.jsonl:1: expected a JSON object"),
])
def test_bad_lines_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "c.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(Seq2SeqDataError, match=message):
        read_jsonl_pairs(str(path))


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(Seq2SeqDataError, match="no such file"):
        read_jsonl_pairs(str(tmp_path / "missing.jsonl"))
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(Seq2SeqDataError, match="not UTF-8"):
        read_jsonl_pairs(str(tmp_path / "bin.jsonl"))


def test_encoding_truncation_and_counts(codec):
    long_source = "x = 1\n" * 50
    ds = Seq2SeqDataset.from_texts(codec, [long_source, "y <extra_id_0>"], ["a", "b " * 40],
                                   max_source_positions=16, max_target_positions=8, name="t")
    assert ds.truncation["source"].count == 1 and ds.truncation["target"].count == 1
    assert ds.truncation["source"].longest == len(codec.encode(long_source)) + 1
    item = ds[0]
    assert len(item["source"]) == 16 and item["source"][-1] == codec.eos
    assert item["source"][:-1].tolist() == codec.encode(long_source)[:15]
    assert ds[1]["source"].tolist() == codec.encode("y <extra_id_0>") + [codec.eos]
    assert codec.sentinel_id(0) in ds[1]["source"].tolist()
    assert ds.size(0) == (16, len(ds[0]["target"])) and ds.num_tokens(1) == 8


def test_collater_uses_the_project_decoder_convention(codec):
    ds = Seq2SeqDataset.from_texts(codec, ["a", "bb cc dd"], ["t1 t1", "t2"], 32, 32)
    batch = ds.collater([ds[0], ds[1]])
    tgt, prev = batch["target"], batch["net_input"]["prev_output_tokens"]
    assert (prev[:, 0] == codec.eos).all()  # decoder input starts with </s>
    for row in range(2):
        n = int(tgt[row].ne(codec.pad).sum())
        assert tgt[row, n - 1] == codec.eos
        assert prev[row, 1:n].tolist() == tgt[row, :n - 1].tolist()
    assert batch["target_text"] == ["t1 t1", "t2"]
    assert batch["ntokens"] == int(tgt.ne(codec.pad).sum())


def test_ordered_indices_sort_by_length(codec):
    ds = Seq2SeqDataset.from_texts(codec, ["a " * 9, "a", "a " * 3], ["x", "x", "x"], 64, 64)
    order = ds.ordered_indices()
    assert list(ds.src_sizes[order]) == sorted(ds.src_sizes)


def test_inference_dataset_crops_sources(codec):
    ds = inference_dataset([list(range(4, 20)) + [codec.eos]], codec.pad, codec.eos, 8)
    assert len(ds[0]["source"]) == 8 and ds[0]["source"][-1] == codec.eos
    assert np.array_equal(ds.tgt_sizes, [1])
