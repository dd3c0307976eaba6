import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models run fastest on one thread, and a busy machine's cores do not slow them down 10x by oversubscription.
# Subprocesses inherit it, so logits computed there match this process's bit for bit.
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

import shapeformers  # noqa: E402

torch.set_num_threads(1)

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def tiny_hourglass_config(**overrides):
    """K = 3 unequal sub-MLPs, QK-norm, GQA and a head_dim unrelated to hidden_size / heads."""
    fields = dict(
        vocab_size=97,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=10,
        num_mlp_layers=3,
        mlp_intermediate_sizes=[24, 40, 16],
        qk_norm=True,
        max_position_embeddings=128,
        rope_theta=1000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    fields.update(overrides)
    return shapeformers.HourglassLlamaConfig(**fields)


def perturb_norms(model, seed=0):
    """Norm weights start at 1; give them other values so that tests see them."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def compiled_copy(model):
    """A copy of `model` whose forward is captured whole by torch.compile, and the backend that counts the graphs.

    A full-graph capture with a static cache is what breaks when shapes or Python state leak into the graph;
    aot_eager checks the capture without minutes of CPU compilation."""
    from torch._dynamo.testing import CompileCounterWithBackend

    compiled = type(model)(model.config).eval()
    compiled.load_state_dict(model.state_dict())
    backend = CompileCounterWithBackend("aot_eager")
    compiled.forward = torch.compile(compiled.forward, backend=backend, fullgraph=True, dynamic=False)
    return compiled, backend


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return perturb_norms(shapeformers.HourglassLlamaForCausalLM(tiny_hourglass_config())).eval()


def pytest_report_header(config):
    import transformers

    return f"transformers {transformers.__version__} from {transformers.__file__}, torch {torch.__version__}"
