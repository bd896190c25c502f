"""ast_t5/hf/export.py, ast_t5/hf/importer.py, ast_t5/hf/tokenizer.py: Hugging Face round trips."""
import json
import os
import random

import pytest
import torch

from ast_t5.data.text_codec import TextCodec
from ast_t5.generate import AstT5Generator
from ast_t5.generation.checkpoints import load_checkpoint
from ast_t5.hf import export as export_module
from ast_t5.hf.export import PAPER_FAMILY_ERROR, ExportError, export_to_hf
from ast_t5.hf.files import OutputExistsError
from ast_t5.hf.importer import HFImportError, import_from_hf
from ast_t5.hf.tokenizer import build_backend_tokenizer

from ..conftest import build_tiny_checkpoint
from ..generation.test_text_codec import TRICKY


transformers = pytest.importorskip("transformers")
MAX_ABS_DIFF = 1e-5  # fp32
SENTINEL_TEXTS = ["def f(x):\n    <extra_id_0>\n", "<extra_id_31>a<extra_id_0>\r\n\t<extra_id_5>",
                  "x<extra_id_1>  </s> <extra_id_2>  "]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_checkpoint_dir):
    out = tmp_path_factory.mktemp("hf") / "model"
    export_to_hf(str(tiny_checkpoint_dir), str(out))
    return out


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint_dir):
    return load_checkpoint(str(tiny_checkpoint_dir), attention_backend="torch")


def test_exported_directory_loads_with_auto_classes(exported, loaded):
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(exported)).eval()
    config = json.loads((exported / "config.json").read_text())
    ids = (config["decoder_start_token_id"], config["pad_token_id"], config["eos_token_id"])
    assert ids == (2, 1, 2)
    assert config["vocab_size"] == loaded.codec.vocab_size
    codec = loaded.codec
    src_texts = ["def add(a, b):\n    return a + b\n", "x = <extra_id_0>\n\ty"]
    src = [codec.encode(t) + [codec.eos] for t in src_texts]
    width = max(map(len, src))
    src = torch.tensor([s + [codec.pad] * (width - len(s)) for s in src])  # right-padded batch
    prev = torch.tensor([[codec.eos] + codec.encode("return x")] * 2)
    with torch.no_grad():
        ours = loaded.model(src, src.ne(codec.pad).sum(1), prev)[0]
        theirs = model(input_ids=src, attention_mask=src.ne(codec.pad).long(),
                       decoder_input_ids=prev).logits
    assert (ours - theirs).abs().max().item() < MAX_ABS_DIFF


def test_greedy_generation_gives_the_same_tokens(exported, tiny_checkpoint_dir):
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(exported)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    generator = AstT5Generator.from_checkpoint(str(tiny_checkpoint_dir), device="cpu",
                                               max_new_tokens=12)
    compared = 0
    for text in ["def f(x):\n\treturn <extra_id_0>", "import os\n", "class A:\n    pass"]:
        ours = generator.generate_ids([generator.encode_source(text)])[0][0]
        ids = tokenizer(text, return_tensors="pt").input_ids
        # fairseq never emits <pad> and forbids </s> first: ask Hugging Face for the same
        out = model.generate(input_ids=ids, do_sample=False, num_beams=1, max_new_tokens=12,
                             min_new_tokens=1, suppress_tokens=[1])[0].tolist()
        assert out[0] == 2  # decoder start = </s>
        theirs = [t for t in out[1:] if t not in (1, 2)]
        assert ours == theirs[:len(ours)] and len(ours) >= min(len(theirs), 12)
        compared += len(ours)
    assert compared >= 10


def test_auto_tokenizer_encodes_and_decodes_like_ours(exported, tokenizer_dir, code_corpus):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    codec = TextCodec.from_dir(str(tokenizer_dir))
    files = [p.read_text(encoding="utf-8") for p in sorted(code_corpus.rglob("*.*"))[:12]]
    for text in TRICKY + SENTINEL_TEXTS + files:
        ids = tokenizer(text).input_ids
        assert ids == codec.encode(text) + [codec.eos]
        assert tokenizer.decode(ids[:-1]) == text == codec.decode(ids)
        assert tokenizer.decode(ids, skip_special_tokens=True) == codec.decode(ids)
    assert tokenizer.pad_token_id == 1 and tokenizer.eos_token_id == 2
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == codec.vocab_size - 1


