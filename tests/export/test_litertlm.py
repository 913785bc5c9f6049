"""LiteRT-LM bundles: run in Google's runtime (litert_lm), they give the Keras model's greedy text."""

import gc
import importlib.util
import json
import lzma
import os
import subprocess
import sys
import tempfile
import types
import weakref

import keras
import keras_hub
import numpy as np
import pytest
import tokenizers
from ai_edge_litert.interpreter import Interpreter

from kzoo import data
from kzoo import export
from kzoo import models
from kzoo.export import exporter
from kzoo.export import litertlm
from kzoo.export import litertlm_model
from kzoo.export import verification
from kzoo.tokenizers.tokenizer_json import hugging_face_tokenizer
from kzoo.tokenizers.word_piece import EOS_ID
from kzoo.tokenizers.word_piece import SEP_ID
from tests.export.test_serving_examples import REPOSITORY
from tests.export.tiny_models import TRANSFORMER
from tests.export.tiny_models import build
from tests.export.tiny_models import redraw

# The cache is shorter than the position table, so that only the bundle's own guard stops a
# prefill chunk from running past the cache.
CACHE_LENGTH = 32
MAX_LENGTH = 48
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak."


def one_layer_gpt(vocabulary_size, max_sequence_length, tokenizer=None):
    """A tiny GPT of one layer, its weights drawn as `build`'s: for the tests of tokenizers and
    of the export's checks (`exported`'s two layers check the bundle's per-layer caches), traced
    and converted in about half the time of two."""
    config = {**TRANSFORMER, "vocabulary_size": vocabulary_size, "max_sequence_length": max_sequence_length}
    return redraw(models.GPTCausalLM(models.GPTBackbone(num_layers=1, **config), tokenizer=tokenizer))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("litertlm")
    build("gpt", vocabulary_size=128, max_sequence_length=MAX_LENGTH).save(folder / "model.keras")
    data.save_tokenizer(data.character_tokenizer(128), folder)
    report = export.export(
        folder / "model.keras",
        folder / "export",
        formats=["litertlm"],
        cache_length=CACHE_LENGTH,
        num_examples=4,
        latency_runs=1,
        generate_tokens=8,
    )
    return folder, report


@pytest.fixture()
def runtime(exported):
    model = litertlm_model.LiteRTLMModel(exported[0] / "export" / "model.litertlm")
    yield model
    model.close()


@pytest.fixture(scope="module")
def keras_lm(exported):
    """The exported `.keras` file loaded back, and the tokenizer saved beside it."""
    folder = exported[0]
    return keras.saving.load_model(folder / "model.keras"), data.load_tokenizer(folder)


def keras_greedy_texts(keras_lm, prompts, new_tokens):
    """Keras' greedy continuation of each prompt, at most `new_tokens` (stopping at id 0), as text.

    The prompts go as one ragged batch, each row generating what it would alone: Keras traces
    one decoding loop for them all, not one per prompt length."""
    lm, tokenizer = keras_lm
    ids = [np.asarray(tokenizer(prompt)).tolist() for prompt in prompts]
    outputs = lm.generate(ids, max_length=max(map(len, ids)) + new_tokens, stop_token_ids=[0], jit_compile=False)
    return [tokenizer.detokenize(output[len(row) : len(row) + new_tokens]) for row, output in zip(ids, outputs)]


def test_greedy_text_in_the_runtime_equals_keras_generate(exported, runtime, keras_lm):
    _, report = exported
    # 1 and 7 characters, and 20 > 16, the only prefill chunk length: the runtime prefills twice.
    prompts = [TEXT[:length] for length in (1, 7, 20)]
    assert [runtime.generate(prompt, 10, top_k=1) for prompt in prompts] == keras_greedy_texts(keras_lm, prompts, 10)
    record = report["artifacts"]["litertlm"]
    assert record["generation"]["matches_keras"] and record["tokenizer"]["matches_keras"]
    assert max(case["prompt_tokens"] for case in record["generation"]["cases"]) > record["prefill_lengths"][-1]
    assert record["max_abs_diff"][str(CACHE_LENGTH)] <= record["tolerance"][str(CACHE_LENGTH)]


