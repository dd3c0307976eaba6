"""Model cards and publishing to the Hugging Face Hub: `shapeformers card` and `shapeformers publish`.

`write_card` renders `model_cards/template.md` (a Jinja template for huggingface_hub's `ModelCard.from_template`)
into the model folder's README.md: the YAML metadata the Hub reads, a usage snippet, a table of parameters, FLOPs
per token and KV-cache bytes per token against the parameter-matched baseline, evaluation results, and PNG pictures
saved beside it. `publish` writes the same card, checks the folder as a Hub user will meet it (a fresh interpreter
that cannot import shapeformers loads it through its remote code, tokenizer and generation config included), then
uploads it with huggingface_hub's `create_repo` and `upload_folder`.

Every number comes from the configs' accounting (and the per-layer split from the model itself, built on the meta
device), never from a second formula.
"""

import importlib.resources
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from .modeling.bundle import atomic_write_text

OUR_MODEL_TYPES = ("hourglass_llama", "bowtieformer")
# The repository's model_cards/template.md, installed as the package `shapeformers.model_cards` (setup.cfg).
TEMPLATE = importlib.resources.files("shapeformers.model_cards") / "template.md"
DEFAULT_LICENSE = "apache-2.0"
CARD_SEQUENCE_LENGTH = 2048  # FLOPs per token are quoted at this context length, or the model's maximum if shorter
KV_DTYPE = "bfloat16"
PICTURES = {  # key: (file name, caption)
    "widths": ("width_profile.png", "Width of each layer"),
    "split": ("parameter_split.png", "Attention and feed-forward parameters per layer"),
    "kv": ("kv_cache_per_layer.png", "KV-cache bytes per token in each layer"),
}
# Left out of uploads: hidden files (staging folders, editor files) and Python caches.
IGNORE_PATTERNS = [".*", "*/.*", "__pycache__/*", "*/__pycache__/*", "*.pyc"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
CHECK_TIMEOUT_S = 1800
ARCHITECTURES = {
    "hourglass_llama": (
        "HourglassLlama",
        "a Llama whose feed-forward network is a stack of K narrow residual sub-MLPs, each with its own pre-norm "
        "(Liao et al., *Revisiting the Shape Convention of Transformer Language Models*, "
        "[arXiv:2602.06471](https://arxiv.org/abs/2602.06471))",
    ),
    "bowtieformer": (
        "BowtieFormer",
        "a decoder whose width changes from layer to layer, wide at both ends and narrow at a bottleneck, joined by "
        "carry-forward residual resizing (Wu et al., *Variable-Width Transformers*, "
        "[arXiv:2606.18246](https://arxiv.org/abs/2606.18246))",
    ),
}


class PublishError(Exception):
    """A folder that cannot be carded or published as asked; the message says what is wrong and what to do."""


# Configs, baselines, per-layer accounting


def _config_fields(config, drop=()):
    fields = config.to_dict()
    for key in ("model_type", "transformers_version", "architectures", "auto_map", "_name_or_path", *drop):
        fields.pop(key, None)
    return fields


def load_config(path, what="MODEL_DIR"):
    """The config in folder `path` (or the config.json file `path`): one of our model types, or a Llama read as the
    HourglassLlama with K = 1 that it is (for baselines)."""
    from transformers import AutoConfig

    from .configuration import HourglassLlamaConfig

    path = Path(path)
    folder = path.parent if path.is_file() else path
    if not (folder / "config.json").is_file():
        raise PublishError(f"{what} {path}: no config.json there")
    raw = json.loads((folder / "config.json").read_text())
    if raw.get("model_type") == "llama":
        return HourglassLlamaConfig(**_config_fields(AutoConfig.from_pretrained(folder)))
    if raw.get("model_type") not in OUR_MODEL_TYPES:
        raise PublishError(f"{what} {path}: model_type {raw.get('model_type')!r} is not one of {OUR_MODEL_TYPES}")
    return AutoConfig.from_pretrained(folder)  # our class (registered on import), not the folder's code


def matched_baseline(config):
    """(baseline config or None, a sentence saying what it is), for the cost table.

    BowtieFormer: the uniform model of the same hidden size, depth and heads (the widths were solved to match its
    parameter count). HourglassLlama: the paper's K = 1 baseline where the shape is a paper preset's, else the Llama
    (K = 1) of the same width, depth and attention whose single MLP matches the non-embedding parameters. A model
    that already is such a baseline (uniform widths, K = 1) has none.
    """
    from .configuration import HOURGLASS_LLAMA_PRESETS, BowtieFormerConfig, hourglass_llama_preset
    from .configuration import match_bottleneck_width

    if config.model_type == "bowtieformer":
        if set(config.layer_widths) == {config.hidden_size}:
            return None, (
                "none; every layer of this model is as wide as its embedding, so it is itself the uniform model "
                "(transformers' Granite) that BowtieFormers are matched against."
            )
        fields = _config_fields(config, drop=("layer_widths", "intermediate_size", "attention_multiplier"))
        try:
            baseline = BowtieFormerConfig(**dict(fields, schedule="uniform"))
        except ValueError as error:
            return None, f"none; the uniform model of width {config.hidden_size} is not a valid config ({error})."
        return baseline, (
            f"the uniform model (transformers' Granite) with the same hidden size ({config.hidden_size}), depth "
            f"({config.num_hidden_layers}) and heads, every layer {config.hidden_size} wide; this model's layer "
            "widths were solved to match its parameter count."
        )

    if config.num_mlp_layers == 1:
        return None, "none; with K = 1 sub-MLP this model is a Llama, its own baseline."
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
             "mlp_intermediate_sizes")  # fmt: skip
    for name in HOURGLASS_LLAMA_PRESETS:
        preset = hourglass_llama_preset(name)
        if name.endswith("-hourglass") and all(getattr(preset, key) == getattr(config, key) for key in shape):
            name = name.replace("-hourglass", "-baseline")
            baseline = hourglass_llama_preset(
                name, vocab_size=config.vocab_size, tie_word_embeddings=config.tie_word_embeddings
            )
            return baseline, f"the paper's K = 1 baseline for this shape (preset `{name}`), a Llama."
    baseline = match_bottleneck_width(config, 1, config.num_hidden_layers, config.hidden_size)
    return baseline, (
        f"the Llama (K = 1) with the same hidden size ({config.hidden_size}), depth ({config.num_hidden_layers}) "
        f"and attention whose single MLP, {baseline.mlp_intermediate_sizes[0]} wide, matches the non-embedding "
        "parameters. (The paper compares with deeper, narrower Llamas: `shapeformers card --baseline` takes one.)"
    )


