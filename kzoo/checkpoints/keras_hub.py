"""Copying keras-hub backbone weights into kzoo backbones.

Both libraries build their models from Keras layers of the same shapes, so a
conversion is a list of `(kzoo layer, keras-hub layer)` pairs whose weights
are copied in order. Each backbone's `from_keras_hub` lists its pairs.
"""

from kzoo import _compat


def keras_hub_config(hub_backbone, keys):
    """The values of `keys` in a keras-hub backbone's config, checked to exist."""
    config = hub_backbone.get_config()
    missing = [key for key in keys if key not in config]
    if missing:
        raise ValueError(
            f"The keras-hub {type(hub_backbone).__name__} config lacks {missing}; "
            f"expected {list(keys)}, found {sorted(config)}."
        )
    return {key: config[key] for key in keys}


def transformer_block_pairs(block, hub_layer):
    """Pairs a kzoo transformer block with a keras-hub TransformerEncoder/Decoder
    (self-attention and feed-forward; both use the same attribute names)."""
    attention, hub = block.self_attention, _compat.transformer_sublayers(hub_layer)
    return [
        (attention.query_dense, hub["query"]),
        (attention.key_dense, hub["key"]),
        (attention.value_dense, hub["value"]),
        (attention.output_dense, hub["output"]),
        (block.self_attention_norm, hub["attention_norm"]),
        (block.feed_forward.intermediate_dense, hub["intermediate"]),
        (block.feed_forward.output_dense, hub["feed_forward_output"]),
        (block.feed_forward_norm, hub["feed_forward_norm"]),
    ]


def copy_weights(pairs):
    """Sets each kzoo layer's weights to its keras-hub partner's, shapes checked."""
    for target, source in pairs:
        weights = source.get_weights()
        expected = [tuple(variable.shape) for variable in target.weights]
        found = [tuple(weight.shape) for weight in weights]
        if expected != found:
            raise ValueError(
                f"Cannot copy the keras-hub weights of {source.path!r} into "
                f"{target.path!r}: expected shapes {expected}, found {found}."
            )
        target.set_weights(weights)
