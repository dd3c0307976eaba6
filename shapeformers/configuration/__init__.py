from .configuration_hourglass_llama import HourglassLlamaConfig
from .presets import HOURGLASS_LLAMA_PRESETS, hourglass_llama_preset, match_bottleneck_width

__all__ = ["HourglassLlamaConfig", "HOURGLASS_LLAMA_PRESETS", "hourglass_llama_preset", "match_bottleneck_width"]
