"""`rlvr export` of a LoRA checkpoint: the merged folder computes what the policy computed in training
(the model with its adapter), also where the adapter covers a tied embedding or head; `rlvr eval` of
a checkpoint folder scores its policy as of its export. No training: the checkpoints are written as
the actor's worker writes them, the adapter's weights drawn at random."""

import shutil

import pytest
import torch

from rlvr.cli import main
from rlvr.models import load_model, load_tokenizer
from rlvr.models.lora import apply_lora, save_adapter


def lora_checkpoint(tiny_model_dir, folder, targets):
    """A checkpoint's actor/ with an adapter on ``targets`` whose every weight is nonzero (a freshly
    made adapter has B, or an embedding's A, at zero: it would change nothing), and the policy."""
    policy = apply_lora(load_model(tiny_model_dir), 4, 8, targets)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    save_adapter(policy, folder / "actor")
    load_tokenizer(tiny_model_dir).save_pretrained(folder / "actor")
    torch.save({"optimizer": {}}, folder / "actor_state.pt")
    torch.save({"global_step": 1}, folder / "trainer_state.pt")
    return policy.eval()


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["embed_tokens", "q_proj"], ["lm_head", "q_proj"]])
def test_exported_lora_folder_gives_the_policys_logits(tiny_model_dir, tmp_path, targets):
    """The tiny model ties its head to its input embedding. peft adapts the embedding (or the head)
    alone, and the other keeps the base weight; merging wrote the adapted weight into the tensor both
    share, and the exported folder, still tied, used it for both: its logits differed from the
    trained policy's by up to 30 (embed_tokens) and 2.5 (lm_head) on a trained tiny run, with a
    success line."""
    from transformers import AutoModelForCausalLM

    checkpoint = tmp_path / "checkpoints" / "global_step_1"
    policy = lora_checkpoint(tiny_model_dir, checkpoint, targets)
    assert main(["export", str(checkpoint), str(tmp_path / "out")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.tensor([[5, 17, 300, 42, 7, 5]])
    with torch.no_grad():
        expected = policy(input_ids=ids).logits
        base = load_model(tiny_model_dir)(input_ids=ids).logits
        assert (expected - base).abs().max() > 1e-2  # the adapter changes the function: the check can fail
        assert (exported(input_ids=ids).logits - expected).abs().max() < 1e-4


def test_eval_of_a_checkpoint_folder_scores_its_policy_as_its_export(tiny_model_dir, tiny_data, tmp_path, capsys):
    """A checkpoints/global_step_<k> folder holds the policy in actor/: eval refused it ("has no
    config.json; point model.path at ..."), naming a key eval does not have."""
    checkpoint = tmp_path / "checkpoints" / "global_step_1"
    shutil.copytree(tiny_model_dir, checkpoint / "actor")
    torch.save({"optimizer": {}}, checkpoint / "actor_state.pt")
    torch.save({"global_step": 1}, checkpoint / "trainer_state.pt")
    assert main(["export", str(checkpoint), str(tmp_path / "out")]) == 0
    scores = []
    for model in (checkpoint, tmp_path / "out"):
        assert main(["eval", "--model", str(model), "--data", str(tiny_data["test"]),
                     "--max-response-length", "4"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        scores.append(out.split(":\n", 1)[1])  # the metric lines, after "<model> on <data> (...):"
    assert "mean@1" in scores[0] and scores[0] == scores[1]