def test_characters_outside_the_vocabulary_are_the_unknown_id_in_both(runtime, keras_lm):
    prompt = "Hi 😀 ÿ"
    assert runtime.tokenize(prompt) == [72, 105, 32, 26, 32, 26] == np.asarray(keras_lm[1](prompt)).tolist()
    assert [runtime.generate(prompt, 6, top_k=1)] == keras_greedy_texts(keras_lm, [prompt], 6)


def test_the_model_follows_the_runtime_conventions(exported):
    flatbuffer = litertlm_model.read_tflite_model(exported[0] / "export" / "model.litertlm")
    interpreter = Interpreter(model_content=flatbuffer)
    signatures = interpreter.get_signature_list()
    assert sorted(signatures) == ["decode", "prefill_16"]
    caches = [f"kv_cache_{kind}_{i}" for i in range(2) for kind in "kv"]
    for name in signatures:
        assert set(signatures[name]["inputs"]) == {"tokens", "input_pos", *caches}
        runner = interpreter.get_signature_runner(name)
        inputs, outputs = runner.get_input_details(), runner.get_output_details()
        length = 16 if name == "prefill_16" else 1
        assert inputs["tokens"]["shape"].tolist() == [1, length] and inputs["tokens"]["dtype"] == np.int32
        assert inputs["input_pos"]["shape"].tolist() == [length] and inputs["input_pos"]["dtype"] == np.int32
        for cache in caches:  # (1, heads, cache length, head dim), the same tensor in and out
            assert inputs[cache]["shape"].tolist() == outputs[cache]["shape"].tolist() == [1, 2, CACHE_LENGTH, 8]
    assert set(signatures["prefill_16"]["outputs"]) == set(caches)
    assert interpreter.get_signature_runner("decode").get_output_details()["logits"]["shape"].tolist() == [1, 1, 128]


def test_the_check_in_place_gives_the_logits_of_decode_with_the_cache_passed_along(exported):
    """The exporter's float32 check updates one cache buffer in place; the plain way, the
    cache passed out of each `decode` call and into the next, gives the same logits."""
    for bundle in ("model.litertlm", "model_int8.litertlm"):
        flatbuffer = litertlm_model.read_tflite_model(exported[0] / "export" / bundle)
        decode = Interpreter(model_content=flatbuffer).get_signature_runner("decode")
        cache = {
            name: np.zeros(d["shape"], d["dtype"]) for name, d in decode.get_input_details().items() if "kv" in name
        }
        tokens, expected = np.random.default_rng(0).integers(1, 128, CACHE_LENGTH), []
        for position, token in enumerate(tokens):
            outputs = decode(tokens=np.int32([[token]]), input_pos=np.int32([position]), **cache)
            cache = {name: outputs[name] for name in cache}
            expected.append(outputs["logits"][0, -1])
        np.testing.assert_array_equal(litertlm_model.teacher_forced_logits(flatbuffer, tokens), expected)


def test_rows_checked_together_give_the_logits_of_each_row_alone(exported):
    flatbuffer = litertlm_model.read_tflite_model(exported[0] / "export" / "model.litertlm")
    rows = np.random.default_rng(1).integers(1, 128, (2, 12))
    together = litertlm_model.teacher_forced_logits(flatbuffer, rows)  # one compiled model for both
    assert together.shape == (2, 12, 128)
    for row, logits in zip(rows, together):
        np.testing.assert_array_equal(litertlm_model.teacher_forced_logits(flatbuffer, row), logits)


