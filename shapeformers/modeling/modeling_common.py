"""What both models share: a SwiGLU MLP, self-attention of any width, the parts of a decoder's forward that do
not depend on its layers, and the causal-LM head.

Copied flat into saved model folders beside the modeling files: imports only torch, transformers and siblings.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb, eager_attention_forward

from .compat import (
    attention_function,
    causal_mask,
    model_output,
    model_output_cache,
    past_length,
    pop_cache,
    rotary_positions,
)


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


@dataclass
class DecoderInputs:
    """What every layer of a forward pass shares, computed once."""

    inputs_embeds: torch.Tensor  # [batch, seq, hidden]
    cache: Cache | None
    cache_position: torch.Tensor  # [seq], positions of these tokens in the sequence
    position_ids: torch.Tensor  # [batch or 1, seq]
    mask: object  # whatever the attention implementation takes (4D tensor, BlockMask, None)
    output_attentions: bool
    output_hidden_states: bool


class DecoderModelMixin:
    """Input handling and output packing of a decoder whose embedding is `self.embed_tokens`."""

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def new_cache(self):
        """The cache a forward creates when asked to cache and given none."""
        return DynamicCache(config=self.config)

    def decoder_inputs(
        self, input_ids, inputs_embeds, attention_mask, position_ids, cache, use_cache, output_attentions,
        output_hidden_states, kwargs,
    ):
        """Embeddings, cache, positions and causal mask, once per forward (`kwargs` loses `cache_position`)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` and `inputs_embeds`")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if self.gradient_checkpointing and self.training:
            use_cache = False
        if not use_cache:
            cache = None
        elif cache is None:
            cache = self.new_cache()
        cache_position = rotary_positions(
            kwargs.pop("cache_position", None), past_length(cache), inputs_embeds.shape[1], inputs_embeds.device
        )
        if position_ids is None:
            position_ids = cache_position.unsqueeze(0)
        return DecoderInputs(
            inputs_embeds=inputs_embeds,
            cache=cache,
            cache_position=cache_position,
            position_ids=position_ids,
            mask=causal_mask(self.config, inputs_embeds, attention_mask, cache, cache_position, position_ids),
            output_attentions=self.config.output_attentions if output_attentions is None else output_attentions,
            output_hidden_states=(
                self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
            ),
        )

    @staticmethod
    def decoder_output(cache, last_hidden_state, hidden_states, attentions, return_dict):
        output = model_output(
            BaseModelOutputWithPast,
            cache,
            last_hidden_state=last_hidden_state,
            hidden_states=hidden_states,
            attentions=attentions,
        )
        return output if return_dict is not False else output.to_tuple()


class CausalLMMixin:
    """The LM head over a decoder at `self.model`; logits are divided by `config.logits_scaling` where it exists
    (Granite's muP width multiplier). Put before the PreTrainedModel among the bases."""

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        logits_to_keep=0,
        **kwargs,
    ):
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=pop_cache(past_key_values, kwargs),
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])  # [batch, kept positions, vocab]
        logits_scaling = getattr(self.config, "logits_scaling", 1.0)
        if logits_scaling != 1.0:
            logits = logits / logits_scaling

        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)

        output = model_output(
            CausalLMOutputWithPast,
            model_output_cache(outputs),
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict is not False else output.to_tuple()
