"""Generation with K > 1, unequal sub-MLP widths, QK-norm, GQA and a free head_dim: every cache path gives the
tokens the uncached model gives."""

import pytest
import torch

from shapeformers import HourglassLlamaForCausalLM, HourglassLlamaForSequenceClassification
from shapeformers.modeling.compat import model_output_cache

from .conftest import compiled_copy, perturb_norms, tiny_hourglass_config

pytestmark = pytest.mark.matrix

PROMPT = torch.tensor([[1, 17, 5, 33, 8, 61, 12]])


def generate(model, prompt=PROMPT, **settings):
    settings.setdefault("max_new_tokens", 16)
    settings.setdefault("min_new_tokens", settings["max_new_tokens"])
    settings.setdefault("attention_mask", torch.ones_like(prompt))
    return model.generate(prompt, pad_token_id=0, **settings)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_greedy_cached_equals_uncached(tiny_model, attn_implementation):
    tiny_model.config._attn_implementation = attn_implementation
    cached = generate(tiny_model, do_sample=False)
    assert torch.equal(cached, generate(tiny_model, do_sample=False, use_cache=False))
    # And the tokens are the argmax of a plain forward over the whole generated sequence (EOS is barred by
    # min_new_tokens).
    with torch.no_grad():
        logits = tiny_model(cached[:, :-1]).logits[:, PROMPT.shape[1] - 1 :]
    logits[..., tiny_model.config.eos_token_id] = float("-inf")
    assert torch.equal(logits.argmax(-1), cached[:, PROMPT.shape[1] :])


def test_static_cache_equals_dynamic(tiny_model):
    dynamic = generate(tiny_model, do_sample=False)
    assert torch.equal(dynamic, generate(tiny_model, do_sample=False, cache_implementation="static"))


def test_compiled_static_decoding_equals_eager(tiny_model):
    expected = generate(tiny_model, do_sample=False, cache_implementation="static")
    compiled, backend = compiled_copy(tiny_model)
    assert torch.equal(generate(compiled, do_sample=False, cache_implementation="static"), expected)
    assert backend.frame_count >= 1  # generate did run the compiled forward


def test_beam_search_cached_equals_uncached(tiny_model):
    settings = dict(do_sample=False, num_beams=3, num_return_sequences=2)
    assert torch.equal(generate(tiny_model, **settings), generate(tiny_model, use_cache=False, **settings))


def test_seeded_sampling_cached_equals_uncached(tiny_model):
    settings = dict(do_sample=True, top_k=20, temperature=1.3)
    torch.manual_seed(123)
    cached = generate(tiny_model, **settings)
    torch.manual_seed(123)
    assert torch.equal(cached, generate(tiny_model, use_cache=False, **settings))


def test_left_padded_batch_equals_each_prompt_alone(tiny_model):
    prompts = [[1, 17, 5, 33, 8, 61, 12], [1, 40, 3], [1, 9, 9, 9, 22]]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batch = generate(tiny_model, input_ids, attention_mask=attention_mask, do_sample=False)
    for row, prompt in enumerate(prompts):
        alone = generate(tiny_model, torch.tensor([prompt]), do_sample=False)
        assert torch.equal(batch[row, width:], alone[0, len(prompt) :])


def test_chunked_and_stepwise_forward_with_cache_equals_full_forward(tiny_model):
    input_ids = torch.randint(3, 97, (2, 12))
    with torch.no_grad():
        full = tiny_model(input_ids).logits
        first = tiny_model(input_ids[:, :7], use_cache=True)
        rest = tiny_model(input_ids[:, 7:], past_key_values=model_output_cache(first))
    assert torch.allclose(torch.cat([first.logits, rest.logits], 1), full, atol=1e-5, rtol=0)


def test_hidden_states_attentions_and_tuple_outputs(tiny_model):
    tiny_model.config._attn_implementation = "eager"
    input_ids = torch.randint(3, 97, (1, 9))
    with torch.no_grad():
        out = tiny_model(input_ids, output_hidden_states=True, output_attentions=True)
        as_tuple = tiny_model(input_ids, return_dict=False, use_cache=False)
    assert len(out.hidden_states) == tiny_model.config.num_hidden_layers + 1
    assert out.attentions[0].shape == (1, 4, 9, 9)
    assert torch.equal(as_tuple[0], out.logits)


def test_loss_and_gradient_checkpointing():
    torch.manual_seed(0)
    model = perturb_norms(HourglassLlamaForCausalLM(tiny_hourglass_config())).train()
    input_ids = torch.randint(3, 97, (2, 10))
    loss = model(input_ids, labels=input_ids).loss
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.gradient_checkpointing_enable()
    checkpointed = model(input_ids, labels=input_ids).loss
    checkpointed.backward()
    assert torch.allclose(loss, checkpointed)
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(grads, model.parameters()))


def test_sequence_classification_scores_the_last_real_token():
    torch.manual_seed(0)
    model = HourglassLlamaForSequenceClassification(tiny_hourglass_config(num_labels=3)).eval()
    padded = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
    with torch.no_grad():
        logits = model(padded, labels=torch.tensor([0, 2])).logits
        alone = model(padded[:1, :3]).logits
    assert logits.shape == (2, 3)
    assert torch.allclose(logits[0], alone[0], atol=1e-5)
