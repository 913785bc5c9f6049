from kzoo.samplers.sampler import Sampler


class RandomSampler(Sampler):
    """Samples from the full softmax(logits / temperature).

    Args:
        temperature: a finite number > 0; lower is closer to greedy.
        seed: None, or an int (64 bits) for reproducible output.

    Example:
    >>> lm = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
    >>> sampler = RandomSampler(temperature=0.8, seed=0)
    >>> first = lm.generate([[72, 105]], max_new_tokens=5, sampler=sampler)
    >>> lm.generate([[72, 105]], max_new_tokens=5, sampler=sampler) == first  # the seed gives the same tokens
    True
    """
