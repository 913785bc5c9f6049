"""Copies weights between kzoo layers and their Keras / keras-hub twins."""


def copy_attention(source, target):
    """keras.layers.MultiHeadAttention -> kzoo MultiHeadAttention."""
    for src, dst in (
        (source._query_dense, target.query_dense),
        (source._key_dense, target.key_dense),
        (source._value_dense, target.value_dense),
        (source._output_dense, target.output_dense),
    ):
        dst.set_weights(src.get_weights())


def copy_keras_hub_block(source, target):
    """keras-hub TransformerEncoder/TransformerDecoder -> kzoo block."""
    copy_attention(source._self_attention_layer, target.self_attention)
    target.self_attention_norm.set_weights(source._self_attention_layer_norm.get_weights())
    if getattr(source, "_cross_attention_layer", None) is not None:
        copy_attention(source._cross_attention_layer, target.cross_attention_layer)
        target.cross_attention_norm.set_weights(source._cross_attention_layer_norm.get_weights())
    target.feed_forward.intermediate_dense.set_weights(source._feedforward_intermediate_dense.get_weights())
    target.feed_forward.output_dense.set_weights(source._feedforward_output_dense.get_weights())
    target.feed_forward_norm.set_weights(source._feedforward_layer_norm.get_weights())
