"""Training at scale with `tf.distribute` (TensorFlow only; layers and models stay backend-agnostic).

A recipe, unchanged from one CPU to a GPU box, a cluster or a TPU VM:

>>> config = kzoo.training.configure(args.strategy, mixed_precision=args.mixed_precision)
>>> with config.strategy.scope():
...     model = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
...     model.compile(jit_compile=config.jit_compile)
>>> stream = kzoo.training.shard_by_data(
...     windows.repeat().shuffle(10_000, seed=0, reshuffle_each_iteration=False).batch(global_batch_size))
>>> model.fit(stream, epochs=10, steps_per_epoch=1000,
...           callbacks=kzoo.training.callbacks(args.output_dir, config.strategy))

- `get_strategy(name)`: "auto", "cpu", "gpu"/"mirrored", "multi_worker" (TF_CONFIG or SLURM), "tpu".
- `configure(...)`: the strategy, the global dtype policy and `jit_compile`, as a `TrainingConfig`.
- `MultiWorkerTrainerMixin`: the fix for `fit` under `MultiWorkerMirroredStrategy` (keras#20585).
- `callbacks(...)`, `BackupAndRestore`: exact resumption after a kill, a stop on a NaN loss;
  only the chief writes files.
- `shard_by_data(dataset)`: each worker keeps its part of every global batch.
"""

from kzoo.models.multi_worker_trainer_mixin import MultiWorkerTrainerMixin
from kzoo.training.backup_and_restore import BackupAndRestore
from kzoo.training.backup_and_restore import is_chief
from kzoo.training.callbacks import HISTORY_FILE
from kzoo.training.callbacks import ResumedCSVLogger
from kzoo.training.callbacks import callbacks
from kzoo.training.sharding import shard_by_data
from kzoo.training.strategy import STRATEGY_NAMES
from kzoo.training.strategy import get_strategy
from kzoo.training.training_config import DTYPE_POLICIES
from kzoo.training.training_config import TrainingConfig
from kzoo.training.training_config import configure
