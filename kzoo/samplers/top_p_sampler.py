from keras import ops

from kzoo.samplers.sampler import Sampler
from kzoo.validation import check_number


class TopPSampler(Sampler):
    """Nucleus sampling: the smallest set of tokens whose mass reaches `p`.

    Args:
        p: a number in (0, 1]; 1 samples from the full distribution.
        temperature: a finite number > 0.
        seed: None, or an int (64 bits) for reproducible output.

    Example:
    >>> lm = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
    >>> sampler = TopPSampler(p=0.9, seed=0)
    >>> first = lm.generate([[72, 105]], max_new_tokens=5, sampler=sampler)
    >>> lm.generate([[72, 105]], max_new_tokens=5, sampler=sampler) == first  # the seed gives the same tokens
    True

    References:
        Holtzman et al., "The Curious Case of Neural Text Degeneration", 2020.
    """

    def __init__(self, p=0.9, temperature=1.0, seed=None):
        super().__init__(temperature, seed)
        self.p = check_number("p", p, 0, 1, high_open=False)

    def filter_probabilities(self, probabilities):
        sorted_probabilities = ops.flip(ops.sort(probabilities, axis=-1), axis=-1)
        # Keep a token when the mass strictly above it is still below p.
        mass_above = ops.cumsum(sorted_probabilities, axis=-1) - sorted_probabilities
        kept = ops.where(mass_above < self.p, sorted_probabilities, 2.0)
        smallest_kept = ops.min(kept, axis=-1, keepdims=True)
        return ops.where(probabilities >= smallest_kept, probabilities, 0.0)

    def get_config(self):
        return {**super().get_config(), "p": self.p}
