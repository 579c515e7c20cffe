"""Ray worker groups: the single controller's way to many devices (verl's names).

- ``RayResourcePool``: one placement group per node with a bundle per worker process
  (``{"CPU": 1, "GPU": 1}``, or CPU only when the run has no GPUs). The cluster's resources
  are checked first, so a run asking for more than there is fails with the numbers instead
  of waiting forever.
- ``ResourcePoolManager``: the pools by name and which role runs on which (``Role``).
- ``RayClassWithInitArgs``: a worker class and its constructor arguments, created as a
  Ray actor on a given bundle with a given environment.
- ``create_colocated_worker_cls``: one actor class holding several roles (actor-rollout-ref
  and critic), so they share a process, and a device, per rank.
- ``RayWorkerGroup``: the actors of one pool, ranked; each learns its rank, the world size
  and the rendezvous address (127.0.0.1 on one machine) from its environment. A worker
  method called on the group is dispatched by its ``@register`` mode, run on every rank
  (or rank 0), waited for, and collected, as ``LocalWorkerGroup`` does at world size 1.
  A rank that raises or dies stops the call at once with ``WorkerError`` naming the rank,
  and the other ranks (possibly blocked in a collective with the dead one) are killed; the
  driver's own part of a call (splitting the arguments, joining the answers) fails as a
  ``WorkerError`` too, naming the method (and the rank whose answer does not fit), so every
  failure of a call reaches the user as one message with the last checkpoint.

Ray is an optional dependency (``pip install 'rlvr[ray]'``); this module is imported only
when a run uses it.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlvr.data.chat_template import CHAT_DATE_ENV, run_date
from rlvr.distributed.dispatch import Dispatch, Execute, collect, dispatch, pad_groups, registration
from rlvr.distributed.worker import LOOPBACK, Worker, free_port
from rlvr.distributed.worker_group import WORKER_METHODS
from rlvr.protocol import DataProto
from rlvr.errors import StopTraining

PLACEMENT_TIMEOUT_S = 120


class ResourceError(StopTraining):
    """The cluster cannot hold the workers the config asks for."""


class WorkerError(StopTraining):
    """A worker raised or its process died; the message names the rank."""


@dataclass
class RaySession:
    """The Ray ``init_ray`` started or joined. ``temp_dir`` is the folder it made for a local Ray
    (None when it joined a cluster, or ``ray_init._temp_dir`` named one); ``logs_dir`` is
    ``<run dir>/ray``, where that Ray's logs are reachable as ``session_latest/logs``."""

    temp_dir: Path | None = None
    logs_dir: Path | None = None

    def shutdown(self) -> None:
        """Stop the local Ray (or leave the cluster). Its logs move to ``<run dir>/ray`` at the paths
        the link gave them, and its temp folder is removed: this one only, never another run's
        ``rlvr-ray-*``, which may belong to a live run."""
        ray.shutdown(wait_for_processes=True)  # Ray's processes gone before their folder is
        if self.temp_dir is None:
            return
        keep_ray_logs(self.temp_dir, self.logs_dir)
        try:
            shutil.rmtree(self.temp_dir)
        except OSError as err:
            print(f"[rlvr] could not remove Ray's temp folder {self.temp_dir}: {err}", file=sys.stderr, flush=True)
        self.temp_dir = None  # a second shutdown removes nothing


def keep_ray_logs(temp: Path, logs_dir: Path) -> None:
    """Move each Ray session's ``logs`` from ``temp`` to ``logs_dir/<session>/logs`` and point
    ``logs_dir/session_latest`` at the newest: the path that reached the live Ray's logs reaches
    them after it. Earlier runs in the folder (a resume) keep their sessions beside it."""
    latest = logs_dir / "session_latest"
    for session in sorted(temp.glob("session_*")):
        if not session.is_symlink() and (session / "logs").is_dir():
            (logs_dir / session.name).mkdir(parents=True, exist_ok=True)
            shutil.move(session / "logs", logs_dir / session.name / "logs")
    if latest.is_symlink() and (temp / "session_latest").is_symlink():
        latest.unlink()
        latest.symlink_to((temp / "session_latest").resolve().name, target_is_directory=True)
    elif latest.is_symlink() and latest.resolve().is_relative_to(temp.resolve()):
        latest.unlink()  # a Ray that stopped before it made a session: a link to nothing


