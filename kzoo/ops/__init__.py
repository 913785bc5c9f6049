"""kzoo's ops: what `keras.ops` does not offer, written once for every backend.

Fused ops each have a plain `keras.ops` implementation and, under TensorFlow,
a fused one (the element-wise chain and its written-out gradient, each one XLA
computation) that runs in training steps traced into a TensorFlow graph;
`kzoo.config.set_fused_training(False)` turns it off everywhere. Layers call
the same op in training and inference.

- Attention weights: `softmax_dropout`.
- Normalization: `layer_norm`, `residual_dropout_layer_norm` (post-LN
  "Add & Norm") and `residual_dropout` (the pre-LN residual).
- Feed-forward: `bias_activation_dropout`, with `get_activation` and
  `gelu_approximate`.
- Loss: `sparse_softmax_cross_entropy`.
- Dropout from drawn noise: `dropout_noise`, `dropout`.
- Checks: `check_token_ids`.
"""

from kzoo.ops.activation import bias_activation_dropout
from kzoo.ops.activation import gelu_approximate
from kzoo.ops.activation import get_activation
from kzoo.ops.attention import softmax_dropout
from kzoo.ops.checks import check_token_ids
from kzoo.ops.cross_entropy import sparse_softmax_cross_entropy
from kzoo.ops.dropout import dropout
from kzoo.ops.dropout import dropout_noise
from kzoo.ops.normalization import layer_norm
from kzoo.ops.normalization import residual_dropout
from kzoo.ops.normalization import residual_dropout_layer_norm
