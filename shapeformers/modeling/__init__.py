from .modeling_bowtieformer import (
    BowtieFormerForCausalLM,
    BowtieFormerForSequenceClassification,
    BowtieFormerModel,
    BowtieFormerPreTrainedModel,
)
from .modeling_hourglass_llama import (
    HourglassLlamaForCausalLM,
    HourglassLlamaForSequenceClassification,
    HourglassLlamaModel,
    HourglassLlamaPreTrainedModel,
)
from .variable_width_cache import VariableWidthCache

__all__ = [
    "BowtieFormerForCausalLM",
    "BowtieFormerForSequenceClassification",
    "BowtieFormerModel",
    "BowtieFormerPreTrainedModel",
    "HourglassLlamaForCausalLM",
    "HourglassLlamaForSequenceClassification",
    "HourglassLlamaModel",
    "HourglassLlamaPreTrainedModel",
    "VariableWidthCache",
]
