"""BowtieFormer: a decoder whose width changes from layer to layer, joined by carry-forward residual resizing
(MODELS.md §2).

    x = m_emb * embed(ids)                            # width h
    for each layer l:  x = resize(x, w_l)
                       x = x + m_res * Attn_l(RMSNorm(x))
                       x = x + m_res * MLP_l(RMSNorm(x))
    logits = lm_head(resize(RMSNorm_f(x), h)) / m_width

The residual stream is ONE buffer as wide as the widest layer: layer l reads its first w_l coordinates and writes
them back, the others pass by untouched, so widening finds the most recent value of each coordinate (carry-forward)
with no list of past states. With equal widths this is transformers' Granite, parameter names included.

This file is copied flat into every saved model folder (remote code): it imports only torch, transformers and its
siblings.
"""

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_layers import GenericForSequenceClassification, GradientCheckpointingLayer
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from ..configuration.configuration_bowtieformer import BowtieFormerConfig
from .bundle import RemoteCodeMixin
from .compat import CACHE_FIELD, llama_rope_config, pop_cache
from .modeling_common import CausalLMMixin, DecoderModelMixin, SelfAttention, SwiGLUMLP
from .variable_width_cache import VariableWidthCache


class BowtieFormerDecoderLayer(GradientCheckpointingLayer):
    """A Granite decoder layer at this layer's own width; with ffn_type "hourglass" its MLP is a stack of residual
    sub-MLPs, each with its own pre-norm, as in HourglassLlama."""

    def __init__(self, config, layer_idx):
        super().__init__()
        width, heads, kv_heads, head_dim, mlp_width = config.layer_shape(layer_idx)
        self.width = width
        self.head_dim = head_dim
        self.residual_multiplier = config.residual_multiplier
        self.self_attn = SelfAttention(
            config,
            layer_idx,
            hidden_size=width,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            scaling=config.layer_attention_scale(layer_idx),
        )
        self.input_layernorm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        if config.ffn_type == "swiglu":  # Granite's names: `post_attention_layernorm`, `mlp.gate_proj`
            self.post_attention_layernorm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
            self.mlp = SwiGLUMLP(width, mlp_width, config.mlp_bias, config.hidden_act)
        else:  # HourglassLlama's names: `post_attention_layernorm.{k}`, `mlp.{k}.gate_proj`
            self.post_attention_layernorm = nn.ModuleList(
                LlamaRMSNorm(width, eps=config.rms_norm_eps) for _ in range(config.num_mlp_layers)
            )
            self.mlp = nn.ModuleList(
                SwiGLUMLP(width, mlp_width, config.mlp_bias, config.hidden_act) for _ in range(config.num_mlp_layers)
            )

    def forward(self, hidden_states, attention_mask, position_embeddings, cache=None, cache_position=None, **kwargs):
        # hidden_states: [batch, seq, width], this layer's prefix of the residual buffer
        attn_output, attn_weights = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            cache=cache,
            cache_position=cache_position,
            **kwargs,
        )
        hidden_states = hidden_states + attn_output * self.residual_multiplier
        if isinstance(self.mlp, nn.ModuleList):
            blocks = zip(self.post_attention_layernorm, self.mlp)
        else:
            blocks = [(self.post_attention_layernorm, self.mlp)]
        for norm, mlp in blocks:
            hidden_states = hidden_states + mlp(norm(hidden_states)) * self.residual_multiplier
        return hidden_states, attn_weights


class BowtieFormerPreTrainedModel(RemoteCodeMixin, PreTrainedModel):
    """transformers' default `_init_weights` gives every weight N(0, initializer_range) and norms 1, and fills the
    rotary buffers of models built on the meta device; it only initialises what a checkpoint did not provide."""

    config_class = BowtieFormerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["BowtieFormerDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _remote_code_auto_classes = {
        "AutoModel": "BowtieFormerModel",
        "AutoModelForCausalLM": "BowtieFormerForCausalLM",
        "AutoModelForSequenceClassification": "BowtieFormerForSequenceClassification",
    }


