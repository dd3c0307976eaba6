"""HourglassLlama configuration: a Llama whose feed-forward network is a stack of K narrow residual sub-MLPs.

This file is copied flat into every saved model folder (remote code): it imports only torch, transformers and
its siblings.
"""

import torch
from transformers import PretrainedConfig

from .configuration_common import (
    check_bool,
    check_llama_fields,
    check_positive_int,
    check_rope_head_dims,
    dtype_bytes,
    normalize_rope_parameters,
)


class HourglassLlamaConfig(PretrainedConfig):
    r"""
    Configuration of an [`HourglassLlamaModel`]. The Llama fields keep their Llama meaning; the decoder layer's
    single feed-forward network is replaced by `num_mlp_layers` residual SwiGLU sub-MLPs, each with its own
    pre-norm (MODELS.md §1.1). With `num_mlp_layers=1` and `mlp_intermediate_sizes=intermediate_size` the model is
    exactly a Llama.

    Args:
        num_mlp_layers (`int`, defaults to 1): K, the number of sub-MLPs per decoder layer.
        mlp_intermediate_sizes (`int` or `list[int]`, *optional*): width of each sub-MLP; one int for all K,
            or a list of K ints. Defaults to `intermediate_size` for every sub-MLP.
        head_dim (`int`, *optional*): attention head size, independent of `hidden_size / num_attention_heads`
            ("hourglass attention"). Defaults to `hidden_size // num_attention_heads`.
        qk_norm (`bool`, defaults to False): RMSNorm over the full packed query (`num_attention_heads * head_dim`)
            and key (`num_key_value_heads * head_dim`) projections, before RoPE (OLMo-2 style).
        rope_theta, rope_scaling, rope_parameters: RoPE as transformers' Llama takes it, in either the 4.x
            spelling (`rope_theta` plus `rope_scaling`) or the 5.x one (`rope_parameters`); stored as
            `rope_parameters`.
    """

    model_type = "hourglass_llama"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=None,
        head_dim=None,
        num_mlp_layers=1,
        mlp_intermediate_sizes=None,
        qk_norm=False,
        hidden_act="silu",
        max_position_embeddings=2048,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        pad_token_id=None,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        rope_theta=None,
        rope_scaling=None,
        rope_parameters=None,
        attention_bias=False,
        attention_dropout=0.0,
        mlp_bias=False,
        **kwargs,
    ):
        for name, value in [
            ("vocab_size", vocab_size),
            ("hidden_size", hidden_size),
            ("num_hidden_layers", num_hidden_layers),
            ("num_attention_heads", num_attention_heads),
            ("num_mlp_layers", num_mlp_layers),
            ("max_position_embeddings", max_position_embeddings),
        ]:
            check_positive_int(name, value)
        if num_key_value_heads is None:
            num_key_value_heads = num_attention_heads
        check_positive_int("num_key_value_heads", num_key_value_heads)
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"`num_key_value_heads` ({num_key_value_heads}) must divide `num_attention_heads` "
                f"({num_attention_heads})"
            )
        if head_dim is None:
            if hidden_size % num_attention_heads:
                raise ValueError(
                    f"`hidden_size` ({hidden_size}) must be a multiple of `num_attention_heads` "
                    f"({num_attention_heads}) unless `head_dim` is given"
                )
            head_dim = hidden_size // num_attention_heads
        check_positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"`head_dim` must be even for rotary embeddings, got {head_dim}")

        if mlp_intermediate_sizes is None:
            mlp_intermediate_sizes = intermediate_size
        if isinstance(mlp_intermediate_sizes, int):
            mlp_intermediate_sizes = [mlp_intermediate_sizes] * num_mlp_layers
        mlp_intermediate_sizes = list(mlp_intermediate_sizes)
        if len(mlp_intermediate_sizes) != num_mlp_layers:
            raise ValueError(
                f"`mlp_intermediate_sizes` must be one int or a list of `num_mlp_layers` ({num_mlp_layers}) ints, "
                f"got {len(mlp_intermediate_sizes)} values"
            )
        for k, size in enumerate(mlp_intermediate_sizes):
            check_positive_int(f"mlp_intermediate_sizes[{k}]", size)

        check_llama_fields(hidden_act, rms_norm_eps, initializer_range, attention_dropout)
        for name, value in [("qk_norm", qk_norm), ("attention_bias", attention_bias), ("mlp_bias", mlp_bias)]:
            check_bool(name, value)

        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        # Llama's field, kept for tools that read it: the widest sub-MLP.
        self.intermediate_size = max(mlp_intermediate_sizes)
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.num_mlp_layers = num_mlp_layers
        self.mlp_intermediate_sizes = mlp_intermediate_sizes
        self.qk_norm = qk_norm
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_parameters = normalize_rope_parameters(
            rope_parameters, rope_scaling, rope_theta, max_position_embeddings
        )
        check_rope_head_dims(self.rope_parameters, [head_dim])
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    # Accounting. The model's own counts must agree with these (tests check it); presets, benchmarks and model
    # cards use them.

    def layer_num_parameters(self):
        """Parameters of one decoder layer."""
        d, q_width = self.hidden_size, self.num_attention_heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        attention = d * (q_width + 2 * kv_width) + q_width * d
        if self.attention_bias:
            attention += q_width + 2 * kv_width + d
        if self.qk_norm:
            attention += q_width + kv_width
        mlps = 0
        for width in self.mlp_intermediate_sizes:
            mlps += 3 * d * width + d  # gate, up, down and the sub-MLP's norm
            if self.mlp_bias:
                mlps += 2 * width + d
        return attention + d + mlps  # d: the attention norm

    def num_parameters(self, exclude_embeddings=False):
        """Equals `model.num_parameters(exclude_embeddings)` of an `HourglassLlamaForCausalLM`: like transformers,
        `exclude_embeddings` drops the input embedding only, so an untied LM head is still counted."""
        total = self.num_hidden_layers * self.layer_num_parameters() + self.hidden_size  # + final norm
        if not self.tie_word_embeddings:
            total += self.vocab_size * self.hidden_size
        if not exclude_embeddings:
            total += self.vocab_size * self.hidden_size
        return total

    def non_embedding_parameters(self):
        """Parameters outside the embedding and the LM head: the count the paper matches budgets on."""
        return self.num_hidden_layers * self.layer_num_parameters() + self.hidden_size

    def flops_per_token(self, sequence_length):
        """Forward-pass FLOPs per token at context length `sequence_length`: 2 per weight multiply-add in every
        linear layer (LM head included, embedding lookup and norms excluded), plus 4 * s * attention width per
        layer for the scores and the weighted sum. Training costs about three times this."""
        check_positive_int("sequence_length", sequence_length)
        d, q_width = self.hidden_size, self.num_attention_heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        layer_weights = d * (2 * q_width + 2 * kv_width) + 3 * d * sum(self.mlp_intermediate_sizes)
        matmul_weights = self.num_hidden_layers * layer_weights + self.vocab_size * d
        attention = 4 * sequence_length * q_width * self.num_hidden_layers
        return 2 * matmul_weights + attention

    def kv_cache_bytes_per_token(self, dtype=torch.bfloat16):
        """Bytes of key and value cache one token takes across all layers."""
        per_layer = 2 * self.num_key_value_heads * self.head_dim
        return per_layer * self.num_hidden_layers * dtype_bytes(dtype)
