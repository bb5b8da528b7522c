"""The CPU image (deploy/image): built here from Debian packages (deploy/image/build.sh,
cached), it runs the KV store, a worker and the scheduler from the image, as its non-root
user, with the model cache mounted as a volume, and answers `fastserve generate`."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
from deploy_tools import tool

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = """
set -e
python -m fastserve.role kvstore --listen 127.0.0.1:59071 --budget-bytes 268435456 \\
  --metrics-port -1 >/tmp/kvstore.log 2>&1 &
K=$!
python -m fastserve.role worker --model SmolLM2-135M-Instruct --listen 127.0.0.1:59061 \\
  --num-blocks 256 --kvstore 127.0.0.1:59071 --metrics-port -1 >/tmp/worker.log 2>&1 &
W=$!
python -m fastserve.role scheduler --model SmolLM2-135M-Instruct --workers 127.0.0.1:59061 \\
  --listen 127.0.0.1:59051 --metrics-port -1 >/tmp/scheduler.log 2>&1 &
S=$!
i=0
until fastserve status --address 127.0.0.1:59051 >/dev/null 2>&1; do
  i=$((i+1)); [ $i -lt 300 ] || { tail -20 /tmp/*.log; exit 1; }; sleep 1
done
echo "user $(id -u)"
fastserve generate "What is the capital of France?" --temperature 0 --max-tokens 20 \\
  --address 127.0.0.1:59051
kill $S $W $K
"""


def test_the_cpu_image_serves_a_request(default_model_dir, tmp_path):
    buildah = tool("buildah", "apt-get install buildah debootstrap")
    if os.geteuid() != 0:
        pytest.skip("buildah here needs root")
    built = subprocess.run([str(ROOT / "deploy" / "image" / "build.sh")], capture_output=True,
                           text=True, timeout=3600, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    image = built.stdout.strip().splitlines()[-1]
    cache = tmp_path / "cache"  # the volume: the model, converted once on the host
    shutil.copytree(default_model_dir, cache / "models" / default_model_dir.name)
    for p in [cache, *cache.rglob("*")]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    b = [buildah, "--storage-driver", "vfs"]
    c = subprocess.run([*b, "from", image], capture_output=True, text=True, check=True)
    container = c.stdout.strip()
    try:
        r = subprocess.run([*b, "run", "--isolation", "chroot", "-v",
                            f"{cache}:/home/fastserve/.cache/fastserve", container, "--",
                            "sh", "-c", SCRIPT], capture_output=True, text=True, timeout=900,
                           check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "user 10001" in r.stdout  # not root
        assert "Paris" in r.stdout, r.stdout
    finally:
        subprocess.run([*b, "rm", container], capture_output=True, check=False)
