import math

import keras
import numpy as np
from keras import ops

from kzoo.validation import check_positive_int

# The `rope_scaling["rope_type"]` values kzoo computes, with the fields each one needs.
ROPE_TYPES = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def inverse_frequencies(dim, max_wavelength, scaling_factor=1.0, rope_scaling=None):
    """The rotation speeds `theta_j = max_wavelength^(-2j/dim)`, `(dim / 2,)` float32, scaled.

    Computed in float32 as transformers computes them, so the angles are the
    reference's to the last bit wherever float32 arithmetic agrees.

    Args:
        dim: int, the number of rotated features (even).
        max_wavelength: float, the base of the angles.
        scaling_factor: float >= 1, linear position interpolation (divides every speed).
        rope_scaling: None or a dict as in a Hugging Face config: `{"rope_type": "linear",
            "factor": 8.0}` or `{"rope_type": "llama3", "factor", "low_freq_factor",
            "high_freq_factor", "original_max_position_embeddings"}` (Llama 3.1's: speeds
            whose wavelength exceeds the original context are divided by `factor`, fast
            ones kept, the band between interpolated).
    """
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    speeds = np.float32(1.0) / (np.float32(max_wavelength) ** exponents)
    speeds = speeds / np.float32(scaling_factor)
    kind = (rope_scaling or {}).get("rope_type", "default")
    if kind == "linear":
        speeds = speeds / np.float32(rope_scaling["factor"])
    elif kind == "llama3":
        factor = rope_scaling["factor"]
        low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
        context = rope_scaling["original_max_position_embeddings"]
        wavelengths = np.float32(2 * math.pi) / speeds
        scaled = np.where(wavelengths > context / low, speeds / np.float32(factor), speeds)
        smooth = (np.float32(context) / wavelengths - np.float32(low)) / np.float32(high - low)
        smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
        medium = ~(wavelengths < context / high) & ~(wavelengths > context / low)
        speeds = np.where(medium, smoothed, scaled)
    return speeds.astype(np.float32)


def check_rope_scaling(rope_scaling):
    """`rope_scaling` if kzoo computes it (see `ROPE_TYPES`), else a ValueError naming what is not."""
    if rope_scaling is None:
        return None
    if not isinstance(rope_scaling, dict):
        raise ValueError(f"`rope_scaling` must be None or a dict; received rope_scaling={rope_scaling!r}.")
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"`rope_scaling` has rope_type {kind!r}, which kzoo does not compute; supported: {sorted(ROPE_TYPES)}."
        )
    missing = [field for field in ROPE_TYPES[kind] if rope_scaling.get(field) is None]
    if missing:
        raise ValueError(f"`rope_scaling` of rope_type {kind!r} lacks {missing}; received {rope_scaling!r}.")
    for field in ROPE_TYPES[kind]:
        value = rope_scaling[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"`rope_scaling[{field!r}]` must be a number > 0; received {value!r}.")
    if kind == "llama3" and not rope_scaling["high_freq_factor"] > rope_scaling["low_freq_factor"]:
        raise ValueError(f"`rope_scaling` needs high_freq_factor > low_freq_factor; received {rope_scaling!r}.")
    return {"rope_type": kind, **{field: rope_scaling[field] for field in ROPE_TYPES[kind]}}


class Rotation:
    """The cosines and sines of rotary angles at some positions: what `RotaryEmbedding.rotation`
    computes and its `call(..., rotation=...)` reads.

    An object of its own rather than a tuple, because `Layer.__call__` casts the floating
    tensors among a call's arguments, nested ones too, to the layer's compute dtype (bfloat16
    under "mixed_bfloat16"), where these must stay float32; other objects it passes as they are.

    Attributes:
        cos: float32 tensor, the cosines, shaped to broadcast against the inputs.
        sin: float32 tensor of the same shape, the sines.
    """

    __slots__ = ("cos", "sin")

    def __init__(self, cos, sin):
        self.cos, self.sin = cos, sin


