"""Samplers for `generate()`: how each next token is chosen from the logits."""

from kzoo.samplers.beam_sampler import BeamSampler
from kzoo.samplers.greedy_sampler import GreedySampler
from kzoo.samplers.random_sampler import RandomSampler
from kzoo.samplers.sampler import Sampler
from kzoo.samplers.top_k_sampler import TopKSampler
from kzoo.samplers.top_p_sampler import TopPSampler

_BY_NAME = {
    "greedy": GreedySampler,
    "random": RandomSampler,
    "top_k": TopKSampler,
    "top_p": TopPSampler,
    "beam": BeamSampler,
}


def get(identifier):
    """A sampler from a name ("greedy", "random", "top_k", "top_p", "beam") or object.

    Example:
    >>> get("top_k").k
    5
    """
    if isinstance(identifier, Sampler):
        return identifier
    if identifier not in _BY_NAME:
        raise ValueError(f"`sampler` must be one of {sorted(_BY_NAME)} or a Sampler; received sampler={identifier!r}.")
    return _BY_NAME[identifier]()
