from kzoo.samplers.sampler import Sampler


class RandomSampler(Sampler):
    """Samples from the full softmax(logits / temperature).

    Args:
        temperature: a finite number > 0; lower is closer to greedy.
        seed: None, or an int (64 bits) for reproducible output.

    Example:
    >>> model.generate(prompt, sampler=RandomSampler(temperature=0.8, seed=0))
    """
