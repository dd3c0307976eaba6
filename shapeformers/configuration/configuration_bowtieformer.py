"""BowtieFormer configuration: a decoder whose width changes from layer to layer (MODELS.md §2).

This file is copied flat into every saved model folder (remote code): it imports only torch, transformers and
its siblings.
"""

import math

import torch
from transformers import PretrainedConfig

from .configuration_common import (
    check_bool,
    check_llama_fields,
    check_positive_int,
    check_positive_number,
    check_rope_head_dims,
    dtype_bytes,
    normalize_rope_parameters,
)

SCHEDULES = ("uniform", "geometric", "arithmetic")
RESIZE_MODES = ("carry_forward", "zero")
FFN_TYPES = ("swiglu", "hourglass")


def per_layer(value, layer_idx):
    """A per-layer field's value at `layer_idx`: the field is either one value for all layers or a list."""
    return value[layer_idx] if isinstance(value, (list, tuple)) else value


def schedule_multipliers(schedule, num_layers, bottleneck_layer, step, symmetric):
    """Width multipliers c_1 = 1, ..., c_L of a schedule narrowing by `step` per layer down to the 1-indexed
    `bottleneck_layer`, then widening: back to c_L = 1 when `symmetric`, else at the mirrored rate.

    geometric: c_l = step^(l-1) up to the bottleneck, times g = step^(-(k-1)/(L-k)) per layer after it;
    arithmetic: c_l = 1 + (l-1) step up to the bottleneck, plus -(k-1) step / (L-k) per layer after it.
    """
    k, L = bottleneck_layer, num_layers
    if schedule == "geometric":
        rise = step ** (-(k - 1) / (L - k)) if symmetric else 1 / step
        return [step ** (l - 1) if l <= k else step ** (k - 1) * rise ** (l - k) for l in range(1, L + 1)]
    rise = -(k - 1) * step / (L - k) if symmetric else -step
    return [1 + (l - 1) * step if l <= k else 1 + (k - 1) * step + (l - k) * rise for l in range(1, L + 1)]


def matched_base_width(multipliers, hidden_size, cost_per_width_squared):
    """The base width b for which widths b * c_l have the uniform model's parameter count, counted as the paper
    does: cost * w^2 per layer (attention 4 w^2, SwiGLU 3 * ratio * w^2), embeddings at width h on both sides (so
    they cancel), minus the first layer's q/k/v columns that only see zero padding (3 (w_1 - h) w_1 when w_1 > h)
    and the last layer's down-projection rows cut before the LM head (4 w_L (w_L - h) when w_L > h). A quadratic in
    b for each of the four waste cases; the root consistent with its case is the answer."""
    h, c_first, c_last = hidden_size, multipliers[0], multipliers[-1]
    sum_of_squares = sum(c * c for c in multipliers)
    target = cost_per_width_squared * len(multipliers) * h * h
    for first_wasted in (True, False):
        for last_wasted in (True, False):
            a = cost_per_width_squared * sum_of_squares
            b = 0.0
            if first_wasted:
                a, b = a - 3 * c_first**2, b + 3 * c_first * h
            if last_wasted:
                a, b = a - 4 * c_last**2, b + 4 * c_last * h
            base = (-b + math.sqrt(b * b + 4 * a * target)) / (2 * a)
            if (base * c_first > h) == first_wasted and (base * c_last > h) == last_wasted:
                return base
    raise ValueError("no base width matches the uniform parameter count")  # unreachable for valid schedules


def solve_schedule(hidden_size, num_layers, schedule, bottleneck_ratio, bottleneck_position, symmetric, mlp_ratio):
    """(bottleneck layer k, per-layer step, base width rounded to an integer) of a "geometric" or "arithmetic"
    schedule whose narrowest layer, the 1-indexed k = round(bottleneck_position * num_layers), has width
    `bottleneck_ratio * hidden_size`, parameter-matched to the uniform model of width `hidden_size` (MODELS.md §2.1)."""
    k = math.floor(bottleneck_position * num_layers + 0.5)
    cost = 4 + 3 * mlp_ratio

    def narrowest(step):
        c = schedule_multipliers(schedule, num_layers, k, step, symmetric)
        return matched_base_width(c, hidden_size, cost) * min(c)

    # The bottleneck narrows monotonically as the step shrinks (geometric) or grows more negative (arithmetic).
    low, high = (0.0, 1.0) if schedule == "geometric" else (-1.0 / (k - 1), 0.0)
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (low, middle) if narrowest(middle) > bottleneck_ratio * hidden_size else (middle, high)
    step = (low + high) / 2
    c = schedule_multipliers(schedule, num_layers, k, step, symmetric)
    return k, step, round(matched_base_width(c, hidden_size, cost))


