"""A key/value cache whose layers have shapes of their own, as a BowtieFormer's layers do.

Copied flat into saved model folders beside the modeling files: imports only torch, transformers and siblings.
"""

import inspect

import torch
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

# transformers 4.57's StaticLayer allocates from the keys alone; 5.x from keys and values.
_STATIC_INIT_TAKES_VALUES = len(inspect.signature(StaticLayer.lazy_initialization).parameters) > 2


class VariableWidthCache(Cache):
    """transformers `Cache` whose layer l holds keys and values of shape [batch, kv_heads_l, seq, head_dim_l].

    Args:
        config: a config with a `layer_shape(layer_idx)` method (BowtieFormerConfig) giving each layer's key/value
            heads and head size.
        max_cache_len (`int`, *optional*): without it the cache grows as tokens arrive (dynamic: beam reordering,
            cropping for assisted decoding); with it every layer is preallocated to this many positions (static:
            fixed addresses, so that decoding can be compiled).
        batch_size, dtype, device: with `max_cache_len`, `batch_size` and `dtype`, layers are allocated now (on
            `device`); otherwise at their first update, with the keys' dtype and device.
    """

    def __init__(self, config, max_cache_len=None, batch_size=None, dtype=None, device=None):
        self.layer_kv_shapes = [config.layer_shape(l)[2:4] for l in range(config.num_hidden_layers)]
        if max_cache_len is None:
            layers = [DynamicLayer() for _ in self.layer_kv_shapes]
        else:
            layers = [StaticLayer(max_cache_len=max_cache_len) for _ in self.layer_kv_shapes]
        super().__init__(layers=layers)
        if max_cache_len is not None and batch_size is not None and dtype is not None:
            for layer, (kv_heads, head_dim) in zip(self.layers, self.layer_kv_shapes):
                # An empty update with the layer's shape makes StaticLayer allocate its full-length tensors.
                empty = torch.empty(batch_size, kv_heads, 0, head_dim, dtype=dtype, device=device)
                layer.lazy_initialization(*((empty, empty) if _STATIC_INIT_TAKES_VALUES else (empty,)))

    @property
    def layer_nbytes(self):
        """Bytes held by each layer's key and value tensors (0 for a layer not yet allocated)."""
        return [
            sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if t is not None)
            if layer.is_initialized
            else 0
            for layer in self.layers
        ]

    @property
    def nbytes(self):
        """Bytes held by all key and value tensors."""
        return sum(self.layer_nbytes)
