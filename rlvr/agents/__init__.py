"""Agent loops (verl's ``AgentLoopBase`` API): one dataset row -> one trajectory, by a loop of
the user's over the engine. ``loop.py`` holds the API and the registry, ``rollout.py`` runs the
loops of a batch."""

from rlvr.agents.loop import (AGENT_LOOPS, BUILT_IN, AgentLoopBase, AgentLoopOutput, SingleTurnAgentLoop,
                              TokenOutput, load_agent_loop_config, register)
from rlvr.agents import gateway as _gateway  # registers openai_agent  # noqa: E402,F401


def agent_loops_enabled(config) -> bool:
    """Loops of the user's may run: a loop config file, a default loop that is not built in, or a
    loop registered by one of the config's ``custom_modules``."""
    agent = config.actor_rollout_ref.rollout.agent
    return (bool(agent.agent_loop_config_path) or agent.default_agent_loop not in BUILT_IN
            or bool(custom_module_loops(config)))


def custom_module_loops(config) -> list[str]:
    """The loops registered by the config's ``custom_modules`` (files or modules, imported at load)."""
    from pathlib import Path

    from rlvr.registry import import_file

    modules = set()
    for entry in getattr(config, "custom_modules", None) or []:
        if entry.endswith(".py"):
            modules.add(import_file(Path(entry), "rlvr_custom").__name__)  # imported already: its name
        else:
            modules.add(entry)
    return [name for name in AGENT_LOOPS.names()
            if name not in BUILT_IN and getattr(AGENT_LOOPS.get(name), "__module__", None) in modules]


def with_agent_loops(rollout, config, tokenizer, max_response_length: int):
    """``rollout`` behind the agent-loop runner when loops are enabled (``rollout`` itself else)."""
    if not agent_loops_enabled(config):
        return rollout
    from rlvr.agents.rollout import AgentLoopRollout

    load_agent_loop_config(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    engine = getattr(rollout, "engine", rollout)  # under the multi-turn loop: its engine
    return AgentLoopRollout(engine, rollout, config, tokenizer, max_response_length)


def check_agent_names(rows, origins, config, split: str) -> None:
    """Every row's ``agent_name`` names a loop that can run: built in, or registered with agent
    loops enabled. Raises ConfigError naming the row (its file and line, ``origins``)."""
    from rlvr.config import ConfigError

    enabled = agent_loops_enabled(config)
    gateway = config.actor_rollout_ref.rollout.agent.gateway
    for row, origin in zip(rows, origins):
        name = row.get("agent_name")
        if name == "openai_agent" and not (gateway.function or gateway.command):
            raise ConfigError(f"{split}: {origin}: agent_name openai_agent runs your agent: set "
                              "actor_rollout_ref.rollout.agent.gateway.function (file.py:name) or .command")
        if not name or (name in BUILT_IN and (name != "tool_agent" or config.actor_rollout_ref.rollout.multi_turn.enable)):
            continue
        if name == "tool_agent":
            raise ConfigError(f"{split}: {origin}: agent_name tool_agent is the multi-turn tool loop: set "
                              "actor_rollout_ref.rollout.multi_turn.enable=true with its tool_config_path")
        if not enabled or name not in AGENT_LOOPS.names():
            raise ConfigError(f"{split}: {origin}: agent_name {name!r} is not a loop this run can run (registered: "
                              f"{AGENT_LOOPS.names()}); register it with @rlvr.agents.register in a file listed in "
                              "custom_modules, or list it in actor_rollout_ref.rollout.agent.agent_loop_config_path")


__all__ = ["AGENT_LOOPS", "AgentLoopBase", "AgentLoopOutput", "SingleTurnAgentLoop", "TokenOutput", "check_agent_names",
           "agent_loops_enabled", "load_agent_loop_config", "register", "with_agent_loops"]
