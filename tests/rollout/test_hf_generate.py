import torch

from rlvr.config.schema import RolloutConfig
from rlvr.data import left_pad
from rlvr.models import load_model, load_tokenizer
from rlvr.protocol import DataProto
from rlvr.rollout import GenerateRollout, response_mask_from_eos


def test_response_mask_keeps_first_eos_only():
    responses = torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8], [2, 9, 2, 9]])
    # row 0: EOS at 1 -> mask 1,1,0,0; row 1: no EOS; row 2: EOS first -> only it counts
    assert response_mask_from_eos(responses, [2]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def prompts(tokenizer):
    texts = ["What is 1 + 1?", "Tell me a long story about numbers and their friends."]
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                         tokenize=False) for t in texts]
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in ids]
    input_ids, mask, pos = left_pad(ids, tokenizer.pad_token_id)
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos})


def test_generate_sequences_shapes_masks_and_log_probs(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    rollout = GenerateRollout(model, tokenizer, RolloutConfig(temperature=0.7), max_response_length=12)
    batch = prompts(tokenizer)
    batch.meta_info["seed"] = 3
    out = rollout.generate_sequences(batch)
    B, P = batch.batch["input_ids"].shape
    R = out.batch["responses"].shape[1]
    assert R <= 12 and out.batch["input_ids"].shape == (B, P + R)
    assert torch.equal(out.batch["input_ids"][:, :P], batch.batch["input_ids"])
    assert out.batch["attention_mask"].shape == (B, P + R)
    # positions continue after the prompt's last real token
    assert torch.equal(out.batch["position_ids"][:, P], batch.batch["position_ids"][:, -1] + 1)
    # rollout log-probs equal a full forward pass at temperature 0.7 on the response tokens
    with torch.no_grad():
        logits = model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                       position_ids=out.batch["position_ids"]).logits[:, P - 1:-1] / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = out.batch["response_mask"].bool()
    assert torch.allclose(out.batch["rollout_log_probs"][mask], ref[mask], atol=1e-4)
    # same seed, same samples
    again = rollout.generate_sequences(batch)
    assert torch.equal(again.batch["responses"], out.batch["responses"])


def test_greedy_override_from_meta_info(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    rollout = GenerateRollout(model, tokenizer, RolloutConfig(), max_response_length=6)
    batch = prompts(tokenizer)
    batch.meta_info.update(do_sample=False)
    out = rollout.generate_sequences(batch)
    expected = model.generate(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                              max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(out.batch["input_ids"], expected)
    assert out.meta_info["sampling"]["do_sample"] is False
