from keras import ops

from kzoo.samplers.sampler import Sampler


class TopPSampler(Sampler):
    """Nucleus sampling: the smallest set of tokens whose mass reaches `p`.

    Args:
        p: float in (0, 1]; 1 samples from the full distribution.
        temperature: float > 0.
        seed: int or None, for reproducible output.

    Example:
    >>> model.generate(prompt, sampler=TopPSampler(p=0.9, seed=0))

    References:
        Holtzman et al., "The Curious Case of Neural Text Degeneration", 2020.
    """

    def __init__(self, p=0.9, temperature=1.0, seed=None):
        super().__init__(temperature, seed)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"`p` must be a float in (0, 1]; received p={p!r}.")
        self.p = float(p)

    def filter_probabilities(self, probabilities):
        sorted_probabilities = ops.flip(ops.sort(probabilities, axis=-1), axis=-1)
        # Keep a token when the mass strictly above it is still below p.
        mass_above = ops.cumsum(sorted_probabilities, axis=-1) - sorted_probabilities
        kept = ops.where(mass_above < self.p, sorted_probabilities, 2.0)
        smallest_kept = ops.min(kept, axis=-1, keepdims=True)
        return ops.where(probabilities >= smallest_kept, probabilities, 0.0)

    def get_config(self):
        return {**super().get_config(), "p": self.p}