def solve_layer_widths(
    hidden_size, num_layers, schedule, bottleneck_ratio, bottleneck_position, symmetric, quantize_to, mlp_ratio
):
    """Per-layer widths of `schedule` (see solve_schedule), quantized; reproduces the paper's published widths."""
    if schedule == "uniform":
        return [hidden_size] * num_layers
    k, step, base = solve_schedule(
        hidden_size, num_layers, schedule, bottleneck_ratio, bottleneck_position, symmetric, mlp_ratio
    )
    c = schedule_multipliers(schedule, num_layers, k, step, symmetric)
    # Round the base first, then rebuild step by step as the official code does, then quantize each width.
    widths, width = [], float(base)
    for l in range(num_layers):
        if l > 0:
            if schedule == "geometric":
                width *= c[l] / c[l - 1]
            else:
                width += base * (c[l] - c[l - 1])
        widths.append(width)
    return [max(quantize_to, quantize_to * math.floor(w / quantize_to + 0.5)) for w in widths]


class BowtieFormerConfig(PretrainedConfig):
    r"""
    Configuration of a [`BowtieFormerModel`]: layer l has its own width `layer_widths[l]`, head size, MLP size and
    KV-cache shape; a single residual buffer carries coordinates between layers of different widths.

    Args:
        hidden_size (`int`): width of the embedding and of the LM head's input (the width of the parameter-matched
            uniform baseline).
        layer_widths (`list[int]`, *optional*): explicit per-layer widths. When absent they are solved from the
            schedule below and stored, so that a saved config never re-solves.
        schedule (`str`): "uniform", "geometric" or "arithmetic".
        bottleneck_ratio (`float`): narrowest width / hidden_size (r_d).
        bottleneck_position (`float`): position of the narrowest layer as a fraction of the depth (r_l).
        symmetric (`bool`): the last layer is as wide as the first.
        quantize_to (`int`): widths are rounded to multiples of this.
        num_attention_heads, num_key_value_heads (`int` or `list[int]`): per layer; head_dim = width / heads.
        mlp_ratio (`float`): MLP width / layer width, when `intermediate_size` is not given.
        intermediate_size (`int` or `list[int]`, *optional*): explicit MLP width(s).
        ffn_type (`str`): "swiglu" (one MLP per layer) or "hourglass" (`num_mlp_layers` residual sub-MLPs per layer,
            each `mlp_ratio * width` wide, as in HourglassLlama).
        resize_mode (`str`): "carry_forward" (widening reuses the most recent value of each coordinate) or "zero".
        embedding_multiplier, residual_multiplier, logits_scaling: muP multipliers, as in Granite.
        attention_multiplier (`float`, `list[float]` or None): softmax scale; None means 1 / sqrt(head_dim).
    """

    model_type = "bowtieformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size=32000,
        hidden_size=640,
        num_hidden_layers=16,
        layer_widths=None,
        schedule="geometric",
        bottleneck_ratio=0.3,
        bottleneck_position=0.75,
        symmetric=True,
        quantize_to=32,
        num_attention_heads=16,
        num_key_value_heads=None,
        mlp_ratio=4,
        intermediate_size=None,
        ffn_type="swiglu",
        num_mlp_layers=1,
        resize_mode="carry_forward",
        embedding_multiplier=1.0,
        residual_multiplier=1.0,
        logits_scaling=1.0,
        attention_multiplier=None,
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
            ("quantize_to", quantize_to),
            ("num_mlp_layers", num_mlp_layers),
            ("max_position_embeddings", max_position_embeddings),
        ]:
            check_positive_int(name, value)
        L = num_hidden_layers
        for name, value, allowed in [
            ("schedule", schedule, SCHEDULES),
            ("resize_mode", resize_mode, RESIZE_MODES),
            ("ffn_type", ffn_type, FFN_TYPES),
        ]:
            if value not in allowed:
                raise ValueError(f"`{name}` must be one of {list(allowed)}, got {value!r}")
        if ffn_type == "swiglu" and num_mlp_layers != 1:
            raise ValueError(f"`num_mlp_layers` must be 1 with ffn_type 'swiglu', got {num_mlp_layers}")
        check_llama_fields(hidden_act, rms_norm_eps, initializer_range, attention_dropout)
        check_positive_number("mlp_ratio", mlp_ratio)
        for name, value in [("symmetric", symmetric), ("attention_bias", attention_bias), ("mlp_bias", mlp_bias)]:
            check_bool(name, value)

        if layer_widths is None:
            if schedule != "uniform":
                check_positive_number("bottleneck_ratio", bottleneck_ratio)
                check_positive_number("bottleneck_position", bottleneck_position)
                if not bottleneck_ratio <= 1:
                    raise ValueError(f"`bottleneck_ratio` must be in (0, 1], got {bottleneck_ratio!r}")
                k = math.floor(bottleneck_position * L + 0.5)
                if not 2 <= k <= L - 1:
                    raise ValueError(
                        f"`bottleneck_position` must put the narrowest layer strictly inside the stack: "
                        f"round({bottleneck_position!r} * {L}) = {k} is not in [2, {L - 1}]"
                    )
            layer_widths = solve_layer_widths(
                hidden_size, L, schedule, bottleneck_ratio, bottleneck_position, symmetric, quantize_to, mlp_ratio
            )
        layer_widths = list(layer_widths)
        self._check_per_layer("layer_widths", layer_widths, L, check_positive_int)

        if num_key_value_heads is None:
            num_key_value_heads = num_attention_heads
        for name, value in [("num_attention_heads", num_attention_heads), ("num_key_value_heads", num_key_value_heads)]:
            self._check_per_layer(name, value, L, check_positive_int)
        for l, width in enumerate(layer_widths):
            heads, kv_heads = per_layer(num_attention_heads, l), per_layer(num_key_value_heads, l)
            if width % heads or (width // heads) % 2:
                raise ValueError(
                    f"`layer_widths[{l}]` ({width}) must be an even multiple of `num_attention_heads` ({heads}): "
                    f"head_dim = width / heads must be an even integer for rotary embeddings"
                )
            if heads % kv_heads:
                raise ValueError(
                    f"`num_key_value_heads` ({kv_heads}) must divide `num_attention_heads` ({heads}) at layer {l}"
                )
        if intermediate_size is None:
            intermediate_size = [max(1, round(mlp_ratio * width)) for width in layer_widths]
        self._check_per_layer("intermediate_size", intermediate_size, L, check_positive_int)
        if attention_multiplier is not None:
            self._check_per_layer("attention_multiplier", attention_multiplier, L, check_positive_number)
        for name, value in [
            ("embedding_multiplier", embedding_multiplier),
            ("residual_multiplier", residual_multiplier),
            ("logits_scaling", logits_scaling),
        ]:
            check_positive_number(name, value)

        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.layer_widths = layer_widths
        self.schedule = schedule
        self.bottleneck_ratio = bottleneck_ratio
        self.bottleneck_position = bottleneck_position
        self.symmetric = symmetric
        self.quantize_to = quantize_to
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.mlp_ratio = mlp_ratio
        self.intermediate_size = intermediate_size
        self.ffn_type = ffn_type
        self.num_mlp_layers = num_mlp_layers
        self.resize_mode = resize_mode
        self.embedding_multiplier = embedding_multiplier
        self.residual_multiplier = residual_multiplier
        self.logits_scaling = logits_scaling
        self.attention_multiplier = attention_multiplier
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_parameters = normalize_rope_parameters(
            rope_parameters, rope_scaling, rope_theta, max_position_embeddings
        )
        check_rope_head_dims(self.rope_parameters, [self.layer_shape(l)[3] for l in range(L)])
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

    @staticmethod
    def _check_per_layer(name, value, num_layers, check):
        """`value` is one value for every layer or a list of `num_layers` values, each passing `check`."""
        if isinstance(value, (list, tuple)):
            if len(value) != num_layers:
                raise ValueError(
                    f"`{name}` must be one value or a list of `num_hidden_layers` ({num_layers}) values, "
                    f"got {len(value)} values"
                )
            for l, item in enumerate(value):
                check(f"{name}[{l}]", item)
        else:
            check(name, value)

    # Per-layer shapes, the one place the model and the cache read them from.

    def layer_shape(self, layer_idx):
        """(width, heads, kv_heads, head_dim, mlp width) of layer `layer_idx`."""
        width = self.layer_widths[layer_idx]
        heads = per_layer(self.num_attention_heads, layer_idx)
        return (
            width,
            heads,
            per_layer(self.num_key_value_heads, layer_idx),
            width // heads,
            per_layer(self.intermediate_size, layer_idx),
        )

    def layer_attention_scale(self, layer_idx):
        """Softmax scale of layer `layer_idx`: `attention_multiplier`, or 1 / sqrt(head_dim) when it is None."""
        if self.attention_multiplier is None:
            return self.layer_shape(layer_idx)[3] ** -0.5
        return per_layer(self.attention_multiplier, layer_idx)

    @property
    def residual_width(self):
        """Width of the residual buffer: the widest layer or the embedding, whichever is wider."""
        return max(self.hidden_size, *self.layer_widths)

    # Accounting: exact for this implementation (the model's num_parameters() agrees); presets, benchmarks and
    # model cards use it.

    def layer_num_parameters(self, layer_idx):
        width, heads, kv_heads, head_dim, mlp_width = self.layer_shape(layer_idx)
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        attention = width * (q_width + 2 * kv_width) + q_width * width
        if self.attention_bias:
            attention += q_width + 2 * kv_width + width
        mlp = 3 * width * mlp_width + width  # gate, up, down and the MLP's pre-norm
        if self.mlp_bias:
            mlp += 2 * mlp_width + width
        return attention + width + self.num_mlp_layers * mlp  # + the attention's pre-norm

    def non_embedding_parameters(self):
        """Parameters outside the embedding and the LM head."""
        layers = sum(self.layer_num_parameters(l) for l in range(self.num_hidden_layers))
        return layers + self.layer_widths[-1]  # + final norm

    def num_parameters(self, exclude_embeddings=False):
        """Equals `model.num_parameters(exclude_embeddings)` of a `BowtieFormerForCausalLM`: like transformers,
        `exclude_embeddings` drops the input embedding only, so an untied LM head is still counted."""
        total = self.non_embedding_parameters()
        if not self.tie_word_embeddings:
            total += self.vocab_size * self.hidden_size
        if not exclude_embeddings:
            total += self.vocab_size * self.hidden_size
        return total

    def flops_per_token(self, sequence_length):
        """Forward-pass FLOPs per token at context length `sequence_length`, as this implementation computes them:
        2 per weight multiply-add of every linear layer (LM head included; embedding lookup and norms excluded),
        plus 4 * s * attention width per layer for the scores and the weighted sum. The paper's count (MODELS.md
        §2.4) also drops the first layer's padded q/k/v columns and the last layer's cut rows."""
        check_positive_int("sequence_length", sequence_length)
        total = 2 * self.vocab_size * self.hidden_size
        for l in range(self.num_hidden_layers):
            width, heads, kv_heads, head_dim, mlp_width = self.layer_shape(l)
            q_width, kv_width = heads * head_dim, kv_heads * head_dim
            weights = width * (2 * q_width + 2 * kv_width) + self.num_mlp_layers * 3 * width * mlp_width
            total += 2 * weights + 4 * sequence_length * q_width
        return total

    def layer_kv_cache_bytes_per_token(self, dtype=torch.bfloat16):
        """Key and value bytes one token takes in each layer's cache."""
        size = dtype_bytes(dtype)
        return [2 * shape[2] * shape[3] * size for shape in map(self.layer_shape, range(self.num_hidden_layers))]

    def kv_cache_bytes_per_token(self, dtype=torch.bfloat16):
        """Key and value bytes one token takes across all layers."""
        return sum(self.layer_kv_cache_bytes_per_token(dtype))
