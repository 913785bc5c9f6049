import json
import math

import _seq2seq
import gpt_translate
import keras
import pytest
import tokenizers

import kzoo
from kzoo import export
from kzoo.export import litertlm_model
from kzoo.tokenizers.tokenizer_json import hugging_face_tokenizer
from kzoo.tokenizers.word_piece import EOS_ID
from tests.recipes.conftest import check_run_files


def test_translates_the_test_pairs_and_prints_bleu_beside_seq2seq(run_recipe, tmp_path, capsys):
    seq2seq_run = tmp_path / "seq2seq_run"
    seq2seq_run.mkdir()
    seq2seq_metrics = {"test_bleu": 12.5, "validation_loss": 2.5, "test_examples": 9, "parameters": 1000}
    seq2seq_record = {
        "recipe": "seq2seq_translate",
        "settings": {"preset": "transformer_tiny", "dataset": "kzoo_spa_eng"},
    }
    (seq2seq_run / "metrics.json").write_text(json.dumps({**seq2seq_record, "metrics": seq2seq_metrics}))

    # 9 test pairs in batches of 4: the last batch is filled up.
    flags = ["--evaluation-examples", "9", "--decode-batch-size", "4", "--seq2seq-run", str(seq2seq_run)]
    output_dir, record = run_recipe(gpt_translate, *flags)
    check_run_files(output_dir)  # the training loss fell
    metrics = record["metrics"]
    assert math.isfinite(metrics["test_bleu"]) and 0 <= metrics["test_bleu"] <= 100
    assert metrics["test_examples"] == 9 and metrics["seq2seq_test_bleu"] == 12.5
    assert len(metrics["examples"]) == _seq2seq.EXAMPLES_SHOWN
    assert {"source", "reference", "output"} <= set(metrics["examples"][0])
    assert keras.saving.load_model(output_dir / "model.keras", compile=False).tokenizer.vocabulary_size() > 7
    printed = capsys.readouterr().out
    assert "seq2seq_translate  transformer_tiny" in printed and "gpt_translate      gpt_tiny" in printed
    assert f"{metrics['test_bleu']:>9.2f}" in printed and "Not comparable" not in printed


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seq2seq-run", "/nonexistent/seq2seq_run"], "--seq2seq-run /nonexistent/seq2seq_run holds no metrics.json"),
        (["--sequence-length", "2"], "--sequence-length must be >= 3"),
        (["--dataset", "kzoo_spa_fra"], "Unknown dataset 'kzoo_spa_fra'"),
    ],
)
def test_bad_input_exits_with_a_clear_message(flags, message, run_recipe, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(gpt_translate, *flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_the_exported_bundle_translates_in_litertlm_as_keras_does(run_recipe):
    """A `--quick` run exported to LiteRT-LM: for prompts written `english [SEP]`, the runtime's
    greedy tokens are those of Keras' `generate` (the recipe's `translate`), one by one."""
    output_dir, record = run_recipe(gpt_translate)
    report = export.export(
        output_dir / "model.keras",
        output_dir / "export",
        formats=["litertlm"],
        num_examples=4,
        latency_runs=1,
        generate_tokens=8,
    )
    assert report["artifacts"]["litertlm"]["generation"]["matches_keras"]
    lm = keras.saving.load_model(output_dir / "model.keras", compile=False)
    tokenizer, length = lm.tokenizer, record["settings"]["sequence_length"]
    hugging_face = tokenizers.Tokenizer.from_str(hugging_face_tokenizer(tokenizer).tokenizer.to_str())
    sources = ["How are you?", "I like cats.", "What time is the flight?"]
    translations = gpt_translate.translate(lm, tokenizer, sources, length, batch_size=4)
    runtime = litertlm_model.LiteRTLMModel(output_dir / "export" / "model.litertlm")
    try:
        assert litertlm_model.read_metadata(runtime.path).stop_tokens[0].token_ids.ids == [EOS_ID]
        for source, translation in zip(sources, translations):
            (prompt,) = kzoo.data.conditional_lm_prompts([source], tokenizer, length)
            assert runtime.tokenize(f"{source} [SEP]") == prompt
            ids = lm.generate([prompt], max_length=length, stop_token_ids=[EOS_ID], jit_compile=False)[0][len(prompt) :]
            ids = ids[:-1] if ids[-1] == EOS_ID else ids
            text = [hugging_face.decode(ids[:i], skip_special_tokens=False) for i in range(len(ids) + 1)]
            streamed = list(runtime.stream(f"{source} [SEP]", length - len(prompt), top_k=1))
            assert streamed == [text[i + 1].removeprefix(text[i]) for i in range(len(ids))]  # token for token
            assert "".join(streamed) == translation
    finally:
        runtime.close()
