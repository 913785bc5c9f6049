"""Transformer building blocks, written with `keras.ops` for every backend."""

from kzoo.layers.add_and_norm import AddAndNorm
from kzoo.layers.feed_forward import FeedForward
from kzoo.layers.gated_feed_forward import GatedFeedForward
from kzoo.layers.kv_cache import cache_spans
from kzoo.layers.layer_normalization import LayerNormalization
from kzoo.layers.masks import causal_mask
from kzoo.layers.masks import merge_masks
from kzoo.layers.multi_head_attention import MultiHeadAttention
from kzoo.layers.position_embedding import PositionEmbedding
from kzoo.layers.rms_normalization import RMSNormalization
from kzoo.layers.rotary_embedding import RotaryEmbedding
from kzoo.layers.scaled_dot_product_attention import scaled_dot_product_attention
from kzoo.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from kzoo.layers.token_and_position_embedding import TokenAndPositionEmbedding
from kzoo.layers.transformer_decoder_block import TransformerDecoderBlock
from kzoo.layers.transformer_encoder_block import TransformerEncoderBlock