def test_backend_tokenizer_matches_sentencepiece_on_random_text(tokenizer_dir):
    codec = TextCodec.from_dir(str(tokenizer_dir))
    backend = build_backend_tokenizer(codec)
    rng = random.Random(0)
    alphabet = list(" \t\n\r\u00a0abcXYZ_019()[]{}:;.,'\"#<>/é漢😀\x00")
    alphabet += ["def ", "    ", "self."]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert backend.encode(text, add_special_tokens=False).ids == codec.encode(text), repr(text)


def test_import_round_trip_gives_identical_weights(exported, tiny_checkpoint_dir, tmp_path):
    out = tmp_path / "imported"
    import_from_hf(str(exported), str(out))
    assert {"checkpoint.pt", "spm.model", "dict.txt", "tokenizer.json"} <= set(os.listdir(out))
    original = torch.load(tiny_checkpoint_dir / "checkpoint.pt", weights_only=False)
    back = torch.load(out / "checkpoint.pt", weights_only=False)
    assert back["model"].keys() == original["model"].keys()
    assert all(torch.equal(back["model"][k], original["model"][k]) for k in original["model"])
    assert (out / "spm.model").read_bytes() == (tiny_checkpoint_dir / "spm.model").read_bytes()
    assert (out / "dict.txt").read_text() == (tiny_checkpoint_dir / "dict.txt").read_text()
    again = load_checkpoint(str(out))  # the imported directory is a usable checkpoint
    assert again.model.cfg.embed_dim == 32


def test_import_errors(exported, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((exported / name).read_bytes())
    with pytest.raises(HFImportError, match="pass --tokenizer DIR"):
        import_from_hf(str(bare), str(tmp_path / "o1"))
    google = tmp_path / "google"
    google.mkdir()
    for name in os.listdir(exported):
        (google / name).write_bytes((exported / name).read_bytes())
    config = json.loads((google / "config.json").read_text())
    config.update(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    (google / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFImportError, match="Google's T5 vocabulary layout is not supported"):
        import_from_hf(str(google), str(tmp_path / "o2"))
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_paper_family_export_is_a_clear_error(tmp_path, tokenizer_dir):
    paper = build_tiny_checkpoint(tmp_path / "paper", tokenizer_dir, arch="ast_t5_paper_tiny")
    with pytest.raises(ExportError, match="ast_t5_paper family cannot be exported"):
        export_to_hf(str(paper), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    assert export_module.main([str(paper), str(tmp_path / "out")]) == 2
    assert "\n" not in PAPER_FAMILY_ERROR


def test_output_directory_is_replaced_only_with_force(tmp_path, tiny_checkpoint_dir, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(OutputExistsError):
        export_to_hf(str(tiny_checkpoint_dir), str(out))
    assert export_module.main([str(tiny_checkpoint_dir), str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert export_module.main([str(tiny_checkpoint_dir), str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no temporary leftovers


def test_import_command_prints_overrides_that_fine_tune(exported, tmp_path, capsys, seq2seq_data):
    from ast_t5.hf.importer import main as import_main

    from ..finetune.test_finetune_train import finetune

    out = tmp_path / "imported"
    assert import_main([str(exported), str(out)]) == 0
    overrides = capsys.readouterr().out.strip().splitlines()[-1].split()
    values = dict(o.split("=", 1) for o in overrides)
    start, tokenizer = values.pop("checkpoint.finetune_from_model"), values.pop("task.tokenizer")
    model_args = [f"{k}={v}" for k, v in values.items()] + ["model.dropout=0.0"]
    assert "++model.embed_dim=32" in model_args
    _, train, valid = finetune(tmp_path, "concode", seq2seq_data, tokenizer, start,
                               model_args=model_args)
    assert train and "valid_best_bleu" in valid[-1]