def test_a_prefill_chunk_past_the_cache_fails_instead_of_overwriting_it(exported):
    flatbuffer = litertlm_model.read_tflite_model(exported[0] / "export" / "model.litertlm")
    prefill = Interpreter(model_content=flatbuffer).get_signature_runner("prefill_16")
    inputs = {name: np.zeros(d["shape"], d["dtype"]) for name, d in prefill.get_input_details().items()}
    prefill(**{**inputs, "input_pos": np.arange(16, 32, dtype=np.int32)})  # the last 16 positions: fine
    with pytest.raises(Exception, match="SLICE"):
        prefill(**{**inputs, "input_pos": np.arange(20, 36, dtype=np.int32)})


def test_the_checked_length_defaults_to_the_cache_where_it_is_shorter_than_the_model(exported):
    assert exported[1]["checked_lengths"] == [1, 7, CACHE_LENGTH] and CACHE_LENGTH < MAX_LENGTH


def test_metadata(exported):
    metadata = litertlm_model.read_metadata(exported[0] / "export" / "model.litertlm")
    assert metadata.max_num_tokens == CACHE_LENGTH
    assert [list(token.token_ids.ids) for token in metadata.stop_tokens] == [[0]]
    assert not metadata.HasField("start_token")
    sampler = metadata.sampler_params
    # Top-k 5, as the runtime's CPU sampler takes it: TOP_P with p = 1.
    assert (sampler.type, sampler.k, sampler.p, sampler.temperature) == (sampler.TOP_P, 5, 1.0, 1.0)


def test_the_runtime_s_own_benchmark_runs_the_bundle_with_its_default_sampler(exported):
    # Google's tools take the bundle's sampler; one the runtime cannot build decodes nothing.
    import litert_lm

    info = litert_lm.Benchmark(
        model_path=str(exported[0] / "export" / "model.litertlm"),
        backend=litert_lm.Backend.CPU(thread_count=1),
        prefill_tokens=8,
        decode_tokens=8,
        cache_dir=":nocache",
        prompt="ROMEO: But soft, what light",
    ).run()
    assert (info.last_prefill_token_count, info.last_decode_token_count) == (8, 8)


@pytest.mark.parametrize(
    "sampler, written",
    [
        (litertlm.Sampler(), (5, 1.0)),
        (litertlm.Sampler(type="GREEDY"), (1, 1.0)),
        (litertlm.Sampler(type="TOP_P", k=40, p=0.9), (40, 0.9)),
    ],
)
def test_every_default_sampler_is_written_as_the_runtime_s_top_p(sampler, written):
    parameters = litertlm.llm_metadata(16, [0], sampler=sampler).sampler_params
    assert parameters.type == parameters.TOP_P and (parameters.k, round(parameters.p, 6)) == written
    with pytest.raises(ValueError, match="Unknown sampler type 'BEAM'"):
        litertlm.llm_metadata(16, [0], sampler=litertlm.Sampler(type="BEAM"))


def test_a_model_file_gives_the_logits_and_bundle_of_its_bytes_and_leaves_no_cache(exported, tmp_path, monkeypatch):
    """The checks read the bundles' models from files, their packed weights cached in a
    temporary file: the same logits, the same bundle, and nothing left behind."""
    flatbuffer = litertlm_model.read_tflite_model(exported[0] / "export" / "model_int8.litertlm")
    path = tmp_path / "model.tflite"
    path.write_bytes(flatbuffer)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    rows = np.random.default_rng(2).integers(1, 128, (2, 9))
    np.testing.assert_array_equal(
        litertlm_model.teacher_forced_logits(path, rows), litertlm_model.teacher_forced_logits(flatbuffer, rows)
    )
    assert list(scratch.iterdir()) == []
    metadata = litertlm.llm_metadata(CACHE_LENGTH, [1])
    litertlm.write_bundle(tmp_path / "from_bytes.litertlm", flatbuffer, '{"model": {}}', metadata)
    litertlm.write_bundle(tmp_path / "from_file.litertlm", path, '{"model": {}}', metadata)
    # The same file but for the build time in its header.
    assert (tmp_path / "from_file.litertlm").stat().st_size == (tmp_path / "from_bytes.litertlm").stat().st_size
    assert litertlm_model.read_tflite_model(tmp_path / "from_file.litertlm") == flatbuffer


