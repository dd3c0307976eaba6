from .configuration_bowtieformer import BowtieFormerConfig
from .configuration_hourglass_llama import HourglassLlamaConfig
from .presets import (
    BOWTIEFORMER_PRESETS,
    HOURGLASS_LLAMA_PRESETS,
    bowtieformer_preset,
    hourglass_llama_preset,
    match_bottleneck_width,
)

__all__ = [
    "BOWTIEFORMER_PRESETS",
    "BowtieFormerConfig",
    "HOURGLASS_LLAMA_PRESETS",
    "HourglassLlamaConfig",
    "bowtieformer_preset",
    "hourglass_llama_preset",
    "match_bottleneck_width",
]
