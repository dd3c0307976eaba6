from .modeling_hourglass_llama import (
    HourglassLlamaForCausalLM,
    HourglassLlamaForSequenceClassification,
    HourglassLlamaModel,
    HourglassLlamaPreTrainedModel,
)

__all__ = [
    "HourglassLlamaForCausalLM",
    "HourglassLlamaForSequenceClassification",
    "HourglassLlamaModel",
    "HourglassLlamaPreTrainedModel",
]
