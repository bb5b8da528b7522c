"""Hosts on one machine: network namespaces on a bridge, for tests that need a real network
between processes (INFRA.md: veth pairs and a bridge, root only). Every name carries this
process's id, so concurrent runs never touch each other's namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


class Hosts:
    """``n`` namespaces, host i at ``address(i)`` on a bridge that the test's own namespace
    reaches at ``.254``; ``cut(i)`` takes host i's link down, ``exec_prefix(i)`` runs a command
    on it."""

    def __init__(self, n: int, subnet: int = 0):
        tag = f"{os.getpid() % 100000}"
        self.subnet = 10 + (os.getpid() + subnet) % 200
        self.bridge = f"fsbr{tag}"
        self.names = [f"fs{tag}h{i}" for i in range(n)]
        self._links = [f"fs{tag}v{i}" for i in range(n)]
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"10.{self.subnet}.0.254/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (name, link) in enumerate(zip(self.names, self._links, strict=True)):
                _ip("netns", "add", name)
                _ip("link", "add", link, "type", "veth", "peer", "name", f"{link}p")
                _ip("link", "set", f"{link}p", "netns", name)
                _ip("link", "set", link, "master", self.bridge)
                _ip("link", "set", link, "up")
                _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", f"{link}p")
                _ip("-n", name, "link", "set", f"{link}p", "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def address(self, i: int) -> str:
        return f"10.{self.subnet}.0.{i + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    def cut(self, i: int) -> None:
        _ip("link", "set", self._links[i], "down")

    def close(self) -> None:
        for name, link in zip(self.names, self._links, strict=True):
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
