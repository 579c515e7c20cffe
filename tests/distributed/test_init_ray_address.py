"""Which Ray ``init_ray`` joins: ``ray_kwargs.ray_init.address`` or, when it is null, the cluster in
``RAY_ADDRESS`` (what ``ray job submit`` sets; ray.init reads it the same way), read at load; else
a Ray of its own on 127.0.0.1. ``ray.init`` is a recording stand-in: nothing is started or joined."""

import tempfile
import types

import pytest
import ray  # noqa: F401 (installed by make test: a missing Ray fails here, never skips)

import rlvr.distributed.ray_workers as ray_workers
from rlvr.config import load_config

TWO_NODES = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.strategy=fsdp2",
             "trainer.device=cpu", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the rlvr-ray-* folder a local Ray gets: not in /tmp
    calls = []
    monkeypatch.setattr(ray_workers, "ray", types.SimpleNamespace(is_initialized=lambda: False,
                                                                  init=lambda **kw: calls.append(kw)))
    return calls


def _init(cfg, run_dir):
    ray_init = cfg.ray_kwargs.ray_init
    return ray_workers.init_ray(ray_init.address, ray_init.num_cpus, run_dir, ray_init.runtime_env, ray_init.kwargs)


def test_two_nodes_join_the_cluster_of_ray_address(monkeypatch, recorded, tmp_path):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    cfg = load_config(None, TWO_NODES, base="verl")
    assert _init(cfg, tmp_path)
    (kwargs,) = recorded
    assert kwargs["address"] == "127.0.0.1:6379"
    assert "_node_ip_address" not in kwargs and "_temp_dir" not in kwargs  # the cluster's own, not a local Ray's


def test_the_local_ray_stays_local_whatever_ray_address_says(monkeypatch, recorded, tmp_path):
    """A config that names no cluster (one built before RAY_ADDRESS was set) starts rlvr's own Ray on
    loopback; ray.init with address=None would read RAY_ADDRESS and join that cluster instead."""
    cfg = load_config(None, ["trainer.n_gpus_per_node=2", "trainer.device=cpu"])
    assert cfg.ray_kwargs.ray_init.address is None
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert _init(cfg, tmp_path)
    (kwargs,) = recorded
    assert kwargs["address"] == "local" and kwargs["_node_ip_address"] == "127.0.0.1"