def layer_profile(config):
    """One dict per decoder layer: width, attention parameters (its pre-norm included), feed-forward parameters
    (their pre-norms included) and KV-cache bytes per token. Parameters are counted on the model itself, built on
    the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    def count(*modules):
        return sum(parameter.numel() for module in modules for parameter in module.parameters())

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if config.model_type == "bowtieformer":
        kv_bytes = config.layer_kv_cache_bytes_per_token(KV_DTYPE)
    else:
        kv_bytes = [config.kv_cache_bytes_per_token(KV_DTYPE) // config.num_hidden_layers] * config.num_hidden_layers
    return [
        {
            "width": getattr(layer, "width", config.hidden_size),
            "attention": count(layer.self_attn, layer.input_layernorm),
            "ffn": count(layer.mlp, layer.post_attention_layernorm),
            "kv_bytes": kv_bytes[index],
        }
        for index, layer in enumerate(model.model.layers)
    ]


def cost_figures(config):
    """The figures of the cost table, from the config's accounting."""
    sequence_length = min(CARD_SEQUENCE_LENGTH, config.max_position_embeddings)
    return {
        "parameters": config.num_parameters(),
        "non_embedding_parameters": config.non_embedding_parameters(),
        "flops_per_token": config.flops_per_token(sequence_length),
        "kv_bytes_per_token": config.kv_cache_bytes_per_token(KV_DTYPE),
    }


def _human(number, unit=""):
    """1234567 -> "1.23M"; with unit "B" (bytes), binary multiples: 73728 -> "72 KiB"."""
    if unit == "B":
        for prefix, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if number >= scale:
                return f"{number / scale:.3g} {prefix}"
        return f"{number} B"
    for prefix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if number >= scale:
            return f"{number / scale:.3g}{prefix}"
    return str(number)


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def cost_table(config, baseline):
    sequence_length = min(CARD_SEQUENCE_LENGTH, config.max_position_embeddings)
    labels = {
        "parameters": "Parameters",
        "non_embedding_parameters": "Non-embedding parameters",
        "flops_per_token": f"Forward FLOPs per token (context {sequence_length:,})",
        "kv_bytes_per_token": f"KV-cache bytes per token ({KV_DTYPE})",
    }
    ours = cost_figures(config)
    if baseline is None:
        return markdown_table(["", "This model"], [[labels[key], f"{value:,}"] for key, value in ours.items()])
    theirs = cost_figures(baseline)
    units = {"kv_bytes_per_token": "B"}
    rows = [
        [labels[key], f"{ours[key]:,} ({_human(ours[key], units.get(key, ''))})",
         f"{theirs[key]:,} ({_human(theirs[key], units.get(key, ''))})", f"{ours[key] / theirs[key]:.3f}"]
        for key in ours
    ]  # fmt: skip
    return markdown_table(["", "This model", "Baseline", "Ratio"], rows)


def architecture_table(config):
    rows = [
        ["Vocabulary", f"{config.vocab_size:,}"],
        ["Hidden size (embedding width)", config.hidden_size],
        ["Layers", config.num_hidden_layers],
        ["Attention heads / KV heads", f"{config.num_attention_heads} / {config.num_key_value_heads}"],
        ["Context length", f"{config.max_position_embeddings:,}"],
        ["Tied embeddings", config.tie_word_embeddings],
    ]
    if config.model_type == "hourglass_llama":
        rows[3][1] += f" (head_dim {config.head_dim})"
        rows += [
            ["Sub-MLPs per layer (K)", config.num_mlp_layers],
            ["Sub-MLP widths", ", ".join(map(str, config.mlp_intermediate_sizes))],
            ["QK-norm", config.qk_norm],
        ]
    else:
        narrowest = min(config.layer_widths)
        feed_forward = config.ffn_type + (f", K = {config.num_mlp_layers}" if config.num_mlp_layers > 1 else "")
        rows += [
            ["Layer widths", " ".join(map(str, config.layer_widths))],
            ["Narrowest layer", f"{narrowest} wide (layer {config.layer_widths.index(narrowest) + 1})"],
            ["Feed-forward", feed_forward],
            ["Residual resizing", config.resize_mode],
        ]
    return markdown_table(["", ""], rows)


# Evaluation results


def read_results(path):
    """(huggingface_hub `EvalResult`s for the model-index, Markdown table) of a results JSON written by
    `shapeformers eval` or `lm_eval --output_path` (see shapeformers.eval.cards)."""
    from .eval.cards import eval_results, markdown_table as results_markdown

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PublishError(f"--results {path}: cannot read it as JSON ({error})") from None
    if not isinstance(data, dict):
        raise PublishError(f"--results {path}: not a results JSON of `shapeformers eval` or lm-eval")
    results, table = eval_results(data), results_markdown(data)
    if not table:
        raise PublishError(f"--results {path}: no scores in it (expected `shapeformers eval` or lm-eval's output)")
    return results, table


def results_table(eval_results):
    """A Markdown table of `EvalResult`s (those kept from the metadata of an earlier card)."""
    rows = [[result.dataset_name, result.dataset_split or "", result.metric_name or result.metric_type,
             result.metric_value] for result in eval_results]  # fmt: skip
    return markdown_table(["Task", "Split", "Metric", "Value"], rows)


# Pictures


def _figure(title, ylabel, layers):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    figure = Figure(figsize=(8, 3.2), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)  # the Agg backend, whatever matplotlib's global backend is
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel("layer")
    axes.set_ylabel(ylabel)
    axes.yaxis.set_major_formatter(EngFormatter(sep=""))
    axes.set_xticks(range(1, layers + 1, max(1, layers // 24)))
    axes.grid(axis="y", alpha=0.3)
    return figure, axes


def _finish(figure, axes, path):
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    figure.savefig(path)


def _baseline_steps(axes, values, label):
    """The baseline's per-layer values as a dashed line over the bars, one step per layer (its depth may differ)."""
    axes.stairs(values, [index + 0.5 for index in range(len(values) + 1)], color="black", linestyle="--",
                linewidth=1.2, baseline=None, label=label)


def draw_pictures(config, baseline, folder):
    """Save the card's PNGs in `folder`; return {key: file name} of those drawn."""
    folder = Path(folder)
    profile = layer_profile(config)
    base_profile = layer_profile(baseline) if baseline is not None else None
    layers = range(1, len(profile) + 1)
    depth = max(len(profile), len(base_profile or ()))
    # Name the baseline's depth where it differs from ours: its line then runs past our last layer.
    deeper = f" ({len(base_profile)} layers)" if base_profile and len(base_profile) != len(profile) else ""
    drawn = {}

    if config.model_type == "bowtieformer":
        figure, axes = _figure("Layer widths", "width", depth)
        axes.bar(layers, [row["width"] for row in profile], color="tab:blue", label="this model")
        if base_profile:
            _baseline_steps(axes, [row["width"] for row in base_profile], f"baseline{deeper}")
        _finish(figure, axes, folder / PICTURES["widths"][0])
        drawn["widths"] = PICTURES["widths"][0]

    figure, axes = _figure("Parameters per layer", "parameters", depth)
    attention = [row["attention"] for row in profile]
    axes.bar(layers, attention, color="tab:orange", label="attention")
    axes.bar(layers, [row["ffn"] for row in profile], bottom=attention, color="tab:green", label="feed-forward")
    if base_profile:
        _baseline_steps(axes, [row["attention"] + row["ffn"] for row in base_profile], f"baseline, total{deeper}")
    _finish(figure, axes, folder / PICTURES["split"][0])
    drawn["split"] = PICTURES["split"][0]

    figure, axes = _figure(f"KV cache per token ({KV_DTYPE})", "bytes", depth)
    axes.bar(layers, [row["kv_bytes"] for row in profile], color="tab:purple", label="this model")
    if base_profile:
        _baseline_steps(axes, [row["kv_bytes"] for row in base_profile], f"baseline{deeper}")
    _finish(figure, axes, folder / PICTURES["kv"][0])
    drawn["kv"] = PICTURES["kv"][0]
    return drawn


# The card


def _is_hub_id(name):
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return not Path(name).exists()


def render_card(folder, repo_id=None, results=None, base_model=None, license=None, baseline=None, template=None):
    """The model card of `folder` (a huggingface_hub ModelCard) and the pictures to save with it.

    Metadata already in the folder's README.md (license, base_model, language, datasets, evaluation results) is
    kept unless given here, so that regenerating a card, as `publish` does, loses nothing.
    `results`: a results JSON path (see `read_results`). `baseline`: a config or a path to one, replacing the
    parameter-matched baseline of `matched_baseline`. Returns (card, {key: picture file name}) with the pictures
    already written to `folder`.
    """
    from huggingface_hub import ModelCard, ModelCardData

    folder = Path(folder)
    config = load_config(folder)
    template = Path(template) if template else TEMPLATE
    if not template.is_file():
        raise PublishError(f"card template {template} not found")

    readme = folder / "README.md"
    previous = ModelCard.load(readme, ignore_metadata_errors=True).data if readme.is_file() else ModelCardData()
    if results:
        eval_results, evaluation = read_results(results)
    else:  # an earlier card's results, from its metadata
        eval_results = previous.eval_results
        evaluation = results_table(eval_results) if eval_results else None
    base_model = base_model or previous.base_model
    if isinstance(base_model, list):  # metadata allows several; the text names them all
        base_model = base_model[0] if len(base_model) == 1 else base_model
    on_hub = bool(base_model) and all(map(_is_hub_id, [base_model] if isinstance(base_model, str) else base_model))
    if baseline is None:
        baseline, baseline_text = matched_baseline(config)
    else:
        if not hasattr(baseline, "model_type"):
            baseline = load_config(baseline, "--baseline")
        baseline_text = (
            f"the {ARCHITECTURES[baseline.model_type][0]} given with `--baseline` (hidden size "
            f"{baseline.hidden_size}, {baseline.num_hidden_layers} layers)."
        )
    name, description = ARCHITECTURES[config.model_type]
    repo_id = repo_id or f"your-org/{folder.resolve().name}"
    model_name = repo_id.split("/")[-1]
    tags = [config.model_type, "shapeformers", "custom_code"]
    tags += [tag for tag in previous.tags or [] if tag not in tags]

    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        license=license or previous.license or DEFAULT_LICENSE,
        tags=tags,
        base_model=base_model if on_hub else None,  # the Hub rejects what is not a repo id (a local path)
        language=previous.language,
        datasets=previous.datasets,
        model_name=model_name if eval_results else None,  # the model-index's name
        eval_results=eval_results or None,
    )
    pictures = draw_pictures(config, baseline, folder)
    card = ModelCard.from_template(
        card_data,
        template_path=str(template),
        model_name=model_name,
        repo_id=repo_id,
        architecture_name=name,
        architecture_description=description,
        model_class=config.architectures[0] if config.architectures else f"{name}ForCausalLM",
        base_models=[base_model] if isinstance(base_model, str) else base_model or [],
        base_model_on_hub=on_hub,
        architecture_table=architecture_table(config),
        baseline_text=baseline_text,
        cost_table=cost_table(config, baseline),
        pictures=[(file, PICTURES[key][1]) for key, file in pictures.items()],
        results_table=evaluation,
        sequence_length=min(CARD_SEQUENCE_LENGTH, config.max_position_embeddings),
    )
    return card, pictures


def write_card(folder, **options):
    """Render the card (see `render_card`) and write it to `folder`/README.md; return the paths written."""
    card, pictures = render_card(folder, **options)
    atomic_write_text(Path(folder) / "README.md", str(card))
    return [str(Path(folder) / "README.md")] + [str(Path(folder) / file) for file in pictures.values()]


# Checking a folder before it goes out

# Runs in a fresh interpreter in which `import shapeformers` fails, as on a machine that only has transformers.
CHECK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["shapeformers"] = None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = sys.argv[1]
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    if not type(model).__module__.startswith("transformers_modules"):
        sys.exit(f"the model did not load from its own code but from {type(model).__module__}")
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    generation_config = GenerationConfig.from_pretrained(folder)
    inputs = tokenizer("The", return_tensors="pt")
    with torch.no_grad():
        tokens = model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, do_sample=False)
    print(json.dumps({
        "model_class": type(model).__name__,
        "tokenizer_class": type(tokenizer).__name__,
        "generation_config": generation_config.to_diff_dict(),
        "generated": tokenizer.decode(tokens[0]),
    }))
    """
)


def inspect_folder(folder):
    """(problems, warnings) found in `folder` without running anything: lists of messages. A problem stops
    publishing; a warning is something Hub users of some transformers versions will trip over."""
    from huggingface_hub import ModelCard

    folder = Path(folder)
    problems, warnings = [], []
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        return [f"config.json: cannot read it ({error})"], warnings
    auto_map = config.get("auto_map", {})
    for auto_class in ("AutoConfig", "AutoModelForCausalLM"):
        if auto_class not in auto_map:
            problems.append(f"config.json: auto_map has no {auto_class}; save the model with save_pretrained")
        elif not (folder / (auto_map[auto_class].split(".")[0].split("--")[-1] + ".py")).is_file():
            problems.append(f"config.json: auto_map's {auto_class} names a file that is not in the folder")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
        problems.append("no weights (model.safetensors)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        problems.append("no tokenizer (tokenizer.json): save one beside the model with tokenizer.save_pretrained")
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        settings = json.loads(tokenizer_config.read_text())
        tokenizer_class = settings.get("tokenizer_class")
        if tokenizer_class in (None, "TokenizersBackend"):
            problems.append(
                f"tokenizer_config.json: tokenizer_class {tokenizer_class!r} does not load on transformers 4.x; "
                'set it to "PreTrainedTokenizerFast" (shapeformers.training.data.save_tokenizer does)'
            )
        if tokenizer_class == "PreTrainedTokenizerFast" and "model_input_names" not in settings:
            warnings.append(
                "tokenizer_config.json: no model_input_names, so on transformers 4.x the tokenizer also returns "
                "token_type_ids, which generate(**tokenizer(text)) rejects; add "
                '"model_input_names": ["input_ids", "attention_mask"]'
            )
    else:
        problems.append("no tokenizer_config.json")
    if not (folder / "generation_config.json").is_file():
        problems.append("no generation_config.json: save it with model.generation_config.save_pretrained(folder)")
    if not (folder / "README.md").is_file():
        problems.append("no model card (README.md): write one with `shapeformers card`")
    else:
        data = ModelCard.load(folder / "README.md", ignore_metadata_errors=True).data
        for key, expected in (("library_name", "transformers"), ("pipeline_tag", "text-generation")):
            if getattr(data, key, None) != expected:
                problems.append(f"README.md: metadata {key} is {getattr(data, key, None)!r}, not {expected!r}")
    return problems, warnings


def check_folder(folder, timeout=CHECK_TIMEOUT_S):
    """Check `folder` as a Hub user will meet it; raise PublishError saying what is wrong, else return the warnings
    and what the clean interpreter saw (model and tokenizer classes, generation config, a two-token generation)."""
    folder = Path(folder).resolve()
    problems, warnings = inspect_folder(folder)
    if problems:
        raise PublishError(f"{folder} is not ready to publish:\n  - " + "\n  - ".join(problems))
    with tempfile.TemporaryDirectory(prefix="shapeformers-check-") as scratch:
        # Its own module cache, so that code cached from an earlier version of the folder cannot hide a broken one.
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(Path(scratch) / "modules"))
        try:
            result = subprocess.run(
                [sys.executable, "-c", CHECK_SCRIPT, str(folder)],
                cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise PublishError(f"loading {folder} through its remote code took over {timeout} s") from None
    if result.returncode != 0:
        raise PublishError(
            f"{folder} does not load through its remote code in a Python without shapeformers "
            f"(transformers, trust_remote_code=True):\n{result.stderr.strip()[-3000:]}"
        )
    return {"warnings": warnings, **json.loads(result.stdout.strip().splitlines()[-1])}


# Uploading


def files_to_upload(folder):
    """The files `upload_folder` will send, as paths relative to `folder`, filtered as it filters them."""
    from huggingface_hub.utils import filter_repo_objects

    folder = Path(folder)
    paths = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
    return list(filter_repo_objects(paths, ignore_patterns=IGNORE_PATTERNS))


def _network_errors():
    """Exception classes that mean "the Hub could not be reached", whichever HTTP library huggingface_hub uses."""
    import importlib

    errors = [ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"),
                         ("requests", "ConnectionError"), ("requests", "Timeout")):  # fmt: skip
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def upload(folder, repo_id, private=False, commit_message=None, token=None):
    """Create `repo_id` (if needed) and upload `folder` to it with huggingface_hub; return the commit URL. Raises
    PublishError, having uploaded nothing, when the Hub cannot be reached or refuses."""
    from huggingface_hub import HfApi, constants, get_token
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if getattr(constants, "is_offline_mode", lambda: constants.HF_HUB_OFFLINE)():
        raise PublishError("offline mode is on (HF_HUB_OFFLINE is set): nothing was uploaded")
    if token is None and get_token() is None:
        raise PublishError("not logged in to the Hugging Face Hub: run `hf auth login` or set HF_TOKEN")
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            commit_message=commit_message or f"Upload {Path(folder).resolve().name} with shapeformers publish",
            ignore_patterns=IGNORE_PATTERNS,
        )
    except OfflineModeIsEnabled:
        raise PublishError("offline mode is on (HF_HUB_OFFLINE is set): nothing was uploaded") from None
    except _network_errors() as error:
        raise PublishError(
            f"cannot reach the Hugging Face Hub at {api.endpoint} ({type(error).__name__}: {error}); "
            "check the network connection: nothing was uploaded"
        ) from None
    except (HfHubHTTPError, ValueError) as error:  # ValueError: the Hub found the card's metadata invalid
        raise PublishError(f"the Hub refused the upload to {repo_id}: {error}") from None
    return getattr(commit, "commit_url", str(commit))


def publish(folder, repo_id, private=False, dry_run=False, write_new_card=True, commit_message=None, token=None,
            **card_options):  # fmt: skip
    """Write the card (unless `write_new_card` is False), check the folder, and upload it to `repo_id`
    (unless `dry_run`). Returns a report (a dict)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    folder = Path(folder)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise PublishError(f"--repo-id {repo_id!r} is not a valid repository id ({error})") from None
    if not folder.is_dir():
        raise PublishError(f"{folder} is not a folder")
    card = write_card(folder, repo_id=repo_id, **card_options) if write_new_card else None
    check = check_folder(folder)
    files = files_to_upload(folder)
    report = {
        "repo_id": repo_id,
        "private": private,
        "card": card,
        "check": check,
        "files": files,
        "bytes": sum((folder / name).stat().st_size for name in files),
        "dry_run": dry_run,
    }
    if not dry_run:
        report["commit_url"] = upload(folder, repo_id, private, commit_message, token)
    return report


# Command-line entry points (argument definitions are in cli.py)


def _card_options(args):
    return dict(results=args.results, base_model=args.base_model, license=args.license, baseline=args.baseline)


def card_command(args):
    try:
        paths = write_card(args.model_dir, repo_id=args.repo_id, **_card_options(args))
    except PublishError as error:
        sys.exit(f"shapeformers card: error: {error}")
    print(json.dumps({"written": paths}, indent=2))


def publish_command(args):
    try:
        report = publish(
            args.model_dir, args.repo_id, private=args.private, dry_run=args.dry_run,
            write_new_card=not args.keep_card, commit_message=args.commit_message, **_card_options(args),
        )  # fmt: skip
    except PublishError as error:
        sys.exit(f"shapeformers publish: error: {error}")
    for warning in report["check"]["warnings"]:
        print(f"shapeformers publish: warning: {warning}", file=sys.stderr)
    print(json.dumps(report, indent=2))
