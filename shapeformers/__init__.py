"""shapeformers: HourglassLlama and BowtieFormer as first-class Hugging Face transformers models.

Importing the package registers every model type with transformers' Auto classes, so saved folders load with
`AutoModelForCausalLM.from_pretrained(path)` without `trust_remote_code` (which works too, from the code each
saved folder carries).
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .configuration import (
    BOWTIEFORMER_PRESETS,
    HOURGLASS_LLAMA_PRESETS,
    BowtieFormerConfig,
    HourglassLlamaConfig,
    bowtieformer_preset,
    hourglass_llama_preset,
    match_bottleneck_width,
)
from .modeling import (
    BowtieFormerForCausalLM,
    BowtieFormerForSequenceClassification,
    BowtieFormerModel,
    BowtieFormerPreTrainedModel,
    HourglassLlamaForCausalLM,
    HourglassLlamaForSequenceClassification,
    HourglassLlamaModel,
    HourglassLlamaPreTrainedModel,
    VariableWidthCache,
)

__version__ = "0.1.0"

AutoConfig.register(BowtieFormerConfig.model_type, BowtieFormerConfig, exist_ok=True)
AutoModel.register(BowtieFormerConfig, BowtieFormerModel, exist_ok=True)
AutoModelForCausalLM.register(BowtieFormerConfig, BowtieFormerForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(BowtieFormerConfig, BowtieFormerForSequenceClassification, exist_ok=True)
AutoConfig.register(HourglassLlamaConfig.model_type, HourglassLlamaConfig, exist_ok=True)
AutoModel.register(HourglassLlamaConfig, HourglassLlamaModel, exist_ok=True)
AutoModelForCausalLM.register(HourglassLlamaConfig, HourglassLlamaForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(HourglassLlamaConfig, HourglassLlamaForSequenceClassification, exist_ok=True)

__all__ = [
    "BOWTIEFORMER_PRESETS",
    "BowtieFormerConfig",
    "BowtieFormerForCausalLM",
    "BowtieFormerForSequenceClassification",
    "BowtieFormerModel",
    "BowtieFormerPreTrainedModel",
    "HOURGLASS_LLAMA_PRESETS",
    "HourglassLlamaConfig",
    "HourglassLlamaForCausalLM",
    "HourglassLlamaForSequenceClassification",
    "HourglassLlamaModel",
    "HourglassLlamaPreTrainedModel",
    "VariableWidthCache",
    "bowtieformer_preset",
    "hourglass_llama_preset",
    "match_bottleneck_width",
]
