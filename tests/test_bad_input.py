"""Bad input and faults, refused at the edge with a message naming the argument: one table.

Each case runs one bad call, the way a user would make it (the Python API, or a script's
`main(argv)` in this process), and checks the exception or exit status and that the message
names the argument or file and what is allowed. Generation and training run compiled (XLA),
where an id outside the vocabulary would otherwise give a silent wrong answer.
See also tests/export/test_bad_input.py (the exporter's files) and tests/recipes/test_resume.py.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kzoo
import kzoo.data
from kzoo import export
from kzoo.export.tflite.convert import convert
from kzoo.files import remove_stale_staging
from tests.export.tiny_models import TRANSFORMER
from tests.export.tiny_models import build
from tests.export.tiny_models import redraw

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "recipes"))  # The recipes import `_common` as a top-level module.
sys.path.insert(0, str(REPOSITORY / "export"))  # The serving scripts import `serving_example`.

import _common  # noqa: E402
import _language_models  # noqa: E402
import gpt_lm  # noqa: E402

V = 64  # The tiny models' vocabulary (tests.export.tiny_models).
# gpt_lm, tiny and quick.
TINY_RUN = [
    "--quick", "--steps", "4", "--epochs", "2", "--batch-size", "4", "--sequence-length", "16",
    "--validation-batches", "1", "--sample-length", "4", "--prompt", "RO",
]  # fmt: skip


def script(name):
    spec = importlib.util.spec_from_file_location(name, REPOSITORY / "export" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_layer_gpt(tokenizer=None):
    """A tiny GPT (`tests.export.tiny_models`' sizes) of one layer: the refusals name its vocabulary
    and length, not its depth, and one layer is traced, compiled and converted in about half the
    time of two."""
    backbone = kzoo.models.GPTBackbone(num_layers=1, vocabulary_size=V, **TRANSFORMER)
    return redraw(kzoo.models.GPTCausalLM(backbone, tokenizer=tokenizer))


class Files:
    """The models and files the cases call, made once (lazily) for the whole module."""

    def __init__(self, folder):
        self.folder = folder

    def __getattr__(self, name):
        value = getattr(self, f"_make_{name}")()
        setattr(self, name, value)
        return value

    def _make_gpt(self):
        model = one_layer_gpt()
        model.compile(jit_compile=True)
        return model

    def _make_seq2seq(self):
        return build("seq2seq")

    def _make_text_classifier(self):
        """A BERT classifier carrying its WordPiece tokenizer: `predict` takes strings."""
        vocabulary = kzoo.data.train_word_piece_vocabulary(["a fine film", "a dull film"], 30)
        backbone = kzoo.models.BertBackbone(
            vocabulary_size=V, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=16
        )
        return kzoo.models.BertClassifier(backbone, 2, tokenizer=kzoo.data.word_piece_tokenizer(vocabulary))

    def _make_text_gpt(self):
        """A GPT carrying a character tokenizer: `generate` takes strings."""
        return one_layer_gpt(tokenizer=kzoo.data.character_tokenizer(V))

    def _make_chat_lm(self):
        """A Llama carrying a byte-level BPE with a ChatML template: `chat` takes messages."""
        from kzoo.checkpoints.hf import tokenizer_files as hf_tokenizer_files
        from tests.models import tokenizer_files

        folder = tokenizer_files.write_byte_level_folder(self.folder / "chatml", "smollm", CHATML)
        tokenizer, _ = hf_tokenizer_files.read_tokenizer_json(folder)
        backbone = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=tokenizer.vocabulary_size())
        return kzoo.models.CausalLM(backbone, tokenizer=tokenizer)

    def _make_litertlm(self):
        """The LiteRT-LM bundle of `text_gpt` (16 tokens, no chat template)."""
        out = self.folder / "litertlm"
        export.export(self.text_gpt, out, formats="litertlm", num_examples=2, latency_runs=1, generate_tokens=2)
        return out / "model.litertlm"

    def _make_signatures(self):
        """`gpt`'s serving signatures, traced once for its TFLite file and its SavedModel."""
        return export.ServingSignatures(self.gpt)

    def _make_tflite(self):
        path = self.folder / "gpt.tflite"
        path.write_bytes(convert(self.signatures, "tflite_fp32"))
        return path

    def _make_truncated_tflite(self):
        path = self.folder / "truncated.tflite"
        data = self.tflite.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path

    def _make_empty_tflite(self):
        path = self.folder / "empty.tflite"
        path.write_bytes(b"")
        return path

    def _make_empty_gguf(self):
        path = self.folder / "empty.gguf"
        path.write_bytes(b"")
        return path

    def _make_savedmodel(self):
        path = self.folder / "savedmodel"
        self.signatures.save(path)
        return path

    def _make_plain_savedmodel(self):
        path = self.folder / "plain_savedmodel"
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).export(str(path), verbose=False)
        return path

    def _make_keras_file(self):
        path = self.folder / "gpt.keras"
        build("gpt").save(path)
        return path

    def _make_litert(self):
        return export.LiteRTModel(self.tflite)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return Files(tmp_path_factory.mktemp("bad_input"))


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tfds")


