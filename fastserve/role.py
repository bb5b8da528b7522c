"""The container image's entrypoint: ``python -m fastserve.role ROLE ARGS...`` runs one
service of the cluster (one image, a role per pod; the chart's containers pass the role
first).

| role      | runs                      |
|-----------|---------------------------|
| scheduler | ``python -m scheduler_svc`` |
| worker    | ``python -m worker_svc``    |
| kvstore   | ``python -m kvstore_svc``   |
| http      | ``python -m openai_svc``    |
"""

from __future__ import annotations

import runpy
import sys

ROLES = {"scheduler": "scheduler_svc", "worker": "worker_svc", "kvstore": "kvstore_svc",
         "http": "openai_svc"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ROLES:
        print(f"usage: python -m fastserve.role {{{','.join(ROLES)}}} [ARGS...]",
              file=sys.stderr)
        return 2
    module = ROLES[argv[0]]
    sys.argv = [f"python -m {module}", *argv[1:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
