"""Building blocks shared by both models: a SwiGLU MLP and self-attention of any width.

Copied flat into saved model folders beside the modeling files: imports only torch, transformers and siblings.
"""

from torch import nn
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb, eager_attention_forward

from .compat import attention_function


class SwiGLUMLP(nn.Module):
    """down(act(gate(x)) * up(x)), hidden_size -> intermediate_size -> hidden_size."""

    def __init__(self, hidden_size, intermediate_size, bias=False, hidden_act="silu"):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = ACT2FN[hidden_act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class SelfAttention(nn.Module):
    """Llama attention at a width of its own: any head_dim, grouped-query attention, a free softmax scale and
    optional QK-norm over the packed query and key projections (OLMo-2 style, before RoPE)."""

    def __init__(self, config, layer_idx, hidden_size, num_heads, num_kv_heads, head_dim, scaling, qk_norm=False):
        super().__init__()
        self.config = config  # read for `_attn_implementation`, which transformers sets after construction
        self.layer_idx = layer_idx
        self.head_dim = head_dim
        self.num_key_value_groups = num_heads // num_kv_heads
        self.scaling = scaling
        self.attention_dropout = config.attention_dropout
        self.is_causal = True

        q_width, kv_width = num_heads * head_dim, num_kv_heads * head_dim
        self.q_proj = nn.Linear(hidden_size, q_width, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden_size, kv_width, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden_size, kv_width, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_width, hidden_size, bias=config.attention_bias)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = LlamaRMSNorm(q_width, eps=config.rms_norm_eps)
            self.k_norm = LlamaRMSNorm(kv_width, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask, cache=None, cache_position=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states)  # [batch, seq, heads * head_dim]
        key_states = self.k_proj(hidden_states)  # [batch, seq, kv_heads * head_dim]
        value_states = self.v_proj(hidden_states)
        if self.qk_norm:
            query_states = self.q_norm(query_states)
            key_states = self.k_norm(key_states)
        query_states = query_states.view(hidden_shape).transpose(1, 2)  # [batch, heads, seq, head_dim]
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if cache is not None:
            # Static layers up to 5.0 write at `cache_position`, and at the wrong place without it.
            key_states, value_states = cache.update(
                key_states, value_states, self.layer_idx, {"cache_position": cache_position}
            )

        attention_interface = attention_function(self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights
