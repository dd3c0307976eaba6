"""lm_engine "width_varying" checkpoints (the paper's official code, MODELS.md §2.5) <-> BowtieFormer.

What the official code does, read from github.com/ZhaofengWu/variable-width-transformers (width_varying_config.py,
width_varying_model.py) and the lm_engine it builds on (open-lm-engine/lm-engine,
lm_engine/hf_models/modeling_utils/sequence_mixer_blocks/attention.py and mlp_blocks/mlp.py):

- `c_attn` [(heads + 2 kv_heads) head_dim, w] is fused per key/value group: for each of the kv_heads groups, the
  group's heads / kv_heads query heads, then its key head, then its value head (`x.view(..., kv_heads, -1)` split
  into (n_rep head_dim, head_dim, head_dim)). With MHA that is [q_0, k_0, v_0, q_1, k_1, v_1, ...]. Query head i
  attends with key/value head i // n_rep, as in transformers.
- SwiGLU `c_fc` [2 I, w] holds the up rows, then the gate rows (`chunk(2)`: up * silu(gate)); lm_engine of that era
  has a per-block `use_interleaved_weights` flag for the other layout (gate rows even, up rows odd), honoured here.
- RoPE is rotate-half over the whole head, as in Llama, so q/k rows need no permutation.
- The embedding is multiplied by m_emb, each branch output by m_residual, the logits divided by m_width (Granite's
  embedding_multiplier, residual_multiplier, logits_scaling).
- `expand_method` "move_up" widens from the newest earlier state that has each coordinate: our "carry_forward".
  "zero" zero-pads between layers, but the final resize to the unembedding width still uses move_up, which our
  "zero" mode does not do: such a model is refused when its last layer is narrower than the unembedding.
- WidthVaryingConfig.__init__ recomputes, at every load, `widths` from (base_width, expansion/reduction factors or
  deltas, max_layer, quantize_to), every layer's attention_multiplier as 1 / head_dim and its intermediate_size as
  4 width. Reading trusts the file (`widths` and per-layer values, never re-solved; the tensor shapes confirm them).
  Exporting refuses a model the official code would rebuild differently, and writes schedule fields that rebuild
  exactly our widths.
"""

import math
from pathlib import Path

import torch

from ..configuration import BowtieFormerConfig
from ..configuration.configuration_bowtieformer import solve_layer_widths, solve_schedule
from .io import (
    DEFAULT_MAX_SHARD_BYTES, Checkpoint, ConversionError, read_json, safetensors_headers, safetensors_loaders,
    write_foreign_folder,
)
from .writer import skeleton

EXPAND_METHODS = {"move_up": "carry_forward", "zero": "zero"}  # lm_engine -> ours
RESIZE_MODES = {ours: theirs for theirs, ours in EXPAND_METHODS.items()}
# The official config's fields that determine the widths it rebuilds; kept on our config as `lm_engine_schedule`
# (with the widths they produced) so that an export writes them back.
SCHEDULE_KEYS = (
    "base_width", "bottleneck_ratio", "expansion_factor", "reduction_factor", "delta", "delta_neg", "max_layer",
    "duplicate_max_layer", "quantize_to", "symmetric_widths", "permute_widths_seed", "permute_all_widths",
)
# lm_engine's `attention_multiplier_method` values.
INVERSE_SQRT_METHOD, INVERSE_METHOD = "1 / sqrt(head_dim)", "1 / head_dim"


def lm_engine_shapes(config):
    """{lm_engine tensor name: shape} of the width_varying model `config` describes, in the model's order."""
    V, h, L = config.vocab_size, config.hidden_size, config.num_hidden_layers
    shapes = {"transformer.wte.weight": (V, h)}
    for i in range(L):
        width, heads, kv_heads, head_dim, mlp_width = config.layer_shape(i)
        prefix = f"transformer.h.{i}."
        shapes[prefix + "ln_1.weight"] = (width,)
        shapes[prefix + "sequence_mixer.c_attn.weight"] = ((heads + 2 * kv_heads) * head_dim, width)
        shapes[prefix + "sequence_mixer.c_proj.weight"] = (width, heads * head_dim)
        shapes[prefix + "ln_2.weight"] = (width,)
        shapes[prefix + "mlp_block.c_fc.weight"] = (2 * mlp_width, width)
        shapes[prefix + "mlp_block.c_proj.weight"] = (width, mlp_width)
    shapes["transformer.ln_f.weight"] = (config.layer_widths[-1],)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, h)
    return shapes


