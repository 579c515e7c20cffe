"""SGLang's distributed weight update: a trainer broadcasts tensors to the server over a process
group that the two open together.

``/init_weights_update_group {master_address, master_port, rank_offset, world_size, group_name,
backend}``: the trainer (rank 0, which hosts the TCP store at ``master_address:master_port``) and
the server (rank ``rank_offset``) join a group of ``world_size``. ``/update_weights_from_distributed
{names, dtypes, shapes, ...}``: the trainer broadcasts each tensor from rank 0, in that order, and
the server copies each into the parameter of that name. ``/destroy_weights_update_group`` shuts the
group down.

The group is laid out as ``torch.distributed`` lays out a group it creates for ``group_name`` (a
``PrefixStore`` of ``"{group_name}/"`` then ``"cpu/"`` over the TCP store), so a trainer that
opens its side with torch's own group helpers (SGLang's ``init_custom_process_group``, verl's)
meets it. The group is a ``ProcessGroupGloo`` object of its own, not torch's default group: the
server process keeps no global distributed state. Only gloo: on a CPU it is the backend there is;
NCCL (a GPU server) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch

from rlvr.serve.protocol import BadRequest


@dataclass
class WeightGroup:
    name: str
    store: object
    group: object
    rank: int
    world_size: int


def open_group(master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
               timeout_s: float, is_master: bool = False) -> WeightGroup:
    """Join (or, ``is_master``, host: the trainer's side) the gloo group ``group_name``; blocks
    until every rank has joined."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    # a client counts itself in, the master waits for every rank: torch's rendezvous does the same
    store = dist.TCPStore(master_address, master_port, world_size, is_master=is_master, timeout=timeout)
    prefixed = dist.PrefixStore("cpu/", dist.PrefixStore(f"{group_name}/", store))
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    # a group on the loopback talks over it (what GLOO_SOCKET_IFNAME=lo asks), not over whatever
    # interface the host name resolves to
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=master_address)
                        if is_loopback(master_address) else dist.ProcessGroupGloo.create_default_device()]
    group = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
    return WeightGroup(group_name, store, group, rank, world_size)


def close_group(group: WeightGroup) -> None:
    """Shut the group's gloo context down (its connections to the other ranks); the TCP store goes
    with the last reference."""
    try:
        group.group.shutdown()
    except RuntimeError:  # another rank left first: its half is gone already
        pass


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def broadcast(group: WeightGroup, tensor: torch.Tensor, root: int = 0) -> None:
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = root
    group.group.broadcast([tensor], options).wait()


def parse_dtype(name: str, field_name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise BadRequest(field_name, f"{name!r} is not a torch dtype (e.g. 'float32', 'bfloat16')")
    return dtype


def check_tensors(model: torch.nn.Module, names: list[str], dtypes: list[str], shapes: list[list[int]]):
    """The parameters the broadcast will fill, checked before the first tensor arrives ->
    [(parameter, dtype it arrives in)]."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise BadRequest("names", f"names, dtypes and shapes must be as long: {len(names)}, {len(dtypes)}, "
                                  f"{len(shapes)}")
    state = model.state_dict(keep_vars=True)
    plan = []
    for i, (name, dtype, shape) in enumerate(zip(names, dtypes, shapes)):
        if name not in state:
            raise BadRequest(f"names.{i}", f"{name!r} is not a tensor of the served model")
        if tuple(shape) != tuple(state[name].shape):
            raise BadRequest(f"shapes.{i}", f"{name} has shape {tuple(state[name].shape)} in the served model, "
                                            f"not {tuple(shape)}")
        plan.append((state[name], parse_dtype(dtype, f"dtypes.{i}")))
    return plan


def receive_into(group: WeightGroup, plan) -> str:
    """Receive each broadcast tensor (from rank 0) and copy it into its parameter, in order."""
    with torch.no_grad():
        for param, dtype in plan:
            buffer = torch.empty(param.shape, dtype=dtype)
            broadcast(group, buffer)
            param.copy_(buffer.to(param.dtype))
    return f"{len(plan)} tensors from group {group.name!r}"