def link_ray_logs(ray_temp: Path, logs_dir: Path) -> None:
    """``logs_dir/session_latest``: a link to the session folder Ray is about to make in ``ray_temp``."""
    if logs_dir.is_symlink():  # a link to a whole Ray folder, as rlvr made before it kept the logs
        logs_dir.unlink()
    logs_dir.mkdir(parents=True, exist_ok=True)
    latest = logs_dir / "session_latest"
    if latest.is_symlink():
        latest.unlink()
    latest.symlink_to(ray_temp / "session_latest", target_is_directory=True)


def init_ray(address: str | None, num_cpus: int | None, run_dir: Path, runtime_env: dict | None = None,
             kwargs: dict | None = None) -> RaySession | None:
    """Connect to the cluster at ``address``, or start a local Ray bound to 127.0.0.1 whose logs
    are reachable as ``run_dir/ray/session_latest/logs``. Returns the session this call started
    (``shutdown`` ends it, keeps those logs and removes the local Ray's temp folder), or None when
    Ray was already up. ``runtime_env`` and ``kwargs`` (verl's ``ray_kwargs.ray_init``) reach
    ``ray.init`` as given; rlvr's own settings give way to them, except the local Ray's address,
    which stays 127.0.0.1.

    ``address`` None is ray.init's null after the load read ``RAY_ADDRESS`` into it
    (``rlvr.config.loader.resolve_ray_address``): the local Ray is started with ``address="local"``,
    which ray.init never redirects to the cluster of a ``RAY_ADDRESS`` set since."""
    if ray.is_initialized():
        return None
    given = {**(kwargs or {}), **({"runtime_env": runtime_env} if runtime_env else {})}
    if address is not None:
        ray.init(**{"include_dashboard": False, "log_to_driver": True, **given, "address": address})
        return RaySession()
    # a folder named in ray_init is the user's, kept; rlvr's own is short: Ray's socket paths must
    # stay under 108 bytes
    own = None if "_temp_dir" in given else Path(tempfile.mkdtemp(prefix="rlvr-ray-"))
    session = RaySession(own, run_dir / "ray")
    try:
        link_ray_logs(own or Path(given["_temp_dir"]), session.logs_dir)
        # the Ray rlvr starts listens on loopback only, whatever was given: no dashboard, the node on 127.0.0.1
        ray.init(**{"num_cpus": num_cpus, **({"_temp_dir": str(own)} if own else {}), "log_to_driver": True,
                    "configure_logging": False, **given,
                    "address": "local", "_node_ip_address": LOOPBACK, "include_dashboard": False})
    except BaseException:
        session.shutdown()  # a Ray that failed to start leaves no folder in /tmp either
        raise
    return session


class Role(enum.Enum):
    ActorRollout = "actor_rollout"
    Critic = "critic"
    Rollout = "rollout"  # hybrid_engine=false: the rollout's own pool