def _stored_shapes(folder):
    """{tensor name: shape} from the safetensors headers of `folder` (no tensor data is read)."""
    return {key: shape for shapes in safetensors_headers(folder).values() for key, shape in shapes.items()}


def _check_tensors(folder, stored, expected, ignored=()):
    """One ConversionError listing every missing, unexpected and misshaped tensor, by name."""
    problems = []
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected) - set(ignored))
    misshaped = [
        f"{name} {stored[name]} (expected {expected[name]})"
        for name in expected
        if name in stored and stored[name] != expected[name]
    ]
    for what, names in (("missing", missing), ("unexpected", unexpected), ("misshaped", misshaped)):
        if names:
            problems.append(f"{what}: {', '.join(names)}")
    if problems:
        raise ConversionError(f"{folder}: the tensors do not match config.json: " + "; ".join(problems))


def _checked(load, name, shape):
    """`load` with its tensor's shape checked, so that a derived loader never reshapes the wrong tensor."""

    def checked_load():
        tensor = load()
        if tuple(tensor.shape) != tuple(shape):
            raise ConversionError(f"misshaped tensor {name}: {tuple(tensor.shape)} (expected {tuple(shape)})")
        return tensor

    return checked_load


# Reading.


def _multiplier(value):
    """lm_engine writes None for "absent" multipliers; m_* of None means 1."""
    return 1.0 if value is None else value


def _attention_multiplier(block, head_dim, layer, folder):
    value, method = block.get("attention_multiplier"), block.get("attention_multiplier_method")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    if method == INVERSE_SQRT_METHOD:
        return head_dim**-0.5
    if method in (None, INVERSE_METHOD) and value in (None, -1):
        return 1 / head_dim  # what WidthVaryingConfig sets for every layer when it loads
    raise ConversionError(
        f"{folder}: sequence_mixer_blocks[{layer}] has attention_multiplier {value!r} and attention_multiplier_method "
        f"{method!r}; expected a number > 0, or None / -1 with a method in {[INVERSE_METHOD, INVERSE_SQRT_METHOD]}"
    )


def _refuse_unless(condition, folder, message):
    if not condition:
        raise ConversionError(f"{folder}: {message}")


