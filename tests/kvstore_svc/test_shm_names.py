"""What a worker maps from a store's answer: one plain name in /dev/shm, never a path."""

from __future__ import annotations

import os
import uuid

import pytest

from kvstore_svc import shm


@pytest.mark.parametrize("name", ["../../tmp/victim", "/../etc/passwd", "a/b", "", "..", ".x",
                                  "x" * 300, "seg\x00name"])
def test_a_segment_name_that_is_a_path_is_refused(name):
    with pytest.raises(OSError, match="is not a shared-memory name"):
        shm.attach(name, 4096)


def test_a_rogue_name_leaves_the_file_it_names_alone(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    rel = os.path.relpath(victim, shm.SHM_DIR)
    with pytest.raises(OSError):
        shm.attach(rel, 7)
    assert victim.read_bytes() == b"keep me"


def test_a_link_in_dev_shm_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"\0" * 4096)
    name = f"fastserve-test-{uuid.uuid4().hex}"
    link = shm.SHM_DIR / name
    link.symlink_to(victim)
    try:
        with pytest.raises(OSError):
            shm.attach(name, 4096)
    finally:
        link.unlink()


def test_a_plain_name_still_maps():
    name = f"fastserve-test-{uuid.uuid4().hex}"
    path = shm.SHM_DIR / name
    path.write_bytes(b"\0" * 4096)
    try:
        mm = shm.attach("/" + name, 4096)
        mm[0] = 7
        mm.close()
        assert path.read_bytes()[0] == 7
    finally:
        path.unlink()
