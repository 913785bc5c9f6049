import tensorflow as tf


def shard_by_data(dataset):
    """`dataset`, split between workers batch by batch (auto-shard policy DATA).

    Batch the dataset with the global batch size B: under a strategy of N
    replicas, `model.fit` gives each replica B / N examples of every global
    batch. On several workers, TensorFlow's default policy (AUTO) first tries
    to give each worker its own input files (FILE), which fails or skews the
    batches when there are fewer files than workers, and warns when the data
    comes from memory. DATA has every worker read the whole stream and keep
    its part of each batch, so step i trains on the same examples as on one
    device. For large file-based datasets with many more files than workers,
    FILE reads less: set it with `tf.data.Options` instead.

    Example:
    >>> dataset = tf.data.Dataset.range(100)
    >>> stream = shard_by_data(dataset.repeat().shuffle(100, seed=0, reshuffle_each_iteration=False).batch(8))
    >>> stream.options().experimental_distribute.auto_shard_policy.name
    'DATA'
    """
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)