def _config_fields(source, folder):
    """BowtieFormerConfig keyword arguments from an lm_engine width_varying config.json, with, per layer, whether the
    MLP's c_fc is interleaved."""
    get = source.get
    widths, L = get("widths"), get("num_layers")
    _refuse_unless(isinstance(widths, list) and widths, folder, f"config.json has no `widths` list (got {widths!r})")
    _refuse_unless(
        L == len(widths), folder, f"num_layers ({L!r}) does not match the {len(widths)} entries of `widths`"
    )
    attention_blocks, mlp_blocks = get("sequence_mixer_blocks") or [], get("mlp_blocks") or []
    _refuse_unless(
        len(attention_blocks) == L and len(mlp_blocks) == L,
        folder,
        f"expected {L} sequence_mixer_blocks and mlp_blocks, got {len(attention_blocks)} and {len(mlp_blocks)}",
    )
    expand_method = get("expand_method", "zero")  # WidthVaryingConfig's default
    _refuse_unless(
        expand_method in EXPAND_METHODS,
        folder,
        f"expand_method {expand_method!r} has no BowtieFormer equivalent; supported: {sorted(EXPAND_METHODS)} "
        "(the others add learned or random expansion layers)",
    )
    for key, expected in (("normalization_function", "rmsnorm"), ("position_embedding_type", "rope")):
        _refuse_unless(get(key, expected) == expected, folder, f"{key} must be {expected!r}, got {get(key)!r}")
    _refuse_unless(not get("rope_scaling"), folder, f"rope_scaling is not supported (got {get('rope_scaling')!r})")
    _refuse_unless(
        not get("fixed_residual_width"),
        folder,
        "fixed_residual_width models (norms and projections at the full residual width) are a different architecture",
    )

    # Embedding and unembedding widths, as WidthVaryingConfig derives them when the file does not say.
    hidden = get("hidden_size")
    embedding = get("embedding_width", hidden if get("original_input_width", True) else widths[0])
    default_unembedding = max(widths) if get("wide_unembedding") else widths[-1]
    unembedding = get("unembedding_width", hidden if get("original_output_width", True) else default_unembedding)
    _refuse_unless(
        embedding == unembedding,
        folder,
        f"embedding_width ({embedding}) differs from unembedding_width ({unembedding}); a BowtieFormer has one "
        "hidden_size for both",
    )
    resize_mode = EXPAND_METHODS[expand_method]
    _refuse_unless(
        not (resize_mode == "zero" and widths[-1] < unembedding),
        folder,
        f"expand_method 'zero' with a last layer ({widths[-1]}) narrower than the unembedding ({unembedding}): "
        "lm_engine fills the LM head's missing coordinates by move_up, our 'zero' mode by zeros",
    )

    heads, kv_heads, multipliers, intermediate, interleaved = [], [], [], [], []
    for layer, (attention, mlp) in enumerate(zip(attention_blocks, mlp_blocks)):
        # Missing keys take lm_engine's defaults (_SoftmaxAttentionArgs, _MLPArgs).
        kind = attention.get("sequence_mixer_type", "softmax_attention")
        _refuse_unless(kind == "softmax_attention", folder, f"layer {layer}: sequence_mixer_type {kind!r}")
        for key in ("add_bias", "qkv_bias", "attention_gate", "exclusive_self_attention", "sliding_window"):
            _refuse_unless(not attention.get(key), folder, f"layer {layer}: {key} {attention.get(key)!r}")
        layer_heads = attention.get("num_attention_heads", 12)
        layer_kv_heads = attention.get("num_key_value_heads", 1)
        head_dim = widths[layer] // layer_heads if isinstance(layer_heads, int) and layer_heads > 0 else None
        _refuse_unless(
            head_dim is not None and head_dim * layer_heads == widths[layer],
            folder,
            f"layer {layer}: width {widths[layer]} is not a multiple of num_attention_heads {layer_heads!r}",
        )
        _refuse_unless(
            attention.get("head_dim") in (None, head_dim),
            folder,
            f"layer {layer}: head_dim {attention.get('head_dim')} is not width / heads ({head_dim})",
        )
        heads.append(layer_heads)
        kv_heads.append(layer_kv_heads)
        multipliers.append(_attention_multiplier(attention, head_dim, layer, folder))

        mlp_type, activation = mlp.get("mlp_type", "MLP"), mlp.get("activation_function", "gelu_pytorch_tanh")
        _refuse_unless(mlp_type == "MLP", folder, f"layer {layer}: mlp_type {mlp_type!r} (only dense MLPs convert)")
        _refuse_unless(
            activation == "swiglu", folder, f"layer {layer}: activation_function {activation!r}, expected 'swiglu'"
        )
        _refuse_unless(not mlp.get("add_bias"), folder, f"layer {layer}: add_bias {mlp.get('add_bias')!r}")
        intermediate.append(mlp.get("intermediate_size"))
        interleaved.append(bool(mlp.get("use_interleaved_weights", False)))

    fields = dict(
        vocab_size=get("vocab_size"),
        hidden_size=embedding,
        num_hidden_layers=L,
        layer_widths=list(widths),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        attention_multiplier=multipliers,
        resize_mode=resize_mode,
        embedding_multiplier=_multiplier(get("m_emb")),
        residual_multiplier=_multiplier(get("m_residual")),
        logits_scaling=_multiplier(get("m_width")),
        rms_norm_eps=get("layer_norm_epsilon", 1e-5),
        rope_theta=get("rope_theta", 10000.0),
        bos_token_id=get("bos_token_id"),
        eos_token_id=get("eos_token_id"),
        pad_token_id=get("pad_token_id"),
        hidden_act="silu",
    )
    for key in ("max_position_embeddings", "initializer_range"):
        if get(key) is not None:
            fields[key] = get(key)
    # Descriptive schedule fields (never used: the widths are explicit).
    fields["schedule"] = "uniform" if len(set(widths)) == 1 else get("schedule_type", "geometric")
    if fields["schedule"] not in ("uniform", "geometric", "arithmetic"):
        fields["schedule"] = "geometric"
    if isinstance(get("quantize_to"), int) and get("quantize_to") > 0:
        fields["quantize_to"] = get("quantize_to")
    if isinstance(get("bottleneck_ratio"), (int, float)) and 0 < get("bottleneck_ratio") <= 1:
        fields["bottleneck_ratio"] = get("bottleneck_ratio")
    if isinstance(get("max_layer"), int) and 1 < get("max_layer") < L:
        fields["bottleneck_position"] = get("max_layer") / L
    fields["symmetric"] = bool(get("symmetric_widths", False))
    schedule = {key: get(key) for key in SCHEDULE_KEYS if key in source}
    if schedule:
        fields["lm_engine_schedule"] = {**schedule, "widths": list(widths)}
    return fields, interleaved


