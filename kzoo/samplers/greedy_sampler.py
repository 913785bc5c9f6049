from keras import ops

from kzoo.samplers.sampler import Sampler


class GreedySampler(Sampler):
    """Always takes the most likely token (argmax); deterministic.

    Example:
    >>> model.generate(prompt, sampler=GreedySampler())  # or sampler="greedy"
    """

    def __init__(self):
        super().__init__()

    def next_token(self, logits, noise):
        return ops.argmax(logits, axis=-1)

    def get_config(self):
        return {}
