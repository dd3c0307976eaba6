"""HourglassLlama: a Llama whose feed-forward network is a stack of K narrow residual sub-MLPs (MODELS.md §1).

    a   = x + Attn(RMSNorm_attn(x))
    h_k = h_{k-1} + SwiGLU_k(RMSNorm_k(h_{k-1}))     k = 1..K, h_0 = a, out = h_K

Parameter names follow the official Hourglass_LM port: `layers.{i}.post_attention_layernorm.{k}` and
`layers.{i}.mlp.{k}.{gate,up,down}_proj`. With K = 1 this is transformers' Llama, to the last logit.

This file is copied flat into every saved model folder (remote code): it imports only torch, transformers and its
siblings.
"""

from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_layers import GenericForSequenceClassification, GradientCheckpointingLayer
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from ..configuration.configuration_hourglass_llama import HourglassLlamaConfig
from .bundle import RemoteCodeMixin
from .compat import llama_rope_config, pop_cache
from .modeling_common import CausalLMMixin, DecoderModelMixin, SelfAttention, SwiGLUMLP


class HourglassLlamaDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = SelfAttention(
            config,
            layer_idx,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            scaling=config.head_dim**-0.5,
            qk_norm=config.qk_norm,
        )
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # One pre-norm per sub-MLP; the names are the official port's.
        self.post_attention_layernorm = nn.ModuleList(
            LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps) for _ in config.mlp_intermediate_sizes
        )
        self.mlp = nn.ModuleList(
            SwiGLUMLP(config.hidden_size, width, config.mlp_bias, config.hidden_act)
            for width in config.mlp_intermediate_sizes
        )

    def forward(self, hidden_states, attention_mask, position_embeddings, cache=None, cache_position=None, **kwargs):
        attn_output, attn_weights = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            cache=cache,
            cache_position=cache_position,
            **kwargs,
        )
        hidden_states = hidden_states + attn_output
        for norm, mlp in zip(self.post_attention_layernorm, self.mlp):
            hidden_states = hidden_states + mlp(norm(hidden_states))
        return hidden_states, attn_weights


class HourglassLlamaPreTrainedModel(RemoteCodeMixin, PreTrainedModel):
    """transformers' default `_init_weights` is the official initialisation (every weight N(0, initializer_range),
    norms 1, no depth scaling) and also fills the rotary buffers of models built on the meta device; it only
    initialises what a checkpoint did not provide."""

    config_class = HourglassLlamaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HourglassLlamaDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    # Auto classes that the saved remote-code folder maps to classes of this file.
    _remote_code_auto_classes = {
        "AutoModel": "HourglassLlamaModel",
        "AutoModelForCausalLM": "HourglassLlamaForCausalLM",
        "AutoModelForSequenceClassification": "HourglassLlamaForSequenceClassification",
    }


class HourglassLlamaModel(DecoderModelMixin, HourglassLlamaPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            HourglassLlamaDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(
            config=llama_rope_config(config.head_dim, config.rope_parameters, config.max_position_embeddings)
        )
        self.gradient_checkpointing = False
        self.post_init()

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
        position_embeddings = self.rotary_emb(inputs.inputs_embeds, inputs.position_ids)

        hidden_states = inputs.inputs_embeds  # [batch, seq, hidden]
        all_hidden_states = () if inputs.output_hidden_states else None
        all_attentions = () if inputs.output_attentions else None
        for decoder_layer in self.layers:
            if inputs.output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states, attn_weights = decoder_layer(
                hidden_states,
                attention_mask=inputs.mask,
                position_embeddings=position_embeddings,
                cache=inputs.cache,
                cache_position=inputs.cache_position,
                position_ids=inputs.position_ids,
                **kwargs,
            )
            if inputs.output_attentions:
                all_attentions += (attn_weights,)
        hidden_states = self.norm(hidden_states)
        if inputs.output_hidden_states:
            all_hidden_states += (hidden_states,)
        return self.decoder_output(inputs.cache, hidden_states, all_hidden_states, all_attentions, return_dict)


class HourglassLlamaForCausalLM(CausalLMMixin, HourglassLlamaPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_rep"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config):
        super().__init__(config)
        self.model = HourglassLlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


class HourglassLlamaForSequenceClassification(GenericForSequenceClassification, HourglassLlamaPreTrainedModel):
    def __init__(self, config):
        # GenericForSequenceClassification.__init__ builds the backbone through AutoModel, which does not know this
        # class when it is loaded as remote code; build it directly and keep the generic forward.
        HourglassLlamaPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = HourglassLlamaModel(config)
        self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
        self.post_init()


__all__ = [
    "HourglassLlamaPreTrainedModel",
    "HourglassLlamaModel",
    "HourglassLlamaForCausalLM",
    "HourglassLlamaForSequenceClassification",
]
