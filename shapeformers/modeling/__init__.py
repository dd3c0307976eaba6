from .modeling_bowtieformer import BowtieFormerForCausalLM, BowtieFormerModel, BowtieFormerPreTrainedModel
from .modeling_hourglass_llama import (
    HourglassLlamaForCausalLM,
    HourglassLlamaForSequenceClassification,
    HourglassLlamaModel,
    HourglassLlamaPreTrainedModel,
)
from .variable_width_cache import VariableWidthCache

__all__ = [
    "BowtieFormerForCausalLM",
    "BowtieFormerModel",
    "BowtieFormerPreTrainedModel",
    "HourglassLlamaForCausalLM",
    "HourglassLlamaForSequenceClassification",
    "HourglassLlamaModel",
    "HourglassLlamaPreTrainedModel",
    "VariableWidthCache",
]