def _split_qkv(load, part, heads, kv_heads, head_dim, width):
    """A loader of q_proj, k_proj or v_proj (`part` 0, 1, 2) from a fused per-group c_attn."""
    n_rep = heads // kv_heads

    def split():
        grouped = load().reshape(kv_heads, n_rep + 2, head_dim, width)
        rows = (slice(0, n_rep), slice(n_rep, n_rep + 1), slice(n_rep + 1, n_rep + 2))[part]
        return grouped[:, rows].reshape(-1, width).clone()

    return split


def _split_fc(load, part, mlp_width, interleaved):
    """A loader of up_proj (`part` 0) or gate_proj (`part` 1) from c_fc."""

    def split():
        fused = load()
        if interleaved:  # gate rows even, up rows odd
            return fused[1::2].clone() if part == 0 else fused[0::2].clone()
        return fused[:mlp_width].clone() if part == 0 else fused[mlp_width:].clone()

    return split


def read_lm_engine(folder):
    """An lm_engine width_varying folder (config.json + safetensors, single or sharded) as a BowtieFormer
    Checkpoint with lazy loaders; every problem with the tensors is reported before anything is written."""
    folder = Path(folder)
    source = read_json(folder / "config.json")
    if source.get("model_type") != "width_varying":
        raise ConversionError(
            f"{folder} is not an lm_engine width_varying checkpoint (model_type {source.get('model_type')!r})"
        )
    fields, interleaved = _config_fields(source, folder)
    if "tie_word_embeddings" in source:
        fields["tie_word_embeddings"] = bool(source["tie_word_embeddings"])
    loaders = safetensors_loaders(folder)
    if "tie_word_embeddings" not in source:  # PretrainedConfig would default to tied; the tensors tell
        fields["tie_word_embeddings"] = "lm_head.weight" not in loaders
    try:
        config = BowtieFormerConfig(**fields)
    except (TypeError, ValueError) as error:
        raise ConversionError(f"{folder}: config.json does not describe a BowtieFormer: {error}") from None

    expected = lm_engine_shapes(config)
    ignored = ("lm_head.weight",) if config.tie_word_embeddings else ()
    _check_tensors(folder, _stored_shapes(folder), expected, ignored)

    tensors = {"model.embed_tokens.weight": loaders["transformer.wte.weight"]}
    for i in range(config.num_hidden_layers):
        width, heads, kv_heads, head_dim, mlp_width = config.layer_shape(i)
        theirs, ours = f"transformer.h.{i}.", f"model.layers.{i}."
        tensors[ours + "input_layernorm.weight"] = loaders[theirs + "ln_1.weight"]
        c_attn = loaders[theirs + "sequence_mixer.c_attn.weight"]
        for part, name in enumerate(("q_proj", "k_proj", "v_proj")):
            tensors[ours + f"self_attn.{name}.weight"] = _split_qkv(c_attn, part, heads, kv_heads, head_dim, width)
        tensors[ours + "self_attn.o_proj.weight"] = loaders[theirs + "sequence_mixer.c_proj.weight"]
        tensors[ours + "post_attention_layernorm.weight"] = loaders[theirs + "ln_2.weight"]
        c_fc = loaders[theirs + "mlp_block.c_fc.weight"]
        tensors[ours + "mlp.up_proj.weight"] = _split_fc(c_fc, 0, mlp_width, interleaved[i])
        tensors[ours + "mlp.gate_proj.weight"] = _split_fc(c_fc, 1, mlp_width, interleaved[i])
        tensors[ours + "mlp.down_proj.weight"] = loaders[theirs + "mlp_block.c_proj.weight"]
    tensors["model.norm.weight"] = loaders["transformer.ln_f.weight"]
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = loaders["lm_head.weight"]

    notes = []
    if any(interleaved):
        notes.append("c_fc of layers with use_interleaved_weights read as interleaved (gate rows even, up rows odd)")
    return Checkpoint(
        config=config, tensors=tensors, source_dir=folder, base_model=source.get("_name_or_path") or None,
        notes=notes,
    )