def test_int8_bundle_is_smaller_and_its_change_is_reported(exported):
    folder, report = exported
    fp32, int8 = report["artifacts"]["litertlm"], report["artifacts"]["litertlm_int8"]
    # The tiny model is mostly graph, not weights (and the bundle rounds sections to 16 KiB).
    assert int8["tflite_bytes"] < fp32["tflite_bytes"]
    assert (folder / "export" / "model_int8.litertlm").stat().st_size == int8["size_bytes"]
    assert int8["quality"]["cross_entropy_increase"] <= int8["quality"]["bound"] == 0.05
    assert 0 <= int8["generation"]["token_agreement"] <= 1 and int8["tokenizer"]["matches_keras"]
    assert sorted(path.name for path in (folder / "export").iterdir()) == [
        "export_report.json",
        "model.litertlm",
        "model_int8.litertlm",
    ]


def test_sampling_options_and_seed(runtime):
    greedy = runtime.generate("ROMEO:", 12, top_k=1)
    assert runtime.generate("ROMEO:", 12, top_k=1, temperature=0.5) == greedy
    sampled = [runtime.generate("ROMEO:", 12, top_k=40, seed=seed) for seed in (3, 3, 4)]
    assert sampled[0] == sampled[1] != sampled[2]
    assert "".join(runtime.stream("ROMEO:", 12, top_k=1)) == greedy and len(greedy) == 12


def test_bad_requests_get_clear_errors(runtime):
    with pytest.raises(ValueError, match="non-empty string"):
        runtime.generate("")
    with pytest.raises(ValueError, match="The prompt is 32 tokens long; model.litertlm takes at most 32"):
        runtime.generate("x" * CACHE_LENGTH)
    with pytest.raises(ValueError, match=r"`max_new_tokens` must be in \[1, 26\].* received 27"):
        runtime.generate("ROMEO:", 27)
    assert len(runtime.generate("ROMEO:", 26, top_k=1)) == 26


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--top-p", "1.5", "must be a finite number in [0, 1]; received 1.5"),
        ("--top-k", "0", "must be an integer in [1, 2147483647]; received 0"),
        ("--top-k", "4294967297", "must be an integer in [1, 2147483647]; received 4294967297"),  # wraps to 1 in C
        ("--temperature", "nan", "must be a finite number in [0, inf); received nan"),
        ("--seed", "4294967296", "must be an integer in [-2147483648, 2147483647]; received 4294967296"),
        ("--num-threads", "0", "must be an integer in [1, 2147483647]; received 0"),
        ("--max-new-tokens", "0", "`max_new_tokens` must be in [1, 26]"),
    ],
    ids=["top_p", "top_k", "top_k_wrapping", "temperature", "seed_wrapping", "num_threads", "max_new_tokens"],
)
def test_serve_checks_every_flag_before_printing_anything(exported, flag, value, message, capsys):
    script = _load(REPOSITORY / "export" / "serve_litertlm.py")
    bundle = exported[0] / "export" / "model.litertlm"
    try:
        status = script.main([str(bundle), "--prompt", "ROMEO:", flag, value])
    except SystemExit as exit:  # argparse
        status = exit.code
    output = capsys.readouterr()
    assert status in (1, 2) and output.out == ""
    assert message in output.err and (flag in output.err or flag == "--max-new-tokens")


