"""The teachers of on-policy distillation (``distillation.*``): frozen models that score every
token the student sampled.

Each teacher is a frozen model in the actor's worker, built like the reference (a copy on the
actor's device; with FSDP2, sharded over the same ranks with its weights read once on rank 0)
and run through the same prompt-once forward. For each sampled token it gives its log-prob
(``teacher_log_prob``, (bs, R)) and, for the top-k loss modes, its ``topk`` largest log-probs and
their token ids (``teacher_topk_log_probs`` / ``teacher_topk_ids``, (bs, R, k)), at temperature 1
as verl's teacher servers score. Several teachers (verl's MOPD) each score the rows whose
``distillation.teacher_key`` column names their ``key``.

A teacher can also be served (``ServedTeacher``): servers that already hold it score each row's
prompt and response as one prompt (SGLang's prompt log-probs, which ``rlvr serve`` answers, or
vLLM's ``prompt_logprobs``).

Departure from verl: verl always serves its teachers, from vLLM or SGLang replicas it starts on a
pool of GPUs of their own (``distillation.n_gpus_per_node``/``nnodes``); here the default teacher
shares the actor's devices, as the reference does, and a served one runs on servers the user starts.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import torch

from rlvr.config import ConfigError
from rlvr.config.schema import DistillationConfig, TeacherModelConfig
from rlvr.config.validate import teacher_entries
from rlvr.protocol import DataProto
from rlvr.algos.distillation import get_distillation_loss
from rlvr.rollout.servers import (LoadBalancer, Replica, ReplicaFailed, SGLangProtocol, VLLMProtocol, read_answer,
                                  wait_healthy)


def check_teacher_tokenizers(config: DistillationConfig, tokenizer, load_tokenizer) -> None:
    """Refuse a teacher whose vocabulary is not the student's: its token ids would name other
    tokens (cross-tokenizer distillation is not supported, as in verl)."""
    student = tokenizer.get_vocab()
    for key, entry in teacher_entries(config).items():
        theirs = load_tokenizer(entry.model_path).get_vocab()
        if theirs == student:
            continue
        differ = sorted(set(theirs.items()) ^ set(student.items()), key=lambda item: item[1])[:3]
        raise ConfigError(
            f"distillation teacher {key!r} ({entry.model_path}) has a vocabulary of {len(theirs)} tokens that is not "
            f"the student's ({len(student)} tokens; they differ at {differ}): on-policy distillation compares the "
            "two models' log-probs of the same token ids, so the teacher must share the student's tokenizer "
            "(cross-tokenizer distillation is not supported)")


class ServedTeacher:
    """A teacher on servers that already hold it (``inference.external_server_addresses``): each row's
    prompt and response go as one prompt whose log-probs the server returns (SGLang's
    ``logprob_start_len`` / ``top_logprobs_num``, which ``rlvr serve`` speaks, or vLLM's
    ``prompt_logprobs``), rows spread over the servers by the rollout's load balancer. The same
    results as ``Actor.compute_log_prob`` (the servers score at temperature 1)."""

    def __init__(self, entry: TeacherModelConfig, timeout: float, start_wait: float, threads: int = 16):
        inference = entry.inference
        headers = {"Authorization": f"Bearer {inference.api_key}"} if inference.api_key else {}
        self.replicas = [Replica(i, address, headers=headers) for i, address in enumerate(inference.external_server_addresses)]
        self.protocol = VLLMProtocol() if inference.name == "vllm" else SGLangProtocol()
        self.balancer, self.timeout, self.threads = LoadBalancer(self.replicas), timeout, threads
        for replica in self.replicas:
            wait_healthy(replica, start_wait)

    def _score(self, ids: list[int], start: int, topk: int):
        """One row on the least-loaded server; a server that fails it (no answer, an error status, an
        answer without the log-probs asked for) leaves the rotation, as a rollout server does, and
        the row goes to the next. None left: ``ServersDown`` naming each one's reason."""
        while True:
            replica = self.balancer.acquire()  # raises ServersDown once every server is out
            try:
                route, body = self.protocol.score(ids, start, topk)
                response = replica.post(route, json=body, timeout=self.timeout)
                if response.status_code != 200:
                    raise ReplicaFailed(f"{replica.name} answered HTTP {response.status_code}: {response.text[:300]}")
                return read_answer(lambda data: self.protocol.parse_score(data, ids, start, topk, replica),
                                   response, replica, route)
            except (httpx.HTTPError, ReplicaFailed) as err:
                replica.down = f"the distillation teacher's {replica.name}: {err}"
            finally:
                self.balancer.release(replica)

    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False, topk: int = 0, extra: bool = False):
        b = data.batch
        R = b["responses"].shape[1]
        P = b["input_ids"].shape[1] - R
        log_probs = torch.zeros(b["responses"].shape)
        tops = {"topk_log_probs": torch.zeros((*log_probs.shape, topk)),
                "topk_ids": torch.zeros((*log_probs.shape, topk), dtype=torch.long)} if topk else {}
        rows = []
        for i in range(len(data)):
            prompt = b["input_ids"][i, :P][b["attention_mask"][i, :P].bool()].tolist()
            length = int(b["attention_mask"][i, P:].sum())
            rows.append((prompt + b["responses"][i, :length].tolist(), len(prompt), length))
        with ThreadPoolExecutor(self.threads) as pool:
            scored = list(pool.map(lambda row: self._score(row[0], row[1], topk), rows))
        for i, ((_, _, length), (token, values, ids)) in enumerate(zip(rows, scored)):
            log_probs[i, :length] = torch.tensor(token)
            if topk:
                tops["topk_log_probs"][i, :length] = torch.tensor(values)
                tops["topk_ids"][i, :length] = torch.tensor(ids)
        return (log_probs, None, tops) if extra else (log_probs, None)