# Exporting.


def official_widths(schedule, num_layers):
    """The widths WidthVaryingConfig rebuilds from fully specified schedule fields (base_width, both geometric
    factors or both arithmetic deltas, max_layer, quantize_to), as its __init__ does; None for anything else."""
    base, k = schedule.get("base_width"), schedule.get("max_layer", 1)
    quantize = schedule.get("quantize_to", 1)
    geometric = schedule.get("expansion_factor") is not None and schedule.get("reduction_factor") is not None
    arithmetic = schedule.get("delta") is not None and schedule.get("delta_neg") is not None
    if base is None or geometric == arithmetic or schedule.get("permute_widths_seed") is not None:
        return None
    widths = []
    for layer in range(1, num_layers + 1):
        if layer == 1:
            width = base
        elif layer <= k:
            step = schedule["expansion_factor"] if geometric else schedule["delta"]
            width = widths[-1] * step if geometric else widths[-1] + base * step
        elif schedule.get("duplicate_max_layer") and layer == k + 1:
            width = widths[-1]
        else:
            step = schedule["reduction_factor"] if geometric else schedule["delta_neg"]
            width = widths[-1] * step if geometric else widths[-1] + base * step
        widths.append(width)
    return [int(round(width / quantize) * quantize) for width in widths]


def _solved_schedule(config):
    """Official schedule fields for widths that our solver produced from the config's own schedule parameters:
    the same base width (rounded) and per-layer steps, which the official loop then rounds the same way."""
    L, h = config.num_hidden_layers, config.hidden_size
    if config.schedule not in ("geometric", "arithmetic"):
        return None
    try:
        solved = solve_layer_widths(
            h, L, config.schedule, config.bottleneck_ratio, config.bottleneck_position, config.symmetric,
            config.quantize_to, config.mlp_ratio,
        )
    except (ValueError, ZeroDivisionError):
        return None
    if solved != config.layer_widths:
        return None  # the widths were given explicitly, not solved from these parameters
    k, step, base = solve_schedule(
        h, L, config.schedule, config.bottleneck_ratio, config.bottleneck_position, config.symmetric, config.mlp_ratio
    )
    geometric = config.schedule == "geometric"
    if geometric:
        rise = step ** (-(k - 1) / (L - k)) if config.symmetric else 1 / step
        factors = {"expansion_factor": step, "reduction_factor": rise}
    else:
        rise = -(k - 1) * step / (L - k) if config.symmetric else -step
        factors = {"delta": step, "delta_neg": rise}
    return {
        "base_width": base, **factors, "max_layer": k, "duplicate_max_layer": False,
        "quantize_to": config.quantize_to, "symmetric_widths": config.symmetric,
    }


