"""Training at scale with `tf.distribute` (TensorFlow only; layers and models stay backend-agnostic).

A recipe, unchanged from one CPU to a GPU box, a cluster or a TPU VM (the strategy's name,
"auto" here, is its `--strategy`; the batch size is the global one):

>>> config = kzoo.training.configure("auto")
>>> with config.strategy.scope():
...     model = kzoo.models.RNNLanguageModel(vocabulary_size=128, embedding_dim=8, hidden_dim=8)
...     model.compile(jit_compile=config.jit_compile)
>>> ids = np.random.default_rng(0).integers(1, 128, (64, 9))  # next-token windows
>>> windows = tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:]))
>>> stream = kzoo.training.shard_by_data(windows.repeat().shuffle(64, seed=0).batch(8))
>>> history = model.fit(stream, epochs=2, steps_per_epoch=4, verbose=0,
...                     callbacks=kzoo.training.callbacks("run", config.strategy))
>>> import os
>>> sorted(os.listdir("run")), sorted(os.listdir("run/checkpoints"))
(['checkpoints', 'history.csv', 'logs'], ['epoch_001.keras', 'epoch_002.keras'])

- `get_strategy(name)`: "auto", "cpu", "gpu"/"mirrored", "multi_worker" (TF_CONFIG or SLURM), "tpu".
- `configure(...)`: the strategy, the global dtype policy and `jit_compile`, as a `TrainingConfig`.
- `MultiWorkerTrainerMixin`: the fix for `fit` under `MultiWorkerMirroredStrategy` (keras#20585).
- `callbacks(...)`, `BackupAndRestore`: exact resumption after a kill, a stop on a NaN loss;
  only the chief writes files; `AtomicModelCheckpoint`, Keras' with each file written whole.
- `shard_by_data(dataset)`: each worker keeps its part of every global batch.
- `Run`: a run that owns its output folder (a lock, resumption, a changed rerun refused with
  `ChangedRunError` naming the settings, `metrics.json`; every file written whole); see
  `kzoo.training.run`.
"""

from kzoo.models.multi_worker_trainer_mixin import MultiWorkerTrainerMixin
from kzoo.training.backup_and_restore import BackupAndRestore
from kzoo.training.backup_and_restore import is_chief
from kzoo.training.callbacks import HISTORY_FILE
from kzoo.training.callbacks import AtomicModelCheckpoint
from kzoo.training.callbacks import ResumedCSVLogger
from kzoo.training.callbacks import callbacks
from kzoo.training.run import LOCK_FILE
from kzoo.training.run import METRICS_FILE
from kzoo.training.run import MODEL_FILE
from kzoo.training.run import UNFINISHED_RUN_FILE
from kzoo.training.run import ChangedRunError
from kzoo.training.run import Run
from kzoo.training.run import RunFinished
from kzoo.training.run import RunFolderError
from kzoo.training.run import RunFolderInUse
from kzoo.training.run import read_history
from kzoo.training.run import read_record
from kzoo.training.sharding import shard_by_data
from kzoo.training.strategy import STRATEGY_NAMES
from kzoo.training.strategy import get_strategy
from kzoo.training.training_config import DTYPE_POLICIES
from kzoo.training.training_config import TrainingConfig
from kzoo.training.training_config import configure
