from keras import ops

from kzoo.samplers.sampler import Sampler
from kzoo.validation import check_positive_int


class TopKSampler(Sampler):
    """Samples among the `k` most likely tokens; `k=1` is greedy.

    Args:
        k: int >= 1.
        temperature: a finite number > 0.
        seed: None, or an int (64 bits) for reproducible output.

    Example:
    >>> lm = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
    >>> sampler = TopKSampler(k=10, seed=0)
    >>> first = lm.generate([[72, 105]], max_new_tokens=5, sampler=sampler)
    >>> lm.generate([[72, 105]], max_new_tokens=5, sampler=sampler) == first  # the seed gives the same tokens
    True

    References:
        Fan et al., "Hierarchical Neural Story Generation", 2018.
    """

    def __init__(self, k=5, temperature=1.0, seed=None):
        super().__init__(temperature, seed)
        self.k = check_positive_int("k", k)

    def filter_probabilities(self, probabilities):
        kth = ops.top_k(probabilities, min(self.k, probabilities.shape[-1]))[0][:, -1:]
        return ops.where(probabilities >= kth, probabilities, 0.0)

    def get_config(self):
        return {**super().get_config(), "k": self.k}
