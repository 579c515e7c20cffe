"""``python3 -m rlvr.trainer.main_ppo``: verl's entry point, ``python3 -m verl.trainer.main_ppo``, on rlvr.

A verl script runs with only the module name changed: Hydra's ``--config-path``/``--config-name``
and ``key=value`` / ``+key=value`` overrides as verl takes them, and verl's defaults
(``rlvr/config/verl.yaml``) for every key the script does not set, in place of rlvr's GRPO recipe
(``use_kl_loss`` false, ``lr`` 1e-6, ``n`` 1, no validation or checkpoints unless asked, as verl).
It is ``rlvr train --base verl``: ``--explain`` and ``--dry-run`` work here too.
"""

from __future__ import annotations

import sys

from rlvr.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return cli_main(["train", "--base", "verl", *args])


if __name__ == "__main__":
    sys.exit(main())
