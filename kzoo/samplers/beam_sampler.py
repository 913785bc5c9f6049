import keras
from keras import ops

from kzoo.samplers.sampler import Sampler
from kzoo.samplers.sampler import _isin
from kzoo.validation import check_number
from kzoo.validation import check_positive_int


class BeamSampler(Sampler):
    """Beam search: keeps the `num_beams` most likely continuations.

    Each row carries `num_beams` hypotheses; every step extends each by every
    token and keeps the best `num_beams` by total log-probability. A finished
    hypothesis (it emitted a stop token) is carried on with padding at no
    cost. The result is the hypothesis with the highest
    `log_prob / generated_length ** length_penalty`. `num_beams=1` is greedy.
    The model's cache must have the batch on axis 0 of every tensor (the
    hypotheses are reordered along it).

    Args:
        num_beams: int >= 1, the beam width.
        length_penalty: a finite number; > 0 favours longer outputs, 0
            ranks by raw log-probability, < 0 favours shorter ones.

    Example:
    >>> lm = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
    >>> len(lm.generate([[72, 105]], max_new_tokens=5, sampler=BeamSampler(num_beams=4))[0])
    7
    """

    def __init__(self, num_beams=4, length_penalty=1.0):
        super().__init__()
        self.num_beams = check_positive_int("num_beams", num_beams)
        self.length_penalty = check_number("length_penalty", length_penalty)

    def run(self, step, token_ids, *, prompt_mask, logits, cache, index, stop_token_ids, noise, pad_id=0):
        batch, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        beams, vocabulary = self.num_beams, ops.shape(logits)[-1]

        def expand(x):  # (B, ...) -> (B * beams, ...), each row repeated
            return ops.repeat(x, beams, axis=0)

        token_ids, prompt_mask, logits = expand(token_ids), expand(prompt_mask), expand(logits)
        cache = keras.tree.map_structure(expand, cache)
        # Only the first hypothesis is live until the first token is chosen.
        first = ops.cast(ops.arange(beams) == 0, "float32")
        scores = ops.tile(ops.log(first), (batch,))
        done = ops.zeros((batch * beams,), "bool")
        generated = ops.zeros_like(prompt_mask)
        own_rows = ops.arange(batch * beams)
        pad_only = ops.log(ops.cast(ops.arange(vocabulary) == pad_id, "float32"))

        def cond(token_ids, generated, done, scores, logits, cache, index):
            return ops.logical_and(index < length, ops.logical_not(ops.all(done)))

        def body(token_ids, generated, done, scores, logits, cache, index):
            is_prompt = prompt_mask[:, index]
            log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
            log_probs = ops.where(done[:, None], pad_only[None, :], log_probs)
            candidates = ops.reshape(scores[:, None] + log_probs, (batch, beams * vocabulary))
            best_scores, best = ops.top_k(candidates, beams)  # (B, beams)
            source = ops.reshape(best // vocabulary + ops.arange(batch)[:, None] * beams, (-1,))
            chosen = ops.cast(ops.reshape(best % vocabulary, (-1,)), token_ids.dtype)
            # Inside a row's prompt nothing is chosen: each hypothesis keeps its place.
            source = ops.where(is_prompt, own_rows, source)
            token = ops.where(is_prompt, token_ids[:, index], chosen)
            scores = ops.where(is_prompt, scores, ops.reshape(best_scores, (-1,)))
            token_ids, generated, done = (ops.take(x, source, axis=0) for x in (token_ids, generated, done))
            cache = keras.tree.map_structure(lambda x: ops.take(x, source, axis=0), cache)

            token_ids = ops.slice_update(token_ids, (0, index), token[:, None])
            new = ops.logical_not(ops.logical_or(is_prompt, done))
            generated = ops.slice_update(generated, (0, index), new[:, None])
            done = ops.logical_or(done, ops.logical_and(new, _isin(token, stop_token_ids)))
            logits, cache = step(token[:, None], cache, index)
            return token_ids, generated, done, scores, logits, cache, index + 1

        token_ids, generated, _, scores, *_ = ops.while_loop(
            cond, body, (token_ids, generated, done, scores, logits, cache, index)
        )
        lengths = ops.maximum(ops.sum(ops.cast(generated, "float32"), axis=-1), 1.0)
        ranked = ops.reshape(scores / lengths**self.length_penalty, (batch, beams))
        winner = ops.argmax(ranked, axis=-1) + ops.arange(batch) * beams
        return ops.take(token_ids, winner, axis=0), ops.take(generated, winner, axis=0)

    def get_config(self):
        return {"num_beams": self.num_beams, "length_penalty": self.length_penalty}