def recipe(tmp_path, tfds_dir, *flags, output_dir=None):
    """gpt_lm, tiny, with `flags` after the tiny ones (later flags win)."""
    output_dir = output_dir or tmp_path / "run"
    gpt_lm.main([*TINY_RUN, "--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir), *flags])


def bad_data_fit(files):
    """A recipe's fit (`Run.fit`'s pipeline check) on a stream holding id 300 of a 64-id model."""
    model = files.gpt
    ids = np.full((4, 8), 300, "int32")
    stream = tf.data.Dataset.from_tensor_slices(({"token_ids": ids, "padding_mask": np.ones_like(ids)}, ids)).batch(2)

    class Args:
        recipe = "test"

    with _common.stop_on_bad_token_ids(Args):
        model.fit(_common.checked_token_ids(stream, model), epochs=1, verbose=0)


def locked_output_dir(tmp_path, tfds_dir):
    """A second run on an --output-dir while another process holds it (here: this test's lock)."""
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    with open(output_dir / _common.LOCK_FILE, "w") as lock:
        lock.write("pid 4242 on otherhost, running gpt_lm.py\n")
        lock.flush()
        holder = subprocess.Popen(
            [sys.executable, "-c", (f"import fcntl, time; f = open({str(output_dir / '.lock')!r}); "
             "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout.readline() == "held\n"
            recipe(tmp_path, tfds_dir, output_dir=output_dir)
        finally:
            holder.kill()
            holder.wait()


def rerun_with_another_preset(tmp_path, tfds_dir):
    """The folder of a killed gpt_small run (its backup and settings), rerun with gpt_tiny."""
    output_dir = tmp_path / "run"
    (output_dir / "backup").mkdir(parents=True)
    settings = _common.run_settings(gpt_lm_args(output_dir, tfds_dir))
    (output_dir / _common.UNFINISHED_RUN_FILE).write_text(json.dumps(dict(settings, preset="gpt_small")))
    recipe(tmp_path, tfds_dir, output_dir=output_dir)


def gpt_lm_args(output_dir, tfds_dir):
    argv = [*TINY_RUN, "--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir)]
    return _common.parse_args(
        argv, gpt_lm.__file__, gpt_lm.__doc__, _language_models.DEFAULTS, _language_models.QUICK, gpt_lm.add_arguments
    )


def output_dir_is_a_file(tmp_path, tfds_dir):
    (tmp_path / "file").write_text("")
    recipe(tmp_path, tfds_dir, output_dir=tmp_path / "file")


def empty_corpus(tmp_path, tfds_dir):
    data = tmp_path / "data"
    (data / "tinyshakespeare").mkdir(parents=True)
    (data / "tinyshakespeare" / "input.txt").write_text("")
    recipe(tmp_path, tfds_dir, "--data-dir", str(data))


def backup_of_another_model(tmp_path):
    """kzoo.training.BackupAndRestore restoring the backup of a 1-layer model into a 2-layer one."""
    ids = np.ones((8, 8), "int32")
    data = tf.data.Dataset.from_tensor_slices(({"token_ids": ids, "padding_mask": ids}, ids)).batch(4).repeat()
    for layers in (1, 2):
        model = kzoo.models.GPTCausalLM(
            kzoo.models.GPTBackbone(
                vocabulary_size=V,
                num_layers=layers,
                num_heads=2,
                hidden_dim=16,
                intermediate_dim=32,
                max_sequence_length=8,
            )
        )
        # Eager steps: the second fit is refused before its first, and tracing and optimizing
        # the first fit's training step took seconds for two steps.
        model.compile(run_eagerly=True)
        backup = kzoo.training.BackupAndRestore(str(tmp_path / "backup"), save_freq="epoch", delete_checkpoint=False)
        model.fit(data, epochs=1, steps_per_epoch=2, callbacks=[backup], verbose=0)


def serve(name, *argv):
    return script(name).main([str(argument) for argument in argv])


def exit_status(status):
    """A script's `main` status as the process would exit with it."""
    raise SystemExit(status)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# (id, call(files, tmp_path, tfds_dir), what it raises, the exit status for SystemExit, the message)
CASES = [
    # generate(), compiled: the ids are checked on the host first.
    ("generate_id_above_the_vocabulary", lambda f, *_: f.gpt.generate([[300, 2]], max_new_tokens=4), ValueError, None,
     "`prompts` must be in [0, 64) (the model's vocabulary_size); received 300."),
    ("generate_negative_id", lambda f, *_: f.gpt.generate([[-1, 2]], max_new_tokens=4), ValueError, None,
     "`prompts` must be in [0, 64)"),
    ("generate_float_ids", lambda f, *_: f.gpt.generate([[1.7, 5.2]], max_new_tokens=4), ValueError, None,
     "`prompts` must hold integer token ids; received float64 values such as 1.7."),
    ("generate_float_array", lambda f, *_: f.gpt.generate(np.array([[1.0, 5.0]]), max_new_tokens=4), ValueError, None,
     "`prompts` must hold integer token ids"),
    ("generate_stop_id_above_the_vocabulary", lambda f, *_: f.gpt.generate([[1, 2]], max_new_tokens=2, stop_token_ids=[999]),
     ValueError, None, "`stop_token_ids` must be in [0, 64)"),
    ("generate_max_length_0", lambda f, *_: f.gpt.generate([[1, 2]], max_length=0), ValueError, None,
     "`max_length` must be an int >= 1; received max_length=0."),
    ("generate_max_new_tokens_0", lambda f, *_: f.gpt.generate([[1, 2]], max_new_tokens=0), ValueError, None,
     "`max_new_tokens` must be an int >= 1"),
    ("generate_max_new_tokens_beyond_the_model", lambda f, *_: f.gpt.generate([[1, 2], [3]], max_new_tokens=10**9),
     ValueError, None, ("`max_new_tokens` must be <= 14: the longest prompt has 2 tokens and the model's maximum "
                        "sequence length is 16; received max_new_tokens=1000000000.")),
    ("generate_prompt_as_long_as_the_model", lambda f, *_: f.gpt.generate([[1], list(range(1, 17))]), ValueError, None,
     ("Prompt 1 of `prompts` has 16 tokens, which leaves no room to generate within the model's maximum sequence "
      "length (16): a prompt must have fewer than 16 tokens.")),
    ("generate_prompt_of_none", lambda f, *_: f.gpt.generate([[None]], max_new_tokens=2), ValueError, None,
     "`prompts` must hold integer token ids; received object values such as None."),
    # Samplers: each argument's type and range.
    ("sampler_temperature_a_string", lambda *_: kzoo.samplers.RandomSampler(temperature="0.5"), ValueError, None,
     "`temperature` must be a finite number in (0, inf); received temperature='0.5'."),
    ("sampler_length_penalty_nan", lambda *_: kzoo.samplers.BeamSampler(length_penalty=float("nan")), ValueError, None,
     "`length_penalty` must be a finite number in (-inf, inf); received length_penalty=nan."),
    ("sampler_top_p_nan", lambda *_: kzoo.samplers.TopPSampler(p=float("nan")), ValueError, None,
     "`p` must be a finite number in (0, 1]; received p=nan."),
    ("sampler_seed_a_float", lambda *_: kzoo.samplers.TopKSampler(seed=0.5), ValueError, None,
     "`seed` must be None or an integer in [-2**63, 2**63); received seed=0.5."),
    ("seq2seq_start_token_above_the_vocabulary", lambda f, *_: f.seq2seq.generate([[7, 8]], 10**6, max_new_tokens=2),
     ValueError, None, "`start_token_id` must be in [0, 64) (the model's vocabulary_size); received 1000000."),
    ("seq2seq_float_source", lambda f, *_: f.seq2seq.generate([[7.5, 8]], 5, max_new_tokens=2), ValueError, None,
     "`encoder_token_ids` must hold integer token ids"),
    ("seq2seq_source_above_the_vocabulary", lambda f, *_: f.seq2seq.generate([[7, 80]], 5, max_new_tokens=2), ValueError,
     None, "`encoder_token_ids` must be in [0, 64)"),
    # Keras drops a functional model's unknown arguments: kzoo names them.
    ("from_preset_misspelt_backbone_argument", lambda *_: kzoo.models.GPTBackbone.from_preset("gpt_tiny", num_layerz=2),
     TypeError, None, "GPTBackbone got unexpected arguments ['num_layerz']"),
    ("from_preset_misspelt_task_argument", lambda *_: kzoo.models.GPTCausalLM.from_preset("gpt_tiny", tokeniser=None),
     TypeError, None, "GPTCausalLM got unexpected arguments ['tokeniser']"),
    # predict (and fit, evaluate) on NumPy input, compiled.
    ("predict_empty_batch", lambda f, *_: f.gpt.predict({"token_ids": np.zeros((0, 4), "int32"), "padding_mask": np.zeros((0, 4))}),
     ValueError, None, "`token_ids` has no rows: predict needs at least one example"),
    ("predict_float_ids", lambda f, *_: f.gpt.predict({"token_ids": np.array([[1.7, 5.2]]), "padding_mask": np.ones((1, 2))}),
     ValueError, None, "`token_ids` must hold integer token ids"),
    ("predict_id_above_the_vocabulary", lambda f, *_: f.gpt.predict({"token_ids": np.array([[300, 5]]), "padding_mask": np.ones((1, 2))}),
     ValueError, None, "`token_ids` must be in [0, 64)"),
    # predict on text (a model with a tokenizer): each item a string, and Unicode text.
    ("predict_none", lambda f, *_: f.text_classifier.predict([None]), ValueError, None,
     "`x` must hold integer token ids (or be strings: the model has a tokenizer); received None (NoneType)."),
    ("predict_a_number_among_strings", lambda f, *_: f.text_classifier.predict(["a fine film", 5]), ValueError, None,
     "`x[1]` is 5 (int), not a string: `x` must be all strings (text) or all token ids."),
    ("predict_a_lone_surrogate", lambda f, *_: f.text_classifier.predict(["a fine film", "fine \ud800"]), ValueError,
     None, "`x[1]` is not Unicode text: character 5 of 'fine \\ud800' is a lone surrogate ('\\ud800')"),
    ("generate_a_lone_surrogate", lambda f, *_: f.text_gpt.generate("fine \ud800", max_new_tokens=2), ValueError,
     None, "`prompts` is not Unicode text: character 5 of 'fine \\ud800' is a lone surrogate ('\\ud800')"),
    ("predict_bytes_not_utf8", lambda f, *_: f.text_classifier.predict([b"caf\xe9"]), ValueError, None,
     "`x[0]` is not UTF-8 text: byte 3 of b'caf\\xe9' cannot be decoded (unexpected end of data)"),
    ("fit_id_above_the_vocabulary", lambda f, *_: f.gpt.fit({"token_ids": np.array([[300, 5]]), "padding_mask": np.ones((1, 2))}, np.ones((1, 2))),
     ValueError, None, "`token_ids` must be in [0, 64)"),
    # A recipe's training stream (checked in its tf.data pipeline), compiled step.
    ("recipe_data_id_above_the_vocabulary", lambda f, *_: bad_data_fit(f), SystemExit, "message",
     "test: The data holds token ids outside the vocabulary of the model, [0, 64), in `token_ids`: ids from 300 to 300"),
    # LiteRTModel (TFLite has no assertions: NaN logits otherwise).
    ("litert_negative_id", lambda f, *_: f.litert.run(token_ids=[[-5, 2, 3]], padding_mask=[[1, 1, 1]]), ValueError, None,
     "`token_ids` must be in [0, 64) (the model's vocabulary_size); received -5."),
    ("litert_float_ids", lambda f, *_: f.litert.run(token_ids=[[1.5, 2.0]], padding_mask=[[1, 1]]), ValueError, None,
     "`token_ids` must hold integers; received float64 values."),
    ("litert_empty_ids", lambda f, *_: f.litert.run(token_ids=np.zeros((1, 0)), padding_mask=np.zeros((1, 0))), ValueError,
     None, "`token_ids` is empty (shape (1, 0))"),
    ("litert_longer_than_the_model", lambda f, *_: f.litert.run(token_ids=np.ones((1, 17), int), padding_mask=np.ones((1, 17), int)),
     ValueError, None, "`token_ids` has 17 tokens, more than the model's maximum of 16."),
    ("litert_generate_float_prompt", lambda f, *_: f.litert.generate([1.7, 5]), ValueError, None,
     "`prompt_ids` must hold integer token ids"),
    ("litert_generate_max_length_0", lambda f, *_: f.litert.generate([1, 2], max_length=0), ValueError, None,
     "`max_length` (0) must be > the prompt length (2) and <= the cache length (16)."),
    ("litert_generate_stop_id_above_the_vocabulary", lambda f, *_: f.litert.generate([1, 2], stop_token_ids=[64]), ValueError,
     None, "`stop_token_ids` must be in [0, 64)"),
    ("litert_truncated_file", lambda f, *_: export.LiteRTModel(f.truncated_tflite), ValueError, None,
     "truncated.tflite is not a valid TFLite file (empty, truncated or corrupt?)"),
    ("litert_empty_file", lambda f, *_: export.LiteRTModel(f.empty_tflite), ValueError, None,
     "empty.tflite is not a valid TFLite file"),
    # serve_tflite.py
    ("serve_tflite_negative_id", lambda f, *_: serve("serve_tflite", f.tflite, "--token-ids=-5,2,3"), SystemExit, 2,
     "`token_ids` (--token-ids) must be in [0, 64) (the model's vocabulary_size); received -5."),
    ("serve_tflite_negative_id_as_a_separate_argument", lambda f, *_: serve("serve_tflite", f.tflite, "--token-ids", "-5,2"),
     SystemExit, 2, "`token_ids` (--token-ids) must be in [0, 64)"),
    ("serve_tflite_float_ids", lambda f, *_: serve("serve_tflite", f.tflite, "--token-ids", "1.5,2"), SystemExit, 2,
     "argument --token-ids: expected comma-separated integers such as 72,105,33; received '1.5,2'"),
    ("serve_tflite_max_length_not_above_the_prompt", lambda f, *_: serve("serve_tflite", f.tflite, "--token-ids", "5,2", "--max-length", 2),
     SystemExit, 2, "`max_length` (--max-length) (2) must be > the prompt length (2)"),
    ("serve_tflite_truncated_file", lambda f, *_: serve("serve_tflite", f.truncated_tflite, "--token-ids", "5,2"), SystemExit, 2,
     "truncated.tflite is not a valid TFLite file"),
    # serve_litertlm.py and chats
    ("serve_litertlm_prompt_longer_than_the_bundle",
     lambda f, *_: exit_status(serve("serve_litertlm", f.litertlm, "--prompt", "x" * 20)), SystemExit, 1,
     "serve failed: The prompt is 20 tokens long; model.litertlm takes at most 16 tokens in all, so a prompt may have at most 15."),
    ("serve_litertlm_chat_without_a_template", lambda f, *_: exit_status(serve("serve_litertlm", f.litertlm, "--chat")),
     SystemExit, 1, "serve failed: model.litertlm has no chat template: --chat needs the bundle of a chat model."),
    ("chat_message_without_a_role", lambda f, *_: f.chat_lm.chat([{"role": "system", "content": "Be brief."}, {"content": "Hi"}], max_new_tokens=2),
     ValueError, None, "Message 1 has no 'role' (a string such as 'user')"),
    # serve_savedmodel.py
    ("serve_savedmodel_negative_id", lambda f, *_: serve("serve_savedmodel", f.savedmodel, "--token-ids", "-5,2"), SystemExit,
     2, "`token_ids` (--token-ids) must be in [0, 64)"),
    ("serve_savedmodel_max_length_shorter_than_the_prompt",
     lambda f, *_: serve("serve_savedmodel", f.savedmodel, "--token-ids", "5,2,3", "--max-length", 2), SystemExit, 2,
     "`max_length` (--max-length) (2) must be > the prompt length (3)"),
    ("serve_savedmodel_text_not_utf8", lambda f, *_: serve("serve_savedmodel", f.savedmodel, "--text", "\udcff\udcfe"),
     SystemExit, 2, "`--text` is not valid UTF-8"),
    ("serve_savedmodel_without_kzoo_signatures", lambda f, *_: serve("serve_savedmodel", f.plain_savedmodel, "--token-ids", "1"),
     SystemExit, 2, "has no kzoo serving signatures"),
    # export
    ("export_num_examples_0", lambda f, *_: serve("export", f.keras_file, "--out", f.folder / "out", "--num-examples", 0),
     SystemExit, 2, "argument --num-examples: must be an integer >= 1; received '0'"),
    ("export_max_length_0", lambda f, *_: serve("export", f.keras_file, "--out", f.folder / "out", "--max-length", 0),
     SystemExit, 2, "argument --max-length: must be an integer >= 1"),
    ("export_api_num_examples_0", lambda f, *_: export.export(f.gpt, f.folder / "out", num_examples=0), export.ExportError,
     None, "`num_examples` must be an int >= 1; received num_examples=0."),
    ("export_api_int4_rerounding_negative", lambda f, *_: export.export(f.gpt, f.folder / "out", int4_rerounding=-0.1),
     export.ExportError, None, "`int4_rerounding` must be a number of nats in [0, 1]; received -0.1."),
    ("export_api_int4_rerounding_nan", lambda f, *_: export.export(f.gpt, f.folder / "out", int4_rerounding=float("nan")),
     export.ExportError, None, "`int4_rerounding` must be a number of nats in [0, 1]; received nan."),
    ("export_api_max_length_0", lambda f, *_: export.export(f.gpt, f.folder / "out", max_length=0), export.ExportError,
     None, "`max_length` must be an int >= 1"),
    ("export_api_gguf_not_gguf", lambda f, *_: export.export(f.empty_gguf, f.folder / "out"), export.ExportError,
     None, "Could not load "),
    ("export_api_not_a_model_file", lambda f, *_: export.export(f.empty_tflite, f.folder / "out"), export.ExportError,
     None, "empty.tflite is not a .keras file (save the model with `model.save('model.keras')`) nor a GGUF file."),
    # Recipes (gpt_lm), training: flags, data and the output folder.
    ("recipe_negative_learning_rate", lambda f, t, d: recipe(t, d, "--learning-rate", "-1"), SystemExit, 2,
     "--learning-rate must be a positive finite number; received -1.0."),
    ("recipe_nan_learning_rate", lambda f, t, d: recipe(t, d, "--learning-rate", "nan"), SystemExit, 2,
     "--learning-rate must be a positive finite number; received nan."),
    ("recipe_fewer_steps_than_epochs", lambda f, t, d: recipe(t, d, "--steps", "2", "--epochs", "5"), SystemExit, 2,
     "--steps (2) must be >= --epochs (5): every epoch trains at least one step."),
    ("recipe_output_dir_is_a_file", lambda f, t, d: output_dir_is_a_file(t, d),
     SystemExit, 2, "file is a file; pass a folder"),
    ("recipe_empty_corpus", lambda f, t, d: empty_corpus(t, d), SystemExit, 2, "input.txt"),
    ("recipe_output_dir_in_use", lambda f, t, d: locked_output_dir(t, d), SystemExit, 2,
     "is in use by another run: pid 4242 on otherhost, running gpt_lm.py. Wait for it to end, or pass another --output-dir."),
    ("recipe_rerun_with_another_preset", lambda f, t, d: rerun_with_another_preset(t, d), SystemExit, 2,
     ("holds the backup of an unfinished run of other settings, so it belongs to another model or training: "
      "--preset gpt_small (now gpt_tiny). Rerun that run's command to resume it, or delete")),
    ("training_restores_the_backup_of_another_model", lambda f, t, d: backup_of_another_model(t), ValueError, None,
     "was written by another model or optimizer, and does not load into this one"),
]  # fmt: skip


@pytest.mark.parametrize("call, error, status, message", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_refused_with_a_message_naming_it(call, error, status, message, files, tfds_dir, tmp_path, capsys):
    with pytest.raises(error) as raised:
        call(files, tmp_path, tfds_dir)
    if error is SystemExit and status != "message":
        assert raised.value.code == status
        text = capsys.readouterr().err
    else:
        text = str(raised.value.code if error is SystemExit else raised.value)
    assert message in text


@pytest.mark.e2e  # a recipe or an export, killed or failing, in another process
def test_a_nan_loss_stops_the_recipe_and_saves_nothing_over_its_model(tfds_dir, tmp_path, capsys):
    """A learning rate far too high: the loss turns NaN or Inf; training stops there (exit
    status 1, with a message), no model is written and the last backup stays finite."""
    with pytest.raises(SystemExit) as raised:
        recipe(tmp_path, tfds_dir, "--learning-rate", "1e30")
    message = str(raised.value.code)
    assert message.startswith("gpt_lm: training stopped: NaN or Inf loss encountered") or "hold NaN or Inf" in message
    assert "Lower --learning-rate (now 1e+30)" in message
    assert not (tmp_path / "run" / "model.keras").exists() and not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.e2e  # a recipe or an export, killed or failing, in another process
def test_a_killed_export_leaves_no_hidden_folder_once_the_next_one_ran(files, tmp_path):
    """SIGKILL during an export leaves its `.out.<host>-<pid>.*.partial` staging folder; the next
    export to the same path removes it (its process is dead) and writes a complete export."""
    out = tmp_path / "out"
    command = [sys.executable, str(REPOSITORY / "export" / "export.py"), str(files.keras_file), "--out", str(out),
               "--formats", "tflite_fp32", "--num-examples", "2", "--latency-runs", "1", "--generate-tokens", "2"]  # fmt: skip
    environment = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    )
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob(".out.*.partial")):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    (partial,) = tmp_path.glob(".out.*.partial")
    assert f"-{process.pid}." in partial.name  # .out.<host>-<pid>.<random>.partial
    assert not out.exists()

    export.export(files.keras_file, out, formats=["tflite_fp32"], num_examples=2, latency_runs=1, generate_tokens=2)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    assert sorted(path.name for path in out.iterdir()) == [export.REPORT_FILE, "model_fp32.tflite"]


def test_a_partial_folder_of_a_running_export_is_kept(tmp_path):
    """Only the folders of dead processes go: a concurrent export's staging folder stays."""
    import socket

    running = tmp_path / f".out.{socket.gethostname()}-{os.getpid()}.abcd1234.partial"
    other_host = tmp_path / ".out.elsewhere-1.abcd1234.partial"
    running.mkdir()
    other_host.mkdir()
    remove_stale_staging(tmp_path / "out")
    assert running.is_dir() and other_host.is_dir()
