"""Shared fixtures: the built-in model's converted folder and a tiny model with its tokenizer."""

import signal

import pytest

from rlvr.models import load_tokenizer, model_folder, save_tiny_model


@pytest.fixture(scope="session")
def builtin_dir():
    """The built-in SmolLM2 as a safetensors folder (converted from GGUF on first use)."""
    return model_folder("builtin")


@pytest.fixture(scope="session")
def tokenizer(builtin_dir):
    return load_tokenizer(builtin_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, builtin_dir):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer_path=str(builtin_dir))


CUSTOM_ALGOS = """
import torch
from rlvr.algos import agg_loss, register_adv_est, register_policy_loss

@register_adv_est("test_sign_adv")
def sign_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None):
    adv = torch.sign(token_level_rewards.sum(-1) - 0.5).unsqueeze(-1) * response_mask
    return adv, adv

@register_policy_loss("test_verl_signature")
def verl_style_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                    rollout_is_weights=None):
    # as verl's losses read their config and return (loss, metrics)
    assert config.get("clip_ratio_c", 3.0) == 3.0 and config.get("no_such_key", "default") == "default"
    loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode)
    return loss, {"actor/pg_clipfrac": 0.0}
"""


@pytest.fixture(scope="session")
def custom_algos_file(tmp_path_factory):
    """A user's file with an advantage estimator and a policy loss written with verl's signatures."""
    path = tmp_path_factory.mktemp("custom") / "mine.py"
    path.write_text(CUSTOM_ALGOS)
    return path


class _TeacherForcedEngine:
    """A NativeRollout whose turns can be scripted: ``script(context_text) -> text or None``.
    A scripted turn returns the script's tokens (cut to the request's budget) with the model's
    own log-probs of them (teacher forcing); other turns are sampled by the real engine. Tests
    use it to put exact tool calls in a random tiny model's trajectories."""

    script = staticmethod(lambda context: None)

    @classmethod
    def make(cls, script, base=None):
        import torch

        from rlvr.rollout import Completion, NativeRollout

        class Engine(base or NativeRollout):
            def generate(self, prompts, params, groups=None, max_new_tokens=None):
                budgets = list(max_new_tokens) if max_new_tokens is not None else [params.max_new_tokens] * len(prompts)
                out = super().generate(prompts, params, groups, max_new_tokens)
                return [self.scripted(p, params, b, c) for p, b, c in zip(prompts, budgets, out)]

            def scripted(self, prompt, params, budget, completion):
                text = script(self.tokenizer.decode(prompt))
                if text is None:
                    return completion
                ids = self.tokenizer.encode(text, add_special_tokens=False)[:budget]
                model = getattr(self, "policy", None) or self.model  # vllm's policy, the native engine's model
                with torch.no_grad():
                    logits = model(torch.tensor([list(prompt) + ids])).logits[0, len(prompt) - 1:-1].float()
                logp = torch.log_softmax(logits / params.temperature, -1).gather(-1, torch.tensor(ids)[:, None])
                full = len(self.tokenizer.encode(text, add_special_tokens=False))
                return Completion(ids, logp.squeeze(-1).tolist(), "stop" if len(ids) == full else "length")

        if hasattr(Engine, "session"):  # the per-request schedule's requests are scripted too
            def session(self):
                engine, real = self, NativeRollout.session(self)

                class Scripted:
                    def __getattr__(self, name):
                        return getattr(real, name)

                    async def generate(self, prompt, params, **where):
                        completion = await real.generate(prompt, params, **where)
                        return engine.scripted(prompt, params, params.max_new_tokens, completion)

                return Scripted()

            Engine.session = session

        return Engine


@pytest.fixture
def scripted_engine(monkeypatch):
    """``(script, name="native")``: the engine registered as ``name`` replaced, for this test, by
    its teacher-forced subclass (``build_rollout`` then builds it wherever the config names it)."""
    from rlvr.rollout.base import ROLLOUTS

    def install(script, name="native"):
        engine = _TeacherForcedEngine.make(script, ROLLOUTS.get(name))
        monkeypatch.setitem(ROLLOUTS._entries, name, engine)
        return engine

    return install


@pytest.fixture(scope="session")
def tiny_vllm_model_dir(tmp_path_factory, builtin_dir):
    """The tiny model with 64-wide attention heads (vLLM's CPU attention has no kernel for 16)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-vllm"), tokenizer_path=str(builtin_dir), head_dim=64)


@pytest.fixture(scope="session")
def teacher_forced_engine():
    """``script -> engine class`` (see _TeacherForcedEngine)."""
    return _TeacherForcedEngine.make


@pytest.fixture(scope="session")
def tiny_moe_model_dir(tmp_path_factory, builtin_dir):
    """A tiny Qwen3-MoE folder (``make_tiny_moe``), saved by transformers: experts stored per expert."""
    from rlvr.models.tiny import make_tiny_moe

    out = tmp_path_factory.mktemp("tiny-moe")
    tokenizer = load_tokenizer(builtin_dir)
    make_tiny_moe(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt during the test, in this process and in the processes it
    starts, as in a terminal: a shell that starts pytest in the background (``make test &``) hands
    it SIGINT ignored, and the tests that press Ctrl-C would then wait on a signal never seen."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
