from keras import ops

from kzoo.samplers.sampler import Sampler


class GreedySampler(Sampler):
    """Always takes the most likely token (argmax); deterministic.

    Example:
    >>> lm = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
    >>> lm.generate([[72, 105]], max_new_tokens=5, sampler=GreedySampler())[0][:2]  # or sampler="greedy"
    [72, 105]
    """

    def __init__(self):
        super().__init__()

    def next_token(self, logits, noise):
        return ops.argmax(logits, axis=-1)

    def get_config(self):
        return {}
