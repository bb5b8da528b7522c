"""Worker discovery through the Kubernetes API: ``--discovery kubernetes``.

A thread lists, then watches, the pods of one namespace that match a label selector (the
``kubernetes`` package; its watch is blocking). A pod joins when it is Running and Ready
with a pod IP, at ``podIP:<its container port named "grpc">``; it leaves when it is deleted,
stops being Ready or changes address. Joins and leaves are handed to the event loop, where
the cluster layer adds a worker group or retires one (its jobs then move as for a lost
worker). A watch that ends or fails is resumed from a fresh list after a pause, so nothing is
missed for long; what the fresh list no longer has leaves.

Rights: get, list and watch on pods in the namespace (the chart's Role), nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SA_NAMESPACE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
RETRY_S = 2.0
WATCH_TIMEOUT_S = 60


def pod_address(pod: Any, default_port: int) -> str | None:
    """``podIP:port`` of a Running, Ready pod; None otherwise."""
    status = pod.status
    if status is None or status.phase != "Running" or not status.pod_ip:
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or ()))
    if not ready or pod.metadata.deletion_timestamp is not None:
        return None
    port = default_port
    for c in pod.spec.containers or ():
        for p in c.ports or ():
            if p.name == "grpc":
                port = p.container_port
    return f"{status.pod_ip}:{port}"


def default_namespace() -> str:
    """The namespace of the pod's service account, or "default" outside a pod."""
    try:
        return SA_NAMESPACE.read_text().strip()
    except OSError:
        return "default"


class KubernetesDiscovery:
    """Watches the pods of ``namespace`` matching ``selector``; calls ``on_join(address)``
    and ``on_leave(address, why)`` on ``loop``."""

    def __init__(self, namespace: str, selector: str, default_port: int,
                 on_join: Callable[[str], None], on_leave: Callable[[str, str], None],
                 loop: asyncio.AbstractEventLoop, kubeconfig: str | None = None):
        self.namespace = namespace
        self.selector = selector
        self.default_port = default_port
        self.on_join = on_join
        self.on_leave = on_leave
        self.loop = loop
        self.kubeconfig = kubeconfig
        self._known: dict[str, str] = {}  # pod name -> its address while it is a member
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="discovery")

    def start(self) -> None:
        from kubernetes import client, config

        if self.kubeconfig:
            config.load_kube_config(self.kubeconfig)
        else:
            config.load_incluster_config()
        self._api = client.CoreV1Api()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    # ---- the watch thread ---------------------------------------------------------------
    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                pods = self._api.list_namespaced_pod(self.namespace,
                                                     label_selector=self.selector)
                self._resync(pods.items)
                w = watch.Watch()
                for event in w.stream(self._api.list_namespaced_pod, self.namespace,
                                      label_selector=self.selector,
                                      resource_version=pods.metadata.resource_version,
                                      timeout_seconds=WATCH_TIMEOUT_S):
                    if self._stop.is_set():
                        w.stop()
                        break
                    self._apply(event["type"], event["object"])
            except Exception as e:  # noqa: BLE001 - the API server away, 403, a stale version
                log.warning("worker discovery in namespace %s (%s): %s; retrying in %.0f s",
                            self.namespace, self.selector, e, RETRY_S)
                self._stop.wait(RETRY_S)

    def _resync(self, pods: list[Any]) -> None:
        seen = set()
        for pod in pods:
            seen.add(pod.metadata.name)
            self._apply("MODIFIED", pod)
        for name in [n for n in self._known if n not in seen]:
            self._leave(name, "its pod is gone")

    def _apply(self, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        address = None if kind == "DELETED" else pod_address(pod, self.default_port)
        old = self._known.get(name)
        if old is not None and old != address:
            self._leave(name, "its pod was deleted" if kind == "DELETED"
                        else "its pod is no longer Ready")
        if address is not None and old != address:
            self._known[name] = address
            log.info("worker pod %s joins at %s", name, address)
            self.loop.call_soon_threadsafe(self.on_join, address)

    def _leave(self, name: str, why: str) -> None:
        address = self._known.pop(name)
        log.info("worker pod %s at %s leaves: %s", name, address, why)
        self.loop.call_soon_threadsafe(self.on_leave, address, f"pod {name}: {why}")