def test_sampler_options_out_of_range_are_refused_by_name(runtime):
    for options, name in [
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),  # was taken as "the bundle's default"
        ({"temperature": -1.0}, "temperature"),
        ({"seed": 2**40}, "seed"),
        ({"top_k": 2.5}, "top_k"),
    ]:
        with pytest.raises(ValueError, match=f"`{name}` must be"):
            runtime.generate("ROMEO:", 4, **options)


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_runtime_packs_the_weights_into_a_cache_file_it_removes_on_close(exported, tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    runtime = litertlm_model.LiteRTLMModel(exported[0] / "export" / "model.litertlm")
    try:
        (folder,) = scratch.iterdir()
        assert [path.suffix for path in folder.iterdir()] == [".xnnpack_cache"]
        greedy = runtime.generate("ROMEO:", 8, top_k=1)
    finally:
        runtime.close()
    assert list(scratch.iterdir()) == []
    kept = tmp_path / "kept"  # a folder of the caller's keeps the cache for the next load
    for _ in range(2):
        runtime = litertlm_model.LiteRTLMModel(exported[0] / "export" / "model.litertlm", cache_dir=kept)
        try:
            assert runtime.generate("ROMEO:", 8, top_k=1) == greedy
        finally:
            runtime.close()
        assert len(list(kept.iterdir())) == 1


def test_a_truncated_or_foreign_file_is_refused_by_name(exported, tmp_path):
    bundle = (exported[0] / "export" / "model.litertlm").read_bytes()
    truncated = tmp_path / "truncated.litertlm"
    truncated.write_bytes(bundle[: len(bundle) // 2])  # the runtime itself would abort the process
    with pytest.raises(ValueError, match=f"{truncated} is truncated or corrupt: its .* section ends at byte"):
        litertlm_model.LiteRTLMModel(truncated)
    foreign = tmp_path / "model.keras.litertlm"
    foreign.write_bytes((exported[0] / "model.keras").read_bytes())
    with pytest.raises(ValueError, match=f"{foreign} is not a LiteRT-LM bundle"):
        litertlm_model.LiteRTLMModel(foreign)
    with pytest.raises(FileNotFoundError, match="No LiteRT-LM bundle at"):
        litertlm_model.LiteRTLMModel(tmp_path / "missing.litertlm")


def test_serve_streams_the_greedy_text_without_tensorflow(exported, keras_lm):
    folder, _ = exported
    bundle, script = folder / "export" / "model.litertlm", REPOSITORY / "export" / "serve_litertlm.py"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN_WITHOUT_TENSORFLOW,
            script,
            bundle,
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "12",
            "--greedy",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "ROMEO:" + keras_greedy_texts(keras_lm, ["ROMEO:"], 12)[0] + "\n"

    bad = subprocess.run(
        [sys.executable, script, bundle, "--prompt", "ROMEO:", "--max-new-tokens", "100"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1 and "serve failed: `max_new_tokens` must be in [1, 26]" in bad.stderr


# Runs a script as `python SCRIPT ARGS` would, then checks that it never imported TensorFlow or kzoo.
_RUN_WITHOUT_TENSORFLOW = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
assert "tensorflow" not in sys.modules and "kzoo" not in sys.modules, "imported TensorFlow or kzoo"
"""


def test_prefill_lengths():
    assert litertlm.prefill_lengths(128) == (16, 64)
    assert litertlm.prefill_lengths(1024) == (16, 64, 256)
    assert litertlm.prefill_lengths(100) == (50,)
    assert litertlm.prefill_lengths(100, [10, 25]) == (10, 25)
    with pytest.raises(ValueError, match="the largest dividing the cache length 100"):
        litertlm.prefill_lengths(100, [16, 64])


def test_litertlm_applies_only_to_causal_lms_with_a_tokenizer(tmp_path):
    with pytest.raises(export.ExportError, match="litertlm: LiteRT-LM runs decoder-only language models"):
        export.export(build("bert_classifier"), tmp_path / "bert", formats=["litertlm"])
    with pytest.raises(export.ExportError, match="litertlm: a LiteRT-LM bundle needs the model's tokenizer"):
        export.export(build("gpt"), tmp_path / "gpt", formats=["litertlm"])
    assert "litertlm" in export.DEFAULT_FORMATS
    classifier = types.SimpleNamespace(model=None, task="classifier", tokenizer=None)  # what refusals read
    assert [format.name for format in exporter.Context._applicable(classifier, None)] == [
        "savedmodel",
        "tflite_fp32",
        "tflite_fp16",
        "tflite_int8_dynamic",
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_bundle_that_does_not_verify_is_not_written(tmp_path, monkeypatch):
    one_layer_gpt(vocabulary_size=128, max_sequence_length=16).save(tmp_path / "model.keras")
    data.save_tokenizer(data.character_tokenizer(128), tmp_path)
    real = litertlm_model.LiteRTLMModel.timed_generate

    def off_by_one(self, prompt, max_new_tokens=None, **sampler):  # a runtime that drops the first token
        text, timing = real(self, prompt, max_new_tokens, **sampler)
        return text[1:] + "x", timing

    monkeypatch.setattr(litertlm_model.LiteRTLMModel, "timed_generate", off_by_one)
    with pytest.raises(export.ExportError, match="litertlm: greedy generation differs from Keras"):
        export.export(
            tmp_path / "model.keras", tmp_path / "out", formats=["litertlm"], num_examples=2, generate_tokens=4
        )
    assert not (tmp_path / "out").exists()


def test_a_bundle_litert_cannot_load_is_an_export_error_naming_it(tmp_path, monkeypatch):
    # As LiteRT refuses an int4 block whose scale is 0: "unsupported scale value (0.000000) in
    # channel 9480 for INT4 tensor 1419 in XNNPACK delegate" (Qwen2.5-Coder-0.5B, BENCHMARKS.md).
    one_layer_gpt(vocabulary_size=128, max_sequence_length=16).save(tmp_path / "model.keras")
    data.save_tokenizer(data.character_tokenizer(128), tmp_path)

    def refused(*args, **kwargs):
        raise RuntimeError("CompiledModel error: code=3, Failed to build TFL interpreter")

    monkeypatch.setattr(litertlm_model, "compiled_model", refused)
    with pytest.raises(export.ExportError, match="litertlm: LiteRT could not run the bundle's model: .*interpreter"):
        export.export(
            tmp_path / "model.keras", tmp_path / "out", formats=["litertlm"], num_examples=2, generate_tokens=4
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given", ["path", "model"])
def test_a_model_the_export_loaded_is_freed_before_the_runtime_checks(given, tmp_path, monkeypatch):
    # The LiteRT checks map the bundle's weights and pack them again: with the Keras model's
    # still resident, a 1.5B export peaked at three copies. A model the caller passed is theirs.
    lm = one_layer_gpt(vocabulary_size=128, max_sequence_length=16)
    lm.save(tmp_path / "model.keras")
    data.save_tokenizer(data.character_tokenizer(128), tmp_path)
    loaded, alive = [], []
    real_load, real_rows = exporter._load_model, litertlm_model.chunked_rows

    def load(model):
        model, path = real_load(model)
        loaded.append(weakref.ref(model))
        return model, path

    def rows(*args, **kwargs):
        gc.collect()
        alive.append(loaded[0]() is not None)
        yield from real_rows(*args, **kwargs)

    monkeypatch.setattr(exporter, "_load_model", load)
    monkeypatch.setattr(litertlm_model, "chunked_rows", rows)
    source = tmp_path / "model.keras" if given == "path" else keras.saving.load_model(tmp_path / "model.keras")
    report = export.export(
        source, tmp_path / "out", formats=["litertlm"], num_examples=2, generate_tokens=4, tokenizer_dir=tmp_path
    )
    assert alive == [given == "model"] * 2  # the float32 bundle's check and the int8 one's
    assert report["model"]["parameters"] == lm.count_params()


def test_the_float32_tolerance_scales_with_the_logits():
    assert verification.fp32_tolerance(np.array([0.5, -0.2])) == verification.FP32_TOLERANCE
    assert verification.fp32_tolerance(np.array([3.0, -40.0])) == pytest.approx(40 * verification.FP32_TOLERANCE)
    # A model with logits near 40 may differ by 1.2e-4 (a seq2seq export with embeddings scaled
    # 8x failed an absolute 1e-4 at 1.17e-4); one with logits near 1 may not.
    record = {"quality": {}, "max_abs_diff": {"7": 1.2e-4}}
    assert (
        verification.failures(
            "tflite_fp32", {**record, "tolerance": {"7": verification.fp32_tolerance(np.array([40.0]))}}
        )
        == []
    )
    assert verification.failures(
        "tflite_fp32", {**record, "tolerance": {"7": verification.fp32_tolerance(np.array([1.0]))}}
    )


def test_each_weight_is_stored_once(exported):
    """Every large constant a prefill signature reads is one `decode` reads too: the prefill
    chunks and the decode step share their weights (no second, fused copy of the projections)."""
    from ai_edge_litert import schema_py_generated as schema

    flatbuffer = litertlm_model.read_tflite_model(exported[0] / "export" / "model.litertlm")
    model = schema.Model.GetRootAs(flatbuffer, 0)
    readers = {}
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for t in range(subgraph.TensorsLength()):
            buffer = subgraph.Tensors(t).Buffer()
            data = model.Buffers(buffer)
            if (data.DataLength() or data.Size()) >= 16 * 16 * 4:  # a d x d matrix of the test model
                readers.setdefault(buffer, set()).add(subgraph.Name().decode())
    assert readers and all("decode" in names for names in readers.values()), readers


def test_the_runtime_packages_are_pinned_to_the_installed_versions():
    from importlib import metadata

    import tomllib

    extras = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (self_extra,) = [requirement for requirement in extras["test"] if requirement.startswith("kzoo[")]
    assert "litertlm" in self_extra[len("kzoo[") : -1].split(",")
    for package in ("litert-lm-api", "litert-lm-builder", "ai-edge-quantizer"):
        (pin,) = [requirement for requirement in extras["litertlm"] if requirement.startswith(package + "==")]
        assert pin == f"{package}=={metadata.version(package)}"


def _spa_eng_texts(count):
    lines = _read_xz(data.corpus_dir() / "spa-eng" / "spa.txt.xz").splitlines()
    return [text for line in lines[:count] for text in line.split("\t")[:2]]


def _word_piece_tokenizer():
    """kzoo's WordPiece tokenizer as gpt_translate fits it (cased, special tokens kept whole), on
    the first 500 pairs: about 200 pieces, which split the prompts' words into several (keras-hub's
    learner takes seconds per thousand texts)."""
    return data.word_piece_tokenizer(data.train_word_piece_vocabulary(_spa_eng_texts(500), 300))


def _gpt2_tokenizer():
    """keras-hub's GPT-2 tokenizer over a byte-level BPE fitted by `tokenizers`, <|endoftext|> at id 0."""
    text = _read_xz(data.corpus_dir() / "tinyshakespeare" / "input.txt.xz")[:50000]
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([text], vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False)
    model = json.loads(bpe.to_str())["model"]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
    return keras_hub.models.GPT2Tokenizer(vocabulary=model["vocab"], merges=merges)


@pytest.fixture(scope="module", params=["word_piece", "gpt2_bpe"])
def subword_bundle(request, tmp_path_factory):
    """A tiny GPT carrying a WordPiece or GPT-2 BPE tokenizer, exported to LiteRT-LM."""
    tokenizer = {"word_piece": _word_piece_tokenizer, "gpt2_bpe": _gpt2_tokenizer}[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    one_layer_gpt(tokenizer.vocabulary_size(), MAX_LENGTH, tokenizer).save(folder / "model.keras")
    report = export.export(
        folder / "model.keras",
        folder / "export",
        formats=["litertlm"],
        cache_length=MAX_LENGTH,
        num_examples=4,
        latency_runs=1,
        generate_tokens=8,
    )
    lm = keras.saving.load_model(folder / "model.keras")
    runtime = litertlm_model.LiteRTLMModel(folder / "export" / "model.litertlm")
    yield request.param, lm, runtime, report
    runtime.close()


# Real text: accents, punctuation, emoji (outside both vocabularies' words), CJK, a special token.
SUBWORD_PROMPTS = ["¿Dónde está la estación? ¡Vamos!", "Café, déjà vu 😀 中文", "how are you ? [SEP]", "Tom"]


def test_subword_bundles_give_keras_greedy_tokens(subword_bundle):
    kind, lm, runtime, report = subword_bundle
    record = report["artifacts"]["litertlm"]
    assert record["generation"]["matches_keras"] and record["tokenizer"]["matches_keras"]
    tokenizer = lm.tokenizer
    loaded = tokenizers.Tokenizer.from_str(hugging_face_tokenizer(tokenizer).tokenizer.to_str())
    metadata = litertlm_model.read_metadata(runtime.path)
    stop = [list(token.token_ids.ids) for token in metadata.stop_tokens]
    start = list(metadata.start_token.token_ids.ids) if metadata.HasField("start_token") else []
    # The stop (and, for GPT-2, start) token is the tokenizer's own: [EOS] (6) and <|endoftext|> (0).
    assert (stop, start) == ({"word_piece": ([[6]], []), "gpt2_bpe": ([[0]], [0])}[kind])
    # Keras tokenizes the prompts as one batch and continues them as one ragged batch, each row as
    # it would alone: keras-hub's BPE traces its merges anew in each call that meets new words,
    # and Keras a decoding loop per prompt length.
    prompts = [start + np.asarray(ids).tolist() for ids in tokenizer(SUBWORD_PROMPTS)]
    lengths = [min(10, MAX_LENGTH - len(prompt)) for prompt in prompts]
    longest = max(len(prompt) + new for prompt, new in zip(prompts, lengths))
    outputs = lm.generate(prompts, max_length=longest, stop_token_ids=stop[0], jit_compile=False)
    for prompt, text, new, output in zip(prompts, SUBWORD_PROMPTS, lengths, outputs, strict=True):
        assert runtime.tokenize(text) == prompt[len(start) :], text
        output = output[len(prompt) : len(prompt) + new]
        output = output[:-1] if output[-1] in stop[0] else output
        streamed = list(runtime.stream(text, new, top_k=1))
        expected = loaded.decode(output, skip_special_tokens=False)
        assert "".join(streamed) == str(tokenizer.detokenize(output)) == expected
        if kind == "word_piece":  # one piece per token, what it adds to the text (bytes may wait for a whole character)
            pieces = [loaded.decode(output[:i], skip_special_tokens=False) for i in range(len(output) + 1)]
            assert streamed == [pieces[i + 1].removeprefix(pieces[i]) for i in range(len(output))], text


def test_a_translation_prompt_written_as_text_is_the_conditional_lm_prompt(subword_bundle):
    """gpt_translate's prompt `english [SEP]`, written as text, gives the runtime the ids
    `conditional_lm_prompts` gives Keras, and the runtime continues it as Keras does, to [EOS]."""
    kind, lm, runtime, _ = subword_bundle
    if kind != "word_piece":
        pytest.skip("translation prompts are WordPiece")
    sources = ["How are you?", "¿Dónde está Tom?"]
    prompts = data.conditional_lm_prompts(sources, lm.tokenizer, MAX_LENGTH)
    outputs = lm.generate(prompts, max_length=MAX_LENGTH, stop_token_ids=[EOS_ID], jit_compile=False)  # one batch
    for source, ids, output in zip(sources, prompts, outputs, strict=True):
        assert ids[-1] == SEP_ID and runtime.tokenize(f"{source} [SEP]") == ids
        output = output[len(ids) :]
        output = output[:-1] if output[-1] == EOS_ID else output
        assert runtime.generate(f"{source} [SEP]", MAX_LENGTH - len(ids), top_k=1) == lm.tokenizer.detokenize(output)


def _read_xz(path):
    with lzma.open(path, "rt", encoding="utf-8") as file:
        return file.read()
