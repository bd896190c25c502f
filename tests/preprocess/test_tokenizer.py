"""Tests of ast_t5_preprocess.tokenizer: lossless round trips, id layout, fairseq dictionary."""
import os

import numpy as np
import pytest

from ast_t5_preprocess.tokenizer import SPECIALS, Tokenizer, TokenizerError, load_tokenizer

from ..conftest import STDLIB

TRICKY = [
    "\tdef f(x):\r\n\t\treturn x  \r\n",             # tabs, CRLF, trailing spaces
    "    return \"é\" + str(x)  # ｆｕｌｌ width\n",   # NFKC would rewrite these
    "def 变量(αβ, ñ=1):\n    return αβ + ñ\n",         # Unicode identifiers
    "x = '🙂' * 3   \n\n\n   \n",                     # emoji (byte fallback), blank lines
    "\ufeffimport os\n",                                # a byte-order mark
    "a\u00a0=\u00a01\n",                                # non-breaking spaces
    "  leading and trailing spaces  ",
    "",
]


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return load_tokenizer(str(tokenizer_dir))


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_is_lossless(tok, text):
    ids, ends = tok.encode_file(text, len(text.encode("utf-8")))
    assert tok.decode(ids) == text
    assert (ends[-1] if len(ends) else 0) == len(text.encode("utf-8"))


def test_round_trip_on_real_code(tok):
    names = ["textwrap.py", "tokenize.py", "difflib.py", "locale.py"]
    for name in names:
        with open(os.path.join(STDLIB, name), encoding="utf-8") as f:
            text = f.read()
        ids, ends = tok.encode_file(text, len(text.encode("utf-8")))
        assert tok.decode(ids) == text
        # token end offsets really are byte offsets: each token decodes to its own byte slice
        data = text.encode("utf-8")
        starts = np.concatenate([[0], ends[:-1]])
        for i in range(0, len(ids), max(1, len(ids) // 50)):
            piece = tok.sp.id_to_piece(int(ids[i]))
            if not tok.sp.is_byte(int(ids[i])):
                assert data[starts[i]:ends[i]].decode("utf-8") == piece.replace("\u2581", " ")


def test_space_marker_is_rejected_not_corrupted(tok):
    text = "x = '\u2581'\n"
    with pytest.raises(TokenizerError):
        tok.encode_file(text, len(text.encode("utf-8")))


def test_special_ids_and_sentinels(tok):
    for name, idx in SPECIALS.items():
        assert getattr(tok.sp, f"{name}_id")() == idx
    assert tok.vocab_size == tok.spm_vocab_size + 32
    assert tok.sentinel_id(0) == tok.vocab_size - 1
    assert tok.sentinel_id(31) == tok.spm_vocab_size
    with pytest.raises(IndexError):
        tok.sentinel_id(32)
    ids = tok.encode("<extra_id_0> <s></s>")  # sentinel/special strings in text are plain text
    assert ids.max() < tok.spm_vocab_size and 0 not in ids and 2 not in ids


def test_fairseq_dictionary_index_equals_spm_id(tok, tokenizer_dir):
    from fairseq.data import Dictionary

    d = Dictionary.load(os.path.join(tokenizer_dir, "dict.txt"))
    assert len(d) == tok.vocab_size
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (0, 1, 2, 3)
    for k in (0, 5, 31):
        assert d.index(f"<extra_id_{k}>") == tok.sentinel_id(k)
    for i in (4, 100, tok.spm_vocab_size - 1):
        piece = tok.sp.id_to_piece(i)
        if piece.isprintable() and " " not in piece:
            assert d.index(piece) == i


def test_bad_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer(str(tmp_path / "missing.model"))
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path))
