import keras
from keras import ops

from kzoo.validation import check_number
from kzoo.validation import check_seed


class Sampler:
    """Picks each next token from the model's logits, inside one compiled loop.

    A sampler turns logits `(B, V)` into token ids `(B,)`; `run` is the decode
    loop every sampler but beam search shares. Randomness comes from one
    uniform number per row and step, drawn before the loop from `seed` and
    passed in as a tensor: the compiled loop holds no random state, so one
    compilation serves every call and a fixed seed reproduces the output on
    every backend. A token is drawn by inverting the cumulative distribution
    (exact categorical sampling).

    Args:
        temperature: a finite number > 0, logits are divided by it.
        seed: None, or an int in [-2**63, 2**63); with an int, `generate`
            returns the same tokens on every call.
    """

    def __init__(self, temperature=1.0, seed=None):
        self.temperature = check_number("temperature", temperature, low=0)
        self.seed = check_seed("seed", seed)
        self.seed_generator = keras.random.SeedGenerator(self.seed)

    def noise(self, steps, batch_size):
        """The uniform numbers `(steps, batch_size)` one call consumes."""
        seed = self.seed if self.seed is not None else self.seed_generator
        return keras.random.uniform((steps, batch_size), seed=seed)

    def filter_probabilities(self, probabilities):
        """Returns the (unnormalized) distribution to sample from."""
        return probabilities

    def next_token(self, logits, noise):
        """Draws one id per row of `logits` `(B, V)` using `noise` `(B,)`."""
        probabilities = ops.softmax(ops.cast(logits, "float32") / self.temperature, axis=-1)
        cdf = ops.cumsum(self.filter_probabilities(probabilities), axis=-1)
        threshold = noise[:, None] * cdf[:, -1:]
        token = ops.sum(ops.cast(cdf <= threshold, "int32"), axis=-1)
        return ops.minimum(token, ops.shape(logits)[-1] - 1)

    def run(self, step, token_ids, *, prompt_mask, logits, cache, index, stop_token_ids, noise, pad_id=0):
        """Decodes positions `index .. L-1` of `token_ids` `(B, L)` in place.

        Args:
            step: `step(token (B, 1), cache, index) -> (logits (B, V), cache)`,
                feeding the token at `index` and returning the logits for the
                position after it.
            token_ids: int `(B, L)`, prompts right-padded to `L`.
            prompt_mask: bool `(B, L)`, True on prompt tokens: there the
                prompt's token is kept, which is how ragged prompts share one
                batch.
            logits: `(B, V)`, the prediction for position `index`.
            cache: the model's cache, filled for positions `< index`.
            index: int, the first position to decode.
            stop_token_ids: int tensor of ids that end a row (may be empty).
            noise: `(L, B)` uniform numbers from `noise`.
            pad_id: the id written after a row has stopped.

        Returns:
            `(token_ids, generated_mask)`: the filled ids and a bool mask of
            the positions that were generated (not prompt, not after a stop).
        """
        length = ops.shape(token_ids)[1]
        done = ops.zeros((ops.shape(token_ids)[0],), "bool")
        generated = ops.zeros_like(prompt_mask)

        def cond(token_ids, generated, done, logits, cache, index):
            return ops.logical_and(index < length, ops.logical_not(ops.all(done)))

        def body(token_ids, generated, done, logits, cache, index):
            is_prompt = prompt_mask[:, index]
            sampled = ops.where(done, pad_id, self.next_token(logits, noise[index]))
            token = ops.where(is_prompt, token_ids[:, index], ops.cast(sampled, token_ids.dtype))
            token_ids = ops.slice_update(token_ids, (0, index), token[:, None])
            new = ops.logical_not(ops.logical_or(is_prompt, done))
            generated = ops.slice_update(generated, (0, index), new[:, None])
            done = ops.logical_or(done, ops.logical_and(new, _isin(token, stop_token_ids)))
            logits, cache = step(token[:, None], cache, index)
            return token_ids, generated, done, logits, cache, index + 1

        token_ids, generated, *_ = ops.while_loop(cond, body, (token_ids, generated, done, logits, cache, index))
        return token_ids, generated

    def get_config(self):
        return {"temperature": self.temperature, "seed": self.seed}


def _isin(token, stop_token_ids):
    """`token (B,)` in `stop_token_ids (S,)`, False when S == 0."""
    return ops.any(ops.equal(token[:, None], ops.cast(stop_token_ids, token.dtype)[None, :]), axis=-1)
