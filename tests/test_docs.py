"""Docs that run: the README's Python examples and the docstrings' `Example:` blocks.

Docstrings run as doctests: each `>>>` line runs and the lines after it are what it must print
(NORMALIZE_WHITESPACE; `...` stands for any text where the example says so, ELLIPSIS). A value
that changes from run to run (random weights) is shown by a stable property (a shape, a
length) or not at all. A docstring sees its module's names plus `kzoo` (with `kzoo.data`,
`kzoo.training` and `kzoo.visualization` imported), `keras`, `np` (NumPy) and `tf`, and runs
in a temporary folder shared by every docstring of the session, where it may write files
(`tfds/` for prepared datasets).

Each module of kzoo is in `DOCTEST_MODULES` (tested) or in `TO_ADD` (its docstrings are being
rewritten elsewhere; move it over once they run); `test_every_module_is_listed` keeps it so.

The README's ```python blocks run in order in one namespace, as a reader pasting them into one
session would, in a temporary folder. What a block leaves to the reader (a folder "path/to/...",
a name it does not define) comes from `README_SETUP`, keyed by a line of the block; a block that
cannot run here is named in `README_SKIPPED` with the reason.
"""

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kzoo
import kzoo._moved
import kzoo.data
import kzoo.training
import kzoo.visualization

REPOSITORY = Path(__file__).resolve().parents[1]

DOCTEST_MODULES = [
    "kzoo",
    "kzoo._compat",
    "kzoo._moved",
    "kzoo.checkpoints",
    "kzoo.checkpoints.arrays",
    "kzoo.checkpoints.errors",
    "kzoo.checkpoints.families",
    "kzoo.checkpoints.fetch",
    "kzoo.checkpoints.gguf",
    "kzoo.checkpoints.gguf.header",
    "kzoo.checkpoints.gguf.layout",
    "kzoo.checkpoints.gguf.quantization",
    "kzoo.checkpoints.gguf.reader",
    "kzoo.checkpoints.gguf.tokenizer",
    "kzoo.checkpoints.gguf.writer",
    "kzoo.checkpoints.hf",
    "kzoo.checkpoints.hf.load",
    "kzoo.checkpoints.hf.safetensors",
    "kzoo.checkpoints.hf.save",
    "kzoo.checkpoints.hf.tokenizer_files",
    "kzoo.checkpoints.keras_hub",
    "kzoo.checkpoints.tensor_maps",
    "kzoo.config",
    "kzoo.data",
    "kzoo.data.builders",
    "kzoo.data.corpora",
    "kzoo.data.pipelines",
    "kzoo.data.readers",
    "kzoo.export.tflite.repeated_blocks",
    "kzoo.export.tflite.rerounding",
    "kzoo.files",
    "kzoo.layers",
    "kzoo.layers._block",
    "kzoo.layers._prototypes",
    "kzoo.layers.add_and_norm",
    "kzoo.layers.feed_forward",
    "kzoo.layers.gated_feed_forward",
    "kzoo.layers.kv_cache",
    "kzoo.layers.layer_normalization",
    "kzoo.layers.masks",
    "kzoo.layers.multi_head_attention",
    "kzoo.layers.position_embedding",
    "kzoo.layers.rms_normalization",
    "kzoo.layers.rotary_embedding",
    "kzoo.layers.scaled_dot_product_attention",
    "kzoo.layers.sinusoidal_position_encoding",
    "kzoo.layers.token_and_position_embedding",
    "kzoo.layers.transformer_decoder_block",
    "kzoo.layers.transformer_encoder_block",
    "kzoo.logs",
    "kzoo.models",
    "kzoo.models.backbone",
    "kzoo.models.bert",
    "kzoo.models.bert.bert_backbone",
    "kzoo.models.bert.bert_classifier",
    "kzoo.models.bert.bert_classifier_base",
    "kzoo.models.bert.bert_hf",
    "kzoo.models.bert.bert_masked_lm",
    "kzoo.models.bert.bert_presets",
    "kzoo.models.bert.bert_token_classifier",
    "kzoo.models.cross_entropy",
    "kzoo.models.decoder",
    "kzoo.models.decoder.causal_lm",
    "kzoo.models.decoder.decoder_backbone",
    "kzoo.models.decoder.decoder_hf",
    "kzoo.models.decoder.decoder_presets",
    "kzoo.models.decoder.reply_logits",
    "kzoo.models.decoder.speculative",
    "kzoo.models.feed_forward",
    "kzoo.models.feed_forward.context_window",
    "kzoo.models.feed_forward.feed_forward_language_model",
    "kzoo.models.generation",
    "kzoo.models.gpt",
    "kzoo.models.gpt.gpt_backbone",
    "kzoo.models.gpt.gpt_causal_lm",
    "kzoo.models.gpt.gpt_hf",
    "kzoo.models.gpt.gpt_presets",
    "kzoo.models.multi_worker_trainer_mixin",
    "kzoo.models.perplexity",
    "kzoo.models.presets",
    "kzoo.models.rnn",
    "kzoo.models.rnn.bilstm_classifier",
    "kzoo.models.rnn.bilstm_tagger",
    "kzoo.models.rnn.recurrent_stack",
    "kzoo.models.rnn.rnn_language_model",
    "kzoo.models.seq2seq",
    "kzoo.models.seq2seq.seq2seq_backbone",
    "kzoo.models.seq2seq.seq2seq_presets",
    "kzoo.models.seq2seq.seq2seq_transformer",
    "kzoo.models.task",
    "kzoo.models.tied_logits",
    "kzoo.ops",
    "kzoo.ops._fusion",
    "kzoo.ops.activation",
    "kzoo.ops.attention",
    "kzoo.ops.checks",
    "kzoo.ops.cross_entropy",
    "kzoo.ops.dropout",
    "kzoo.ops.normalization",
    "kzoo.samplers",
    "kzoo.samplers.beam_sampler",
    "kzoo.samplers.greedy_sampler",
    "kzoo.samplers.random_sampler",
    "kzoo.samplers.sampler",
    "kzoo.samplers.top_k_sampler",
    "kzoo.samplers.top_p_sampler",
    "kzoo.tokenizers",
    "kzoo.tokenizers.bert",
    "kzoo.tokenizers.byte_pair",
    "kzoo.tokenizers.characters",
    "kzoo.tokenizers.chat_template",
    "kzoo.tokenizers.hugging_face",
    "kzoo.tokenizers.packing",
    "kzoo.tokenizers.tokenizer_json",
    "kzoo.tokenizers.word_piece",
    "kzoo.training",
    "kzoo.training.backup_and_restore",
    "kzoo.training.callbacks",
    "kzoo.training.run",
    "kzoo.training.sharding",
    "kzoo.training.strategy",
    "kzoo.training.training_config",
    "kzoo.validation",
    "kzoo.visualization",
]
# Being rewritten (the Hugging Face tokenizers, export): their docstrings join DOCTEST_MODULES once they run.
TO_ADD = [
    "kzoo.export",
    "kzoo.export.export_data",
    "kzoo.export.exporter",
    "kzoo.export.formats",
    "kzoo.export.litert_model",
    "kzoo.export.litertlm",
    "kzoo.export.litertlm.bundle",
    "kzoo.export.litertlm.signatures",
    "kzoo.export.litertlm.verification",
    "kzoo.export.litertlm_model",
    "kzoo.export.memory",
    "kzoo.export.serving_signatures",
    "kzoo.export.tflite",
    "kzoo.export.tflite.convert",
    "kzoo.export.tflite.graph_passes",
    "kzoo.export.tflite.placeholders",
    "kzoo.export.tflite.quantize",
    "kzoo.export.verification",
]

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory):
    """The working folder of every example: files they write (prepared datasets among them) stay there."""
    return tmp_path_factory.mktemp("docs")