class Teachers:
    """The teachers by routing key, each an ``Actor`` over a frozen model (its log-prob pass only)."""

    def __init__(self, actors: dict, config: DistillationConfig):
        self.actors, self.config = actors, config
        self.topk = config.distillation_loss.topk if get_distillation_loss(config.distillation_loss.loss_mode).use_topk else 0

    def route(self, data: DataProto) -> dict[str, list[int]]:
        """Row indices of each teacher's rows."""
        if len(self.actors) == 1:
            return {next(iter(self.actors)): list(range(len(data)))}
        column = self.config.teacher_key
        if column not in data.non_tensor_batch:
            raise ConfigError(f"distillation has {len(self.actors)} teachers, routed by the column "
                              f"distillation.teacher_key={column!r}, which the batch does not have; add it to the "
                              f"dataset rows or name another column (the batch has {sorted(data.non_tensor_batch)})")
        values = data.non_tensor_batch[column]
        rows: dict[str, list[int]] = {key: [] for key in self.actors}
        for i, value in enumerate(values):
            value = value.item() if isinstance(value, np.generic) else value
            if value not in rows:
                raise ConfigError(f"row {i}: its {column!r} is {value!r}, which no distillation teacher has as key "
                                  f"(distillation.teacher_models.<name>.key: {sorted(self.actors)})")
            rows[value].append(i)
        return rows

    def compute(self, data: DataProto, world_size: int = 1) -> DataProto:
        """``teacher_log_prob`` (bs, R), and with a top-k mode ``teacher_topk_log_probs`` and
        ``teacher_topk_ids`` (bs, R, k), of the responses in ``data``. Several ranks: every rank
        runs every teacher (a rank without rows for one runs a row and discards it), as the
        sharded forwards' collectives need."""
        shape = data.batch["responses"].shape
        out = {"teacher_log_prob": torch.zeros(shape)}
        if self.topk:
            out["teacher_topk_log_probs"] = torch.zeros((*shape, self.topk))
            out["teacher_topk_ids"] = torch.zeros((*shape, self.topk), dtype=torch.long)
        for key, rows in self.route(data).items():
            if not rows and world_size == 1:
                continue
            part = data.select_idxs(np.array(rows or [0]))
            part.meta_info = {**data.meta_info, "temperature": 1.0}  # the teacher's own distribution, as verl scores
            log_probs, _, extra = self.actors[key].compute_log_prob(part, topk=self.topk, extra=True)
            if not rows:
                continue
            idx = torch.tensor(rows)
            out["teacher_log_prob"][idx] = log_probs
            if self.topk:
                out["teacher_topk_log_probs"][idx] = extra["topk_log_probs"]
                out["teacher_topk_ids"][idx] = extra["topk_ids"]
        return DataProto.from_dict(out)


def screen_teacher_log_probs(batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
    """The rows whose teacher log-probs are all finite on their response tokens (bool (bs,)), with
    the non-finite values in ``batch`` replaced by finite ones (a left-out row must not turn the
    loss into NaN through 0 x NaN), and the teacher's metrics: its mean log-prob of the sampled
    tokens, the share of those tokens inside its top-k (top-k modes), and the rows left out."""
    b = batch.batch
    mask = b["response_mask"].bool()  # (bs, R)
    bad = ~torch.isfinite(b["teacher_log_prob"]) & mask
    if "teacher_topk_log_probs" in b.keys():
        tops = b["teacher_topk_log_probs"]  # (bs, R, k); -inf is a token the teacher rules out: weight 0
        bad |= (torch.isnan(tops) | torch.isposinf(tops)).any(-1) & mask
        b["teacher_topk_log_probs"] = torch.nan_to_num(tops, nan=0.0, posinf=0.0, neginf=-1e4)
    keep = ~bad.any(-1)  # (bs,)
    b["teacher_log_prob"] = torch.nan_to_num(b["teacher_log_prob"], nan=0.0, posinf=0.0, neginf=0.0)
    counted = mask & keep[:, None]
    n = counted.sum().clamp(min=1)
    metrics = {"distillation/teacher_log_prob": float((b["teacher_log_prob"] * counted).sum() / n),
               "distillation/nonfinite_samples": float((~keep).sum())}
    if "teacher_topk_ids" in b.keys():
        inside = (b["teacher_topk_ids"] == b["responses"].unsqueeze(-1)).any(-1)  # (bs, R)
        metrics["distillation/sampled_in_topk"] = float((inside & counted).sum() / n)
    return keep, metrics