@dataclass
class RayResourcePool:
    """``process_on_nodes[i]`` worker processes on node i, each with ``cpus_per_process`` CPUs and,
    with ``use_gpu``, one GPU."""

    process_on_nodes: list[int]
    use_gpu: bool = False
    cpus_per_process: int = 1
    name: str = "global_pool"
    placement_groups: list = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def check_resources(self) -> None:
        """Fail with the numbers when the cluster lacks what this pool needs (placement groups
        would wait for it forever)."""
        need_gpu = self.world_size if self.use_gpu else 0
        need_cpu = self.world_size * self.cpus_per_process
        total = ray.cluster_resources()
        have_gpu, have_cpu = int(total.get("GPU", 0)), int(total.get("CPU", 0))
        per_node_gpus = sorted((int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive")),
                               reverse=True)
        # the pool's nodes, largest first, must each fit on a different node of the cluster
        wanted = sorted(self.process_on_nodes, reverse=True)
        nodes_fit = len(per_node_gpus) >= len(wanted) and all(n <= have for n, have in zip(wanted, per_node_gpus))
        problems = []
        if need_gpu > have_gpu:
            problems.append(f"{need_gpu} GPUs (the cluster has {have_gpu})")
        elif self.use_gpu and not nodes_fit:
            problems.append(f"{max(self.process_on_nodes)} GPUs on each of {len(self.process_on_nodes)} nodes "
                            f"(its nodes have {per_node_gpus})")
        if need_cpu > have_cpu:
            problems.append(f"{need_cpu} CPUs (the cluster has {have_cpu})")
        if problems:
            raise ResourceError(
                f"resource pool {self.name!r} needs {' and '.join(problems)} for "
                f"{self.world_size} workers (trainer.n_gpus_per_node x nnodes = {self.process_on_nodes}); lower "
                "trainer.n_gpus_per_node, run CPU workers with trainer.device=cpu, or add nodes to the cluster")

    def get_placement_groups(self) -> list:
        if not self.placement_groups:
            self.check_resources()
            bundle = {"CPU": self.cpus_per_process, **({"GPU": 1} if self.use_gpu else {})}
            for i, n in enumerate(self.process_on_nodes):  # kept one by one: remove() releases those made
                self.placement_groups.append(placement_group([dict(bundle) for _ in range(n)],
                                                             strategy="STRICT_PACK", name=f"rlvr_{self.name}_{i}"))
            ready, _ = ray.wait([pg.ready() for pg in self.placement_groups], num_returns=len(self.placement_groups),
                                timeout=PLACEMENT_TIMEOUT_S)
            if len(ready) < len(self.placement_groups):
                self.remove()
                raise ResourceError(f"resource pool {self.name!r}: Ray could not place {self.process_on_nodes} "
                                    f"workers of {bundle} within {PLACEMENT_TIMEOUT_S} s (other jobs may hold the "
                                    "resources); free them or ask for fewer")
        return self.placement_groups

    def bundles(self) -> list[tuple[Any, int]]:
        """(placement group, bundle index) of each rank, node by node."""
        return [(pg, i) for pg, n in zip(self.get_placement_groups(), self.process_on_nodes) for i in range(n)]

    def remove(self) -> None:
        for pg in self.placement_groups:
            remove_placement_group(pg)
        self.placement_groups = []


@dataclass
class ResourcePoolManager:
    """Named pools (``{"global_pool": [8, 8]}``: 8 processes on each of 2 nodes) and the pool each
    role runs on (roles on the same pool are colocated in one process per rank)."""

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[Role, str]
    use_gpu: bool = False
    pools: dict[str, RayResourcePool] = field(default_factory=dict)

    def create_resource_pools(self) -> None:
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.pools[name] = RayResourcePool(process_on_nodes, self.use_gpu, name=name)
        if len(self.pools) > 1:  # together, too: each pool may fit alone and all of them not
            RayResourcePool([sum(sum(p.process_on_nodes) for p in self.pools.values())], self.use_gpu,
                            name="+".join(self.pools)).check_resources()
        for pool in self.pools.values():
            pool.check_resources()

    def get_resource_pool(self, role: Role) -> RayResourcePool:
        return self.pools[self.mapping[role]]


class RayClassWithInitArgs:
    """A worker class with its constructor arguments, to be created as Ray actors."""

    def __init__(self, cls: type, *args, **kwargs):
        self.cls, self.args, self.kwargs = cls, args, kwargs

    def __call__(self, placement_group, bundle_index: int, env: dict[str, str], num_cpus: float, num_gpus: float):
        options = dict(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env={"env_vars": env},
                       scheduling_strategy=PlacementGroupSchedulingStrategy(
                           placement_group=placement_group, placement_group_bundle_index=bundle_index))
        return ray.remote(self.cls).options(**options).remote(*self.args, **self.kwargs)


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """One actor class that builds every role's worker in its process (``call(role, method, ...)``
    reaches them): actor-rollout-ref and critic share each rank's process and device."""
    roles = {role: (c.cls, c.args, c.kwargs) for role, c in class_dict.items()}

    class WorkerDict(Worker):
        def __init__(self):
            super().__init__()
            self.workers = {role: cls(*args, **kwargs) for role, (cls, args, kwargs) in roles.items()}

        def call(self, role: str, method: str, *args, **kwargs):
            return getattr(self.workers[role], method)(*args, **kwargs)

        def where(self) -> dict:
            node_id = ray.get_runtime_context().get_node_id()
            node = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "?")
            return {"rank": self.rank, "pid": os.getpid(), "node": node, "master": f"{self.master_addr}:{self.master_port}"}

    colocated = RayClassWithInitArgs(WorkerDict)
    colocated.roles = {role: cls for role, (cls, _, _) in roles.items()}
    return colocated


