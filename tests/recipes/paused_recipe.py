"""Runs a recipe that pauses at a given point, for the tests to kill it there.

    python paused_recipe.py RECIPE [FLAGS...]

Runs `recipes/RECIPE.py` with FLAGS (`--output-dir` among them) in this process, with
TensorFlow's deterministic ops. When `OUTPUT_DIR/pause_at` holds a point, the run writes
`OUTPUT_DIR/paused` there and sleeps: "train S" after training step S (1-based, over the
whole run), "validation E B" after validation batch B of epoch E (1-based), "save" when the
recipe saves its model, after training.
"""

import contextlib
import importlib
import sys
import time
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def main(recipe, *flags):
    sys.path.insert(0, str(RECIPES))
    import _common
    import keras
    import tensorflow as tf

    import kzoo.training

    tf.config.experimental.enable_op_determinism()
    output_dir = Path(flags[flags.index("--output-dir") + 1])

    def pause_if(point):
        with contextlib.suppress(FileNotFoundError):
            if (output_dir / "pause_at").read_text() == point:
                (output_dir / "paused").touch()
                time.sleep(600)

    class PauseAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            pause_if(f"train {self.epoch * self.params['steps'] + batch + 1}")

        def on_test_batch_end(self, batch, logs=None):
            pause_if(f"validation {self.epoch + 1} {batch + 1}")

    callbacks, save = kzoo.training.callbacks, _common.Run.save
    kzoo.training.callbacks = lambda *args, **kwargs: callbacks(*args, **kwargs) + [PauseAt()]

    def paused_save(self, *args, **kwargs):
        pause_if("save")
        return save(self, *args, **kwargs)

    _common.Run.save = paused_save
    importlib.import_module(recipe).main(list(flags))


if __name__ == "__main__":
    main(*sys.argv[1:])
