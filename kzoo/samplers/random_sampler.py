from kzoo.samplers.sampler import Sampler


class RandomSampler(Sampler):
    """Samples from the full softmax(logits / temperature).

    Args:
        temperature: float > 0; lower is closer to greedy.
        seed: int or None, for reproducible output.

    Example:
    >>> model.generate(prompt, sampler=RandomSampler(temperature=0.8, seed=0))
    """