@pytest.fixture
def in_docs_dir(docs_dir, monkeypatch):
    """The working folder, a fixed seed, and the global settings an example may change, restored after it."""
    monkeypatch.chdir(docs_dir)
    keras.utils.set_random_seed(0)
    policy, fused = keras.config.dtype_policy(), kzoo.config.is_fused_training_enabled()
    yield docs_dir
    keras.config.set_dtype_policy(policy)
    kzoo.config.set_fused_training(fused)


def test_every_module_is_listed():
    """Every module but the old paths of moved ones (kzoo._moved), which hold no docstring examples."""
    names = {"kzoo"} | {info.name for info in pkgutil.walk_packages(kzoo.__path__, "kzoo.")}
    names -= set(kzoo._moved.MOVED)
    assert not set(DOCTEST_MODULES) & set(TO_ADD)
    assert sorted(names - set(DOCTEST_MODULES) - set(TO_ADD)) == []
    assert sorted(set(DOCTEST_MODULES) | set(TO_ADD)) == sorted(names)


@pytest.mark.parametrize("name", DOCTEST_MODULES)
def test_docstring_examples_print_what_they_show(name, in_docs_dir):
    module = importlib.import_module(name)
    extra = {"kzoo": kzoo, "keras": keras, "np": np, "tf": tf}
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = []
    for test in doctest.DocTestFinder().find(module, name, globs=vars(module), extraglobs=extra):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


# === The README ===


def readme_blocks():
    """The ```python blocks of the README, in order, as `(first line, code)`."""
    text = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    return [(block.splitlines()[0], block) for block in blocks]


def _hf_bert_folder(path):
    from tests.models import hf_folders

    hf_folders.write_bert(Path(path), "BertForSequenceClassification", num_labels=2)


def _review_batches(folder):
    """Batches of labelled reviews, tokenized with `folder`'s tokenizer, packed as BERT reads them."""
    from kzoo.checkpoints.hf import tokenizer_files
    from kzoo.tokenizers import packing

    tokenizer = tokenizer_files.load_tokenizer(folder)
    reviews = tf.data.Dataset.from_tensor_slices((["a fine film", "a dull film"] * 4, [1, 0] * 4))
    special = {
        "start_token_id": packing.special_token_id(tokenizer, "cls_token"),
        "end_token_id": packing.special_token_id(tokenizer, "sep_token"),
    }
    return kzoo.data.classification_batches(reviews, tokenizer, 16, 4, **special)


