"""ast_t5/data/text_codec.py: sentinel-aware, lossless text <-> ids."""
import os

import pytest
from fairseq.data import Dictionary

from ast_t5.data.text_codec import TextCodec


TRICKY = [
    "",
    " ",
    "def f(x):\n    if x:\n\t\treturn x  \n",
    "    leading spaces and trailing   ",
    "windows\r\nline\r\nends\r\n",
    "unicode: é ß 漢字 😀 \u00a0 non-breaking, \u200b zero width",
    "\x00\x07 control chars \x7f",
    "html </s> <s> <pad> <unk> stays text",
    "<extra_id_01> has a leading zero, <extra_id_> and <extra_id_x> are text",
]


@pytest.fixture(scope="module")
def codec(tokenizer_dir):
    return TextCodec.from_dir(str(tokenizer_dir))


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_is_lossless(codec, text):
    ids = codec.encode(text)
    assert all(not codec.is_sentinel(i) for i in ids)
    assert codec.decode(ids) == text


def test_round_trip_of_real_files(codec, code_corpus):
    for path in sorted(code_corpus.rglob("*.py"))[:5]:
        text = path.read_text(encoding="utf-8")
        assert codec.decode(codec.encode(text)) == text


def test_sentinel_strings_become_sentinel_ids(codec):
    text = "def f(x):\n    <extra_id_0>\n<extra_id_31>end"
    ids = codec.encode(text)
    assert ids.count(codec.vocab_size - 1) == 1  # <extra_id_0> is the last id
    assert codec.vocab_size - 32 in ids  # <extra_id_31>
    assert codec.decode(ids) == text
    assert codec.decode(ids, keep_sentinels=False) == "def f(x):\n    \nend"


def test_unknown_sentinel_number_is_a_clear_error(codec):
    with pytest.raises(ValueError, match="only 32 sentinels"):
        codec.encode("x <extra_id_32> y")


def test_control_ids_are_not_rendered(codec):
    ids = codec.encode("a = 1")
    assert codec.decode([codec.bos] + ids + [codec.eos, codec.pad, codec.pad]) == "a = 1"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        codec.decode([codec.vocab_size])


def test_dictionary_is_dict_txt(codec, tokenizer_dir):
    ours = codec.dictionary()
    on_disk = Dictionary.load(os.path.join(str(tokenizer_dir), "dict.txt"))
    assert ours.symbols == on_disk.symbols
    assert (ours.bos(), ours.pad(), ours.eos(), ours.unk()) == (0, 1, 2, 3)


def test_from_bytes_equals_from_dir(codec):
    again = TextCodec.from_bytes(codec.spm_model_bytes, codec.num_sentinels)
    text = TRICKY[2] + "<extra_id_3>"
    assert again.encode(text) == codec.encode(text)
    assert again.vocab_size == codec.vocab_size


def test_not_a_tokenizer_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a tokenizer directory"):
        TextCodec.from_dir(str(tmp_path))