def _export_schedule(config, folder):
    """Schedule fields from which the official WidthVaryingConfig rebuilds exactly `config.layer_widths`."""
    widths, L = config.layer_widths, config.num_hidden_layers
    kept = getattr(config, "lm_engine_schedule", None)
    if isinstance(kept, dict) and kept.get("widths") == widths:  # read from an lm_engine file with these widths
        return {key: value for key, value in kept.items() if key in SCHEDULE_KEYS}
    candidates = [_solved_schedule(config)]
    if len(set(widths)) == 1:
        candidates.append({
            "base_width": widths[0], "expansion_factor": 1.0, "reduction_factor": 1.0, "max_layer": 1,
            "duplicate_max_layer": False, "quantize_to": 1, "symmetric_widths": False,
        })
    for schedule in candidates:
        if schedule is not None and official_widths(schedule, L) == widths:
            return schedule
    raise ConversionError(
        f"{folder}: lm_engine's WidthVaryingConfig rebuilds `widths` from a schedule (base_width, factors, max_layer, "
        f"quantize_to) whenever it loads, and no such schedule is known to rebuild layer_widths {widths}"
    )


def _export_config(config, folder):
    """The lm_engine width_varying config.json of one of our BowtieFormer configs, or ConversionError."""
    L, h, widths = config.num_hidden_layers, config.hidden_size, config.layer_widths
    _refuse_unless(
        config.ffn_type == "swiglu" and config.num_mlp_layers == 1,
        folder,
        f"ffn_type {config.ffn_type!r} with num_mlp_layers {config.num_mlp_layers}: lm_engine has one SwiGLU MLP "
        "per layer",
    )
    _refuse_unless(config.hidden_act == "silu", folder, f"hidden_act {config.hidden_act!r}: lm_engine's swiglu is silu")
    _refuse_unless(
        not config.attention_bias and not config.mlp_bias, folder, "biases are not part of the width_varying format"
    )
    _refuse_unless(
        not config.tie_word_embeddings,
        folder,
        "tied word embeddings: WidthVaryingModelForCausalLM asserts untied embeddings",
    )
    rope = dict(config.rope_parameters)
    _refuse_unless(
        rope.get("rope_type", "default") == "default",
        folder,
        f"rope_type {rope.get('rope_type')!r}: width_varying asserts rope_scaling is None",
    )
    _refuse_unless(
        not (config.resize_mode == "zero" and widths[-1] < h),
        folder,
        f"resize_mode 'zero' with a last layer ({widths[-1]}) narrower than hidden_size ({h}): lm_engine fills the "
        "LM head's missing coordinates by move_up",
    )
    attention_blocks, mlp_blocks = [], []
    for layer in range(L):
        width, heads, kv_heads, head_dim, mlp_width = config.layer_shape(layer)
        scale = config.layer_attention_scale(layer)
        _refuse_unless(
            math.isclose(scale, 1 / head_dim, rel_tol=1e-9),
            folder,
            f"layer {layer} has attention scale {scale!r}, but WidthVaryingConfig sets every layer's "
            f"attention_multiplier to 1 / head_dim (here {1 / head_dim!r}) when it loads",
        )
        _refuse_unless(
            mlp_width == 4 * width,
            folder,
            f"layer {layer} has intermediate_size {mlp_width}, but WidthVaryingConfig sets it to 4 * width "
            f"({4 * width}) when it loads",
        )
        attention_blocks.append({
            "sequence_mixer_type": "softmax_attention", "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "attention_multiplier": scale, "add_bias": False,
        })
        mlp_blocks.append({
            "mlp_type": "MLP", "activation_function": "swiglu", "intermediate_size": mlp_width, "add_bias": False,
        })
    return {
        "model_type": "width_varying",
        "architectures": ["WidthVaryingModelForCausalLM"],
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "hidden_size": h,
        "num_layers": L,
        "widths": list(widths),
        **_export_schedule(config, folder),
        "embedding_width": h,
        "unembedding_width": h,
        "original_input_width": True,
        "original_output_width": True,
        "wide_unembedding": False,
        "fixed_residual_width": False,
        "expand_method": RESIZE_MODES[config.resize_mode],
        "m_emb": config.embedding_multiplier,
        "m_residual": config.residual_multiplier,
        "m_width": config.logits_scaling,
        "rope_theta": rope["rope_theta"],
        "rope_scaling": None,
        "layer_norm_epsilon": config.rms_norm_eps,
        "normalization_function": "rmsnorm",
        "position_embedding_type": "rope",
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": False,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "sequence_mixer_blocks": attention_blocks,
        "mlp_blocks": mlp_blocks,
    }


