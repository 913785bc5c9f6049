"""A TensorFlow-only fix of Keras's trainer, kept in its own module.

It lives beside the models (whose base `Task` inherits it) rather than in
`kzoo.training`, so that models never import the training layer; TensorFlow is
imported only when the TensorFlow trainer calls it.
"""

import keras
from keras import tree


def in_multi_worker_mode(strategy):
    """Whether `strategy` is a `MultiWorkerMirroredStrategy` spanning several workers."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode()
    )


class MultiWorkerTrainerMixin:
    """Makes `fit`/`evaluate` work under `MultiWorkerMirroredStrategy` (keras#20585).

    Keras 3's TensorFlow trainer fails on two workers or more with
    "Attempt to convert a value (PerReplica...) to a Tensor", then, once past
    that, with "Invalid reduction dimension 0 for input with 0 dimensions":

    1. `TensorFlowTrainer._maybe_symbolic_build` builds the model from the
       first batch after reducing the whole `(x, y, sample_weight)` structure
       with `strategy.reduce("MEAN", batch, axis=None)`. Only
       `MirroredStrategy` maps `reduce` over a nested structure;
       `CollectiveAllReduceExtended._reduce_to` hands the tuple to
       `CollectiveAllReduce.reduce`, which cannot convert it to a tensor. The
       build needs only shapes and dtypes, so this mixin builds from the first
       local replica's batch: no reduction, and no collective across workers.
    2. `_make_function` reduces the step's logs with `reduce_per_replica(...,
       "auto")`, i.e. `strategy.reduce("MEAN", log, axis=0)` under multiple
       workers, and the logs are scalars. This mixin gives every log a leading
       axis of length 1 in multi-worker mode, so that the same reduction
       averages the logs over all replicas, as "auto" does on one worker.

    Remove this class (and its base in `kzoo.models.Task`) once
    https://github.com/keras-team/keras/issues/20585 is fixed: the
    multi-worker test in `tests/training` tells. Checked with Keras 3.15.1.

    Put it before `keras.Model` in the bases: `class Task(MultiWorkerTrainerMixin,
    keras.Model)`. On other backends and strategies it changes nothing.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        import tensorflow as tf

        if iterator is not None and self._distribute_strategy is not None:
            strategy = self._distribute_strategy
            for _, _, batches in iterator:
                data_batch = tree.map_structure(
                    lambda value: (
                        strategy.experimental_local_results(value)[0]
                        if isinstance(value, tf.distribute.DistributedValues)
                        else value
                    ),
                    next(batches),
                )
                break
        return super()._maybe_symbolic_build(data_batch=data_batch)

    def _make_function(self, step_function, *args, **kwargs):
        # The JAX trainer has a `_make_function` of its own, with more arguments.
        if keras.backend.backend() != "tensorflow" or not in_multi_worker_mode(self.distribute_strategy):
            return super()._make_function(step_function, *args, **kwargs)

        import tensorflow as tf

        def step_with_replica_axis(data):
            return tree.map_structure(lambda log: tf.expand_dims(log, 0), step_function(data))

        return super()._make_function(step_with_replica_axis)
