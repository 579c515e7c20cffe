"""Processes seen through /proc, for tests that check what a call leaves running."""

from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first, zombies included), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, (p.name for p in Path("/proc").iterdir())):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def alive_descendants(pid: int) -> list[int]:
    return [p for p in descendants(pid) if alive(p)]