def _hf_qwen3_folder(path):
    """A tiny random Qwen3 with a Qwen2-style byte-level BPE and Qwen3's chat template."""
    from kzoo.checkpoints.hf.tokenizer_files import load_tokenizer
    from tests.models import hf_folders
    from tests.models import tokenizer_files

    template = (REPOSITORY / "tests" / "models" / "data" / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")
    tokenizer_files.write_byte_level_folder(Path(path), "qwen2", template)
    size = len(load_tokenizer(path, {"model_type": "qwen3"}).get_vocabulary())
    hf_folders.write_decoder(Path(path), "qwen3", vocab_size=size, max_position_embeddings=256)


def _chat_batches(folder):
    """One batch of a chat: x, the next tokens y, and weights 1 on the reply's tokens."""
    lm_tokenizer = kzoo.models.CausalLM.from_preset(folder).tokenizer
    messages = [{"role": "user", "content": "Name a colour."}]
    prompt = lm_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    full = lm_tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": "Blue."}], tokenize=True)
    ids = np.array([full], "int32")
    weights = (np.arange(len(full) - 1) >= len(prompt) - 1).astype("float32")[None]
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}
    return tf.data.Dataset.from_tensors((x, ids[:, 1:], weights))


# What a README block leaves to the reader, keyed by a line of the block: folders made before
# it runs (`{path: make(path)}`) and names it uses without defining them (`{name: make()}`).
README_SETUP = {
    'lm = kzoo.models.CausalLM.from_preset("path/to/qwen3-folder")      # any of the model types above': dict(
        folders={"path/to/qwen3-folder": _hf_qwen3_folder},
        names={"chat_batches": lambda: _chat_batches("path/to/qwen3-folder")},
    ),
    'classifier = kzoo.models.BertClassifier.from_preset("path/to/bert-folder", num_classes=2)': dict(
        folders={"path/to/bert-folder": _hf_bert_folder},
        names={"batches": lambda: _review_batches("path/to/bert-folder")},
    ),
    "lm.generate(prompts, max_length=128, sampler=kzoo.samplers.TopPSampler(p=0.9, seed=0))": dict(
        names={
            "prompts": lambda: [[72, 105], [84]],
            "model": lambda: kzoo.models.Seq2SeqTransformer.from_preset("transformer_tiny"),
            "source_ids": lambda: [[7, 8, 9], [4, 5]],
        },
    ),
}
# README blocks that cannot run here, keyed by a line of the block, with the reason.
README_SKIPPED = {
    "target.chat(question, draft_model=draft) == target.chat(question)  # True: the 1.5B's own greedy reply": (
        "needs both Qwen2.5-Coder files fetched and about 10 GB; tests/checkpoints/test_models_at_scale.py "
        "checks the pair's tokens (KZOO_SLOW=1)"
    ),
    'target.chat(question, draft_model=draft, jit_compile="draft")  # the bfloat16 1.5B\'s greedy reply': (
        "needs both Qwen2.5-Coder files fetched and about 7 GB, and the first block's names; "
        "tests/checkpoints/test_models_at_scale.py checks the pair's tokens (KZOO_SLOW=1)"
    ),
}
# What the README says a line gives, keyed by the line: a check of the value of its expression.
README_CHECKS = {
    (
        'lm.chat([{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])'
        "  # 'The capital of France is Paris.'"
    ): (lambda value: value == "The capital of France is Paris." or pytest.fail(repr(value))),
    "lm.chat(edit, draft_model=kzoo.models.PromptLookup()) == lm.chat(edit)  # True": (
        lambda value: value is True or pytest.fail(repr(value))
    ),
    "tuple(block(keras.random.normal((2, 16, 512))).shape)  # (2, 16, 512)": (
        lambda value: value == (2, 16, 512) or pytest.fail(repr(value))
    ),
    "keras.ops.matmul(keras.ops.stack(documents), query)  # cosine similarities: 0.755, 0.247, -0.017": (
        lambda value: np.testing.assert_allclose(keras.ops.convert_to_numpy(value), [0.755, 0.247, -0.017], atol=5e-4)
    ),
}


def test_readme_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    keras.utils.set_random_seed(0)
    blocks = readme_blocks()
    used = set()
    namespace = {}
    for index, (first_line, code) in enumerate(blocks):
        lines = code.splitlines()
        if any(key in lines for key in README_SKIPPED):
            used.update(key for key in README_SKIPPED if key in lines)
            continue
        for key, setup in README_SETUP.items():
            if key not in lines:
                continue
            used.add(key)
            for path, make in setup.get("folders", {}).items():
                make(path)
            namespace.update({name: make() for name, make in setup.get("names", {}).items()})
        exec(compile(code, f"README.md, python block {index + 1} ({first_line})", "exec"), namespace)
        for line, check in README_CHECKS.items():
            if line in lines:
                used.add(line)
                check(eval(line.split("#")[0], namespace))
    assert used == set(README_SETUP) | set(README_SKIPPED) | set(README_CHECKS), "a line named here is in no block"