@keras.saving.register_keras_serializable(package="kzoo")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE), applied to queries or keys.

    Rotates feature pairs `(x_j, x_{j + d/2})` by the angle `pos * theta_j`,
    `theta_j = max_wavelength^(-2j/d)`, so the dot product of a rotated query
    at position m and a rotated key at position n depends on m - n only. The
    pairing of the two halves is the GPT-NeoX / Hugging Face / keras-hub
    convention. With `rotary_dim`, only the first `rotary_dim` features of
    each head rotate and the rest pass through (partial rotary, as in Phi-3
    and GPT-NeoX). Angles are computed in float32 whatever the input dtype.

    Args:
        max_wavelength: number > 0, the base of the angles (10000 in the paper;
            Hugging Face's `rope_theta`).
        scaling_factor: float >= 1, positions are divided by it (linear
            position interpolation for longer contexts).
        sequence_axis: int, the axis of the positions in the input.
        rotary_dim: None (all features) or an even int, the rotated features
            of each head.
        rope_scaling: None or a Hugging Face `rope_scaling` dict (`rope_type`
            "linear" or "llama3" with its fields; see `inverse_frequencies`).
            Other RoPE types raise an error naming them.
        **kwargs: base layer arguments.

    Call args:
        inputs: tensor `(B, T, ..., d)` with an even `d` (or `rotary_dim`).
        start_index: int or scalar tensor, position of the first row.
        rotation: None, or the `Rotation` of `rotation` for these positions
            (then `start_index` is not read).

    Example:
    >>> q = keras.random.normal((2, 10, 4, 8))  # (B, T, heads, head_dim)
    >>> tuple(RotaryEmbedding(max_wavelength=500000)(q).shape)
    (2, 10, 4, 8)

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position
        Embedding", 2021.
    """

    def __init__(
        self,
        max_wavelength=10000,
        scaling_factor=1.0,
        sequence_axis=1,
        rotary_dim=None,
        rope_scaling=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(max_wavelength, bool) or not isinstance(max_wavelength, (int, float)) or not max_wavelength > 0:
            raise ValueError(f"`max_wavelength` must be a number > 0; received max_wavelength={max_wavelength!r}.")
        self.max_wavelength = max_wavelength
        if not scaling_factor >= 1.0:
            raise ValueError(f"`scaling_factor` must be >= 1; received scaling_factor={scaling_factor!r}.")
        self.scaling_factor = float(scaling_factor)
        self.sequence_axis = sequence_axis
        if rotary_dim is not None and check_positive_int("rotary_dim", rotary_dim) % 2:
            raise ValueError(f"`rotary_dim` must be even; received rotary_dim={rotary_dim}.")
        self.rotary_dim = rotary_dim
        self.rope_scaling = check_rope_scaling(rope_scaling)
        self.supports_masking = True
        self.built = True

    def rotation(self, length, width, start_index=0, rank=4):
        """The cosines and sines of the angles at positions `[start_index, start_index + length)`.

        What `call` multiplies the features by, float32 tensors shaped to broadcast against
        an input of rank `rank` (the positions on `sequence_axis`, the `dim / 2` speeds last).
        They depend on the positions alone, so a stack of layers computes them once and
        passes them to every call (`call(..., rotation=...)`): a decoder's queries and keys
        in every layer.

        Args:
            length: int or scalar int tensor, the number of positions T.
            width: int, the last axis of the inputs (the rotated `rotary_dim` of them, or all).
            start_index: int or scalar int tensor, the first position.
            rank: int, the rank of the inputs.

        Returns:
            A `Rotation`, its `cos` and `sin` each of shape `(1, ..., T, ..., 1, dim / 2)`.
        """
        dim = self.rotary_dim or width
        if width is None or dim % 2 or dim > width:
            raise ValueError(
                f"The last axis of the input ({width}) must be even and at least `rotary_dim` ({self.rotary_dim})."
            )
        speeds = inverse_frequencies(dim, self.max_wavelength, self.scaling_factor, self.rope_scaling)
        positions = ops.cast(ops.arange(length) + start_index, "float32")
        angles = positions[:, None] * ops.convert_to_tensor(speeds)[None, :]  # (T, dim/2)
        broadcast_shape = [1] * rank
        broadcast_shape[self.sequence_axis % rank], broadcast_shape[-1] = length, dim // 2
        return Rotation(ops.reshape(ops.cos(angles), broadcast_shape), ops.reshape(ops.sin(angles), broadcast_shape))

    def call(self, inputs, start_index=0, rotation=None):
        width = inputs.shape[-1]
        dim = self.rotary_dim or width
        if rotation is None:
            length = ops.shape(inputs)[self.sequence_axis % len(inputs.shape)]
            rotation = self.rotation(length, width, start_index, len(inputs.shape))
        elif width is None or dim > width:
            raise ValueError(f"The last axis of the input ({width}) must be at least `rotary_dim` ({self.rotary_dim}).")
        cos, sin = rotation.cos, rotation.sin
        x = ops.cast(inputs, "float32")
        rotated, passed = (x, None) if dim == width else (x[..., :dim], x[..., dim:])
        x1, x2 = ops.split(rotated, 2, axis=-1)
        parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin] + ([] if passed is None else [passed])
        return ops.cast(ops.concatenate(parts, axis=-1), inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            max_wavelength=self.max_wavelength,
            scaling_factor=self.scaling_factor,
            sequence_axis=self.sequence_axis,
            rotary_dim=self.rotary_dim,
            rope_scaling=self.rope_scaling,
        )
        return config