def _fused_qkv(q, k, v, heads, kv_heads, head_dim, width):
    n_rep = heads // kv_heads

    def fuse():
        parts = (q().reshape(kv_heads, n_rep, head_dim, width), k().reshape(kv_heads, 1, head_dim, width),
                 v().reshape(kv_heads, 1, head_dim, width))
        return torch.cat(parts, dim=1).reshape(-1, width)

    return fuse


def _fused_fc(up, gate):
    return lambda: torch.cat((up(), gate()), dim=0)  # up rows first (use_interleaved_weights false)


def export_lm_engine(folder, destination, dtype=None, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES):
    """Write one of our BowtieFormer folders as an lm_engine width_varying folder (config.json + safetensors with
    fused c_attn and c_fc), atomically; refuse what the official code would load as a different model."""
    folder = Path(folder)
    ours = read_json(folder / "config.json")
    if ours.get("model_type") != "bowtieformer":
        raise ConversionError(
            f"{folder}: only a BowtieFormer exports to lm_engine (model_type {ours.get('model_type')!r})"
        )
    try:
        config = BowtieFormerConfig.from_dict(ours)
    except (TypeError, ValueError) as error:
        raise ConversionError(f"{folder}: config.json is not a valid BowtieFormer config: {error}") from None
    lm_config = _export_config(config, folder)

    _, shapes = skeleton(config)  # our tensors' names and shapes
    loaders = safetensors_loaders(folder)
    missing = sorted(set(shapes) - set(loaders))
    if missing:
        raise ConversionError(f"{folder}: missing tensors: {', '.join(missing)}")

    def ours(name):
        return _checked(loaders[name], name, shapes[name])

    tensors = {"transformer.wte.weight": ours("model.embed_tokens.weight")}
    for i in range(config.num_hidden_layers):
        width, heads, kv_heads, head_dim, _ = config.layer_shape(i)
        layer, theirs = f"model.layers.{i}.", f"transformer.h.{i}."
        tensors[theirs + "ln_1.weight"] = ours(layer + "input_layernorm.weight")
        tensors[theirs + "sequence_mixer.c_attn.weight"] = _fused_qkv(
            *(ours(layer + f"self_attn.{name}.weight") for name in ("q_proj", "k_proj", "v_proj")),
            heads, kv_heads, head_dim, width,
        )
        tensors[theirs + "sequence_mixer.c_proj.weight"] = ours(layer + "self_attn.o_proj.weight")
        tensors[theirs + "ln_2.weight"] = ours(layer + "post_attention_layernorm.weight")
        tensors[theirs + "mlp_block.c_fc.weight"] = _fused_fc(
            ours(layer + "mlp.up_proj.weight"), ours(layer + "mlp.gate_proj.weight")
        )
        tensors[theirs + "mlp_block.c_proj.weight"] = ours(layer + "mlp.down_proj.weight")
    tensors["transformer.ln_f.weight"] = ours("model.norm.weight")
    tensors["lm_head.weight"] = ours("lm_head.weight")
    write_foreign_folder(folder, destination, lm_config, tensors, dtype, max_shard_bytes)


__all__ = ["export_lm_engine", "lm_engine_shapes", "official_widths", "read_lm_engine"]