def creation_error(message: str) -> str:
    """The worker's own error in Ray's message for an actor whose ``__init__`` raised: Ray's lines
    come first and the traceback's last lines (``ValueError: ...``, not indented) end it."""
    lines = [line for line in message.splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line[:1].isspace()]  # traceback frames are indented
    tail = lines[frames[-1] + 1:] if frames else lines[-1:]
    return "\n".join(tail or lines[-1:])


@ray.remote(num_cpus=0)
def _rendezvous_address(single_node: bool) -> tuple[str, int]:
    """Run on rank 0's bundle: the address the ranks meet at (127.0.0.1 on one machine)."""
    host = LOOPBACK if single_node else ray.util.get_node_ip_address()
    return host, free_port(host)


class RayWorkerGroup:
    """The ranked actors of one resource pool; ``spawn`` gives one group per colocated role."""

    def __init__(self, resource_pool: RayResourcePool, ray_cls_with_init: RayClassWithInitArgs,
                 run_dir: Path | None = None, local_cluster: bool = True):
        self.resource_pool, self.world_size = resource_pool, resource_pool.world_size
        self.roles = getattr(ray_cls_with_init, "roles", {None: ray_cls_with_init.cls})
        self.role = None
        self.workers, self.where = [], []  # where: each rank's pid and node, once started
        try:
            self._start(ray_cls_with_init, resource_pool.bundles(), local_cluster, run_dir)
        except BaseException:  # the actors started so far end, and the pool is released for the next run
            self.kill()
            raise

    def _start(self, ray_cls_with_init: RayClassWithInitArgs, bundles: list, local_cluster: bool,
               run_dir: Path | None) -> None:
        """The ranks' actors on ``bundles``, each told its rank and the rendezvous address; waits for them."""
        resource_pool = self.resource_pool
        single_node = local_cluster and len(resource_pool.process_on_nodes) == 1
        first_pg, first_bundle = bundles[0]
        host, port = ray.get(_rendezvous_address.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=first_pg, placement_group_bundle_index=first_bundle)).remote(single_node))
        for rank, (pg, bundle) in enumerate(bundles):
            env = {"RANK": str(rank), "WORLD_SIZE": str(self.world_size), "MASTER_ADDR": host,
                   "MASTER_PORT": str(port), "LOCAL_RANK": str(bundle), "RLVR_WORKER_RANK": str(rank),
                   CHAT_DATE_ENV: run_date().isoformat()}  # the driver's chat-template date: prompts match
            if host == LOOPBACK:
                env["GLOO_SOCKET_IFNAME"] = "lo"
            self.workers.append(ray_cls_with_init(pg, bundle, env, resource_pool.cpus_per_process,
                                                  1 if resource_pool.use_gpu else 0))
        self.where = self._wait([w.where.remote() for w in self.workers], "start")
        if run_dir is not None:  # which process is which rank, next to Ray's logs
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            (Path(run_dir) / "workers.json").write_text(json.dumps(self.where, indent=1))

    def spawn(self, prefix_set) -> dict[str, "RayWorkerGroup"]:
        """One view of this group per colocated role (same actors)."""
        views = {}
        for role in prefix_set:
            view = object.__new__(RayWorkerGroup)
            view.__dict__.update(self.__dict__)
            view.role = role
            views[role] = view
        return views

    # ------------------------------------------------------------------ calls
    def __getattr__(self, name: str):
        if name in WORKER_METHODS:
            cls = self.roles[self.role]
            if not hasattr(cls, name):
                raise AttributeError(f"{cls.__name__} has no worker method {name!r}")
            return lambda *args, **kwargs: self._call(name, registration(getattr(cls, name)), args, kwargs)
        raise AttributeError(f"{name!r} is not a worker method; worker groups expose {list(WORKER_METHODS)}")

    def _call(self, method: str, reg, args: tuple, kwargs: dict) -> Any:
        """Dispatch, run, collect. A failure on the driver's side of the call (splitting the
        arguments, joining the answers) is a ``WorkerError`` naming the method, as a rank's is."""
        try:
            pad = 0
            if reg.dispatch_mode is Dispatch.DP_COMPUTE_PROTO:  # validation remainders: padded, trimmed after
                padded = []
                for value in args:
                    if isinstance(value, DataProto):
                        value, pad = pad_groups(value, self.world_size)
                    padded.append(value)
                args = tuple(padded)
            if reg.dispatch_mode in (Dispatch.ONE_TO_ALL, Dispatch.DP_MINI_BATCH_PROTO) and self.world_size > 1:
                args = tuple(ray.put(a) for a in args)  # one copy in the object store for all ranks, not one each
                kwargs = {k: ray.put(v) for k, v in kwargs.items()}
            per_rank = dispatch(reg.dispatch_mode, self.world_size, args, kwargs)
        except Exception as err:
            raise WorkerError(f"{method}: the arguments could not be split over the {self.world_size} ranks: "
                              f"{type(err).__name__}: {err}") from None
        ranks = [0] if reg.execute_mode is Execute.RANK_ZERO else list(range(self.world_size))
        refs = [self.workers[r].call.remote(self.role, method, *per_rank[r][0], **per_rank[r][1]) for r in ranks]
        answers = self._wait(refs, method, ranks)
        try:
            return collect(reg.dispatch_mode, answers, pad)
        except Exception as err:
            raise WorkerError(f"{method}: the answers of ranks {ranks} could not be joined: {type(err).__name__}: "
                              f"{err}") from None

    def execute_all(self, method: str, *args, **kwargs) -> list:
        """``method`` on every rank with the same arguments; the answers in rank order."""
        ranks = list(range(self.world_size))
        return self._wait([w.call.remote(self.role, method, *args, **kwargs) for w in self.workers], method, ranks)

    def execute_rank_zero(self, method: str, *args, **kwargs):
        return self._wait([self.workers[0].call.remote(self.role, method, *args, **kwargs)], method, [0])[0]

    def _wait(self, refs: list, method: str, ranks: list[int] | None = None) -> list:
        """The answers in order; the first rank to fail raises at once (the rest may be blocked in
        a collective with it: they are killed, never waited for)."""
        ranks = ranks if ranks is not None else list(range(len(refs)))
        pending = dict(zip(refs, ranks))
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(ready[0])
            try:
                ray.get(ready[0])
            except RayTaskError as err:
                self.kill()
                cause = err.cause
                if isinstance(cause, StopTraining):
                    raise type(cause)(f"rank {rank} in {method}: {cause}") from None
                raise WorkerError(f"rank {rank} failed in {method}: {type(cause).__name__}: {cause}\n"
                                  f"{err.traceback_str if hasattr(err, 'traceback_str') else ''}") from None
            except RayActorError as err:
                self.kill()
                if err.actor_init_failed:  # the worker's __init__ raised: its error, not Ray's first line
                    raise WorkerError(f"rank {rank}'s worker raised while starting: "
                                      f"{creation_error(str(err))}") from None
                where = self.where[rank] if self.where else {}
                raise WorkerError(f"rank {rank}'s worker process (pid {where.get('pid', '?')}) died during "
                                  f"{method}: {err.__class__.__name__}: {str(err).splitlines()[0]}") from None
        return ray.get(refs)

    def kill(self) -> None:
        """End the group's actors and release its pool's placement groups (Ray keeps a placement
        group until it is removed, even after the actor that made it is gone: a second run in the
        same Ray could not place its workers, nor reuse the pool's name). Calling it again is harmless."""
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.resource_pool.remove()