class BowtieFormerModel(DecoderModelMixin, BowtieFormerPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            BowtieFormerDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = LlamaRMSNorm(config.layer_widths[-1], eps=config.rms_norm_eps)
        # One rotary table per distinct head size; every layer uses the one of its own head_dim.
        self.rotary_embs = nn.ModuleDict(
            {
                str(head_dim): LlamaRotaryEmbedding(
                    config=llama_rope_config(head_dim, config.rope_parameters, config.max_position_embeddings)
                )
                for head_dim in sorted({layer.head_dim for layer in self.layers})
            }
        )
        self.gradient_checkpointing = False
        self.post_init()

    def new_cache(self):
        return VariableWidthCache(self.config)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
        inputs = self.decoder_inputs(
            input_ids, inputs_embeds, attention_mask, position_ids, pop_cache(past_key_values, kwargs), use_cache,
            output_attentions, output_hidden_states, kwargs,
        )
        inputs_embeds = inputs.inputs_embeds * self.config.embedding_multiplier  # [batch, seq, h]
        # Each head size's rotary table, once for all layers.
        rotary = {int(dim): emb(inputs_embeds, inputs.position_ids) for dim, emb in self.rotary_embs.items()}

        # The residual buffer: [batch, seq, widest], the embedding followed by zeros.
        embedding_width = self.config.hidden_size
        residual = F.pad(inputs_embeds, (0, self.config.residual_width - embedding_width))
        live_width = embedding_width  # width of the latest state: the embedding's, then each layer's
        all_hidden_states = () if inputs.output_hidden_states else None
        all_attentions = () if inputs.output_attentions else None
        for decoder_layer in self.layers:
            if inputs.output_hidden_states:
                all_hidden_states += (residual.clone(),)
            width = decoder_layer.width
            # A copy, not a view: the layer's autograd graph must not see the in-place write-back below.
            hidden_states = residual[..., :width].clone()
            if self.config.resize_mode == "zero" and width > live_width:
                hidden_states[..., live_width:] = 0
            hidden_states, attn_weights = decoder_layer(
                hidden_states,
                attention_mask=inputs.mask,
                position_embeddings=rotary[decoder_layer.head_dim],
                cache=inputs.cache,
                cache_position=inputs.cache_position,
                position_ids=inputs.position_ids,
                **kwargs,
            )
            residual[..., :width] = hidden_states
            live_width = width
            if inputs.output_attentions:
                all_attentions += (attn_weights,)

        # Final norm at the last layer's width, then back to the LM head's width h: cut, or fill coordinates
        # w_L..h with their carried values (zeros in "zero" mode).
        hidden_states = self.norm(residual[..., :live_width])
        if live_width >= embedding_width:
            hidden_states = hidden_states[..., :embedding_width]
        elif self.config.resize_mode == "zero":
            hidden_states = F.pad(hidden_states, (0, embedding_width - live_width))
        else:
            hidden_states = torch.cat((hidden_states, residual[..., live_width:embedding_width]), dim=-1)
        if inputs.output_hidden_states:
            all_hidden_states += (hidden_states,)
        return self.decoder_output(inputs.cache, hidden_states, all_hidden_states, all_attentions, return_dict)


class BowtieFormerForCausalLM(CausalLMMixin, BowtieFormerPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_rep"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config):
        super().__init__(config)
        self.model = BowtieFormerModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _prepare_cache_for_generation(
        self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
    ):
        """transformers sizes its own caches from global config fields; a BowtieFormer's layers each have their own
        key/value shape, so generate() gets a VariableWidthCache: preallocated for cache_implementation="static",
        growing otherwise. A cache the caller passed, and other cache implementations, go through unchanged."""
        implementation = generation_config.cache_implementation
        if (
            model_kwargs.get(CACHE_FIELD) is not None
            or generation_config.use_cache is False
            or implementation not in (None, "dynamic", "static")
        ):
            return super()._prepare_cache_for_generation(
                generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
            )
        if implementation == "static":
            batch_size *= max(generation_config.num_beams, generation_config.num_return_sequences)
            max_cache_length = max(max_cache_length, getattr(generation_config, "max_cache_len", None) or 0)
            on_one_device = len(set((getattr(self, "hf_device_map", None) or {"": self.device}).values())) == 1
            model_kwargs[CACHE_FIELD] = VariableWidthCache(
                self.config,
                max_cache_len=max_cache_length,
                batch_size=batch_size if on_one_device else None,  # else each layer allocates on its own device
                dtype=self.dtype,
                device=self.device,
            )
        else:
            model_kwargs[CACHE_FIELD] = VariableWidthCache(self.config)


class BowtieFormerForSequenceClassification(GenericForSequenceClassification, BowtieFormerPreTrainedModel):
    def __init__(self, config):
        # As HourglassLlamaForSequenceClassification: the generic __init__ builds the backbone through AutoModel,
        # which does not know this class when it is loaded as remote code.
        BowtieFormerPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = BowtieFormerModel(config)
        self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
        self.post_init()


__all__ = [
    "BowtieFormerPreTrainedModel",
    "BowtieFormerModel",
    "BowtieFormerForCausalLM",
    "BowtieFormerForSequenceClassification",
    "VariableWidthCache",
]
