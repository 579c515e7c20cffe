"""Agents the gateway tests run: they call the training gateway with the openai client (PyPI)."""

import asyncio

import httpx
import openai

SEEN: dict[str, list] = {}  # api key -> each call's (prompt_token_ids, token_ids), as the responses carried them


async def two_chats(base_url, api_key, row):
    """Ask, reply "Again?", ask again; reward: the first answer starts with a space."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(row["raw_prompt"])
    calls = SEEN.setdefault(api_key, [])
    first = await client.chat.completions.create(model="rlvr-policy", messages=messages, max_tokens=6, temperature=0.3)
    calls.append((first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]))
    text = first.choices[0].message.content
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Again?"}]
    second = await client.chat.completions.create(model="rlvr-policy", messages=messages, max_tokens=6)
    calls.append((second.model_extra["prompt_token_ids"], second.choices[0].model_extra["token_ids"]))
    return float(text.startswith(" "))


async def _rewrite(base_url, api_key, row) -> str:
    """Ask, then ask again with its first answer replaced by a summary (a context break); the
    second answer's text."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(row["raw_prompt"])
    calls = SEEN.setdefault(api_key, [])
    first = await client.chat.completions.create(model="rlvr-policy", messages=messages, max_tokens=4)
    calls.append((first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]))
    messages += [{"role": "assistant", "content": "(summarised)"}, {"role": "user", "content": "Go on."}]
    second = await client.chat.completions.create(model="rlvr-policy", messages=messages, max_tokens=4)
    calls.append((second.model_extra["prompt_token_ids"], second.choices[0].model_extra["token_ids"]))
    return second.choices[0].message.content


async def rewrites(base_url, api_key, row):
    """A context break; reward: the answer after the rewrite starts with a space."""
    return float((await _rewrite(base_url, api_key, row)).startswith(" "))


async def rewrites_unscored(base_url, api_key, row):
    """A context break; the reward function scores the episode."""
    await _rewrite(base_url, api_key, row)


async def raises(base_url, api_key, row):
    raise RuntimeError("the agent's environment is down")


async def hangs(base_url, api_key, row):
    await asyncio.sleep(60)


async def too_many_calls(base_url, api_key, row):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    for _ in range(5):
        await client.completions.create(model="rlvr-policy", prompt="1 + 1 =", max_tokens=2)
    return 1.0


async def returns_text(base_url, api_key, row):
    return "great"


async def wrong_key(base_url, api_key, row):
    """Another key than its own: 401, whatever it tries (a made-up key, none)."""
    async with httpx.AsyncClient() as client:
        for headers in ({"Authorization": "Bearer " + "0" * 32}, {}):
            answer = await client.post(f"{base_url}/completions", headers=headers,
                                       json={"model": "rlvr-policy", "prompt": "hi", "max_tokens": 2})
            assert answer.status_code == 401, answer.text
    return 0.5


STOPPED: list[tuple] = []  # each call's (finish reason, stop reason, text, token ids); streamed calls too
STOPS = ["e", "a", "o", " "]


async def stops(base_url, api_key, row):
    """Calls that end on a stop string the random model soon writes (finish reason "stop"): a chat
    call, a completion, and a streamed chat call."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    answer = await client.chat.completions.create(model="rlvr-policy", messages=list(row["raw_prompt"]),
                                                  max_tokens=16, stop=STOPS)
    one = answer.choices[0]
    STOPPED.append((one.finish_reason, one.model_extra["stop_reason"], one.message.content, one.model_extra["token_ids"]))
    answer = await client.completions.create(model="rlvr-policy", prompt="Hello there", max_tokens=16, stop=STOPS)
    one = answer.choices[0]
    STOPPED.append((one.finish_reason, one.model_extra["stop_reason"], one.text, one.model_extra["token_ids"]))
    text, ids, finish, reason = "", [], None, None
    async for chunk in await client.chat.completions.create(model="rlvr-policy", messages=list(row["raw_prompt"]),
                                                            max_tokens=16, stop=STOPS, stream=True):
        for one in chunk.choices:
            text += one.delta.content or ""
            ids += (one.model_extra or {}).get("token_ids") or []
            finish, reason = one.finish_reason or finish, (one.model_extra or {}).get("stop_reason") or reason
    STOPPED.append((finish, reason, text, ids))
    return 1.0


async def trims(base_url, api_key, row):
    """Ask, then ask again with its first answer cut to its first two characters (the agent's own
    edit of the model's turn: a context break, not the whole answer put back)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(row["raw_prompt"])
    calls = SEEN.setdefault(api_key, [])
    first = await client.chat.completions.create(model="rlvr-policy", messages=messages, max_tokens=6)
    calls.append((first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"], messages))
    messages = messages + [{"role": "assistant", "content": first.choices[0].message.content.strip()[:2]},
                           {"role": "user", "content": "Again?"}]
    second = await client.chat.completions.create(model="rlvr-policy", messages=messages, max_tokens=6)
    calls.append((second.model_extra["prompt_token_ids"], second.choices[0].model_extra["token_ids"], messages))
    return 1.0
