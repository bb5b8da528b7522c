"""Assemble the scheduler service: text model, worker loops, gRPC server, health, metrics."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fastserve.metrics_endpoint import DEFAULT_HOST
from fastserve.proto import scheduler_pb2 as spb
from fastserve.proto import scheduler_pb2_grpc
from fastserve.tls import Tls, bind
from scheduler_svc.api.auth import ApiKeys
from scheduler_svc.api.decode_guard import DecodeGuard
from scheduler_svc.api.servicer import SchedulerServicer
from scheduler_svc.api.text import TextModel
from scheduler_svc.cluster import Cluster
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.discovery import KubernetesDiscovery
from scheduler_svc.loop import WorkerLoop
from scheduler_svc.metrics import SchedulerMetrics

log = logging.getLogger(__name__)

SERVICE_NAME = spb.DESCRIPTOR.services_by_name["Scheduler"].full_name


@dataclass(frozen=True)
class Discovery:
    """``--discovery kubernetes``: worker pods of ``namespace`` matching ``selector``."""

    namespace: str
    selector: str
    port: int  # when a pod names no container port "grpc"
    kubeconfig: str | None = None  # None: the pod's service account (in-cluster)


@dataclass
class SchedulerService:
    server: grpc.aio.Server
    port: int
    servicer: SchedulerServicer
    loops: list[WorkerLoop]
    health: health.aio.HealthServicer
    metrics: SchedulerMetrics | None
    health_watch: asyncio.Task | None = None
    discovery: KubernetesDiscovery | None = None

    async def stop(self, grace_s: float = 5.0) -> None:
        if self.discovery is not None:
            self.discovery.stop()
        if self.health_watch is not None:
            self.health_watch.cancel()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        for lp in self.loops:
            await lp.stop()


async def create_service(config: SchedulerConfig, model_path: str, model_name: str,
                         workers: list[str], listen: str, connect_timeout_s: float = 120.0,
                         metrics_port: int = -1,
                         metrics_host: str = DEFAULT_HOST,
                         api_keys: ApiKeys | None = None,
                         tls: Tls | None = None,
                         discovery: Discovery | None = None) -> SchedulerService:
    """Connect to every worker, then serve; raises if a worker is not reachable in time.
    With ``discovery`` the workers are the Ready pods it finds, joining and leaving as they
    come and go (``workers`` is then ignored)."""
    text = await asyncio.to_thread(TextModel.load, model_path)
    metrics = SchedulerMetrics(config.policy, model_name) if metrics_port >= 0 else None

    def make_loop(address: str) -> WorkerLoop:
        return WorkerLoop(address, config,
                          on_iteration=metrics.observe_iteration if metrics else None,
                          model=(model_name, model_path), tls=tls)

    loops = [] if discovery is not None else [make_loop(addr) for addr in workers]
    await asyncio.gather(*(lp.connect(connect_timeout_s) for lp in loops))
    for lp in loops:
        lp.start()
    cluster = Cluster(loops, config.worker_loss_wait_s)
    servicer = SchedulerServicer(config, text, cluster, model_name,
                                 on_finish=metrics.observe_finished if metrics else None,
                                 api_keys=api_keys,
                                 on_refused=metrics.observe_refused if metrics else None)
    server = grpc.aio.server(interceptors=[DecodeGuard(("fastserve.",))])
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = bind(server, listen, tls, require_client=False)  # clients prove themselves by key
    if port == 0:
        raise RuntimeError(f"could not bind {listen}")
    await server.start()
    watch = asyncio.create_task(_watch_health(health_servicer, cluster.loops), name="health")
    if metrics is not None:
        metrics.bind(cluster.loops)
        metrics.port = metrics.serve(metrics_port, metrics_host)
    watcher = None
    if discovery is not None:
        retiring: set[asyncio.Task] = set()  # held until done (the loop keeps weak refs)

        def leave(address: str, why: str) -> None:
            task = asyncio.ensure_future(cluster.remove_group(address, why))
            retiring.add(task)
            task.add_done_callback(retiring.discard)

        watcher = KubernetesDiscovery(discovery.namespace, discovery.selector, discovery.port,
                                      lambda address: cluster.add_group(make_loop(address)),
                                      leave, asyncio.get_running_loop(), discovery.kubeconfig)
        watcher.start()
    return SchedulerService(server, port, servicer, cluster.loops, health_servicer, metrics,
                            watch, watcher)


HEALTH_CHECK_S = 0.5


async def _watch_health(servicer: health.aio.HealthServicer, loops: list[WorkerLoop]) -> None:
    """SERVING while some worker is ready, NOT_SERVING while none is (a load balancer or
    Kubernetes then sends no traffic here)."""
    serving: bool | None = None
    while True:
        ready = any(lp.ready for lp in loops)
        if ready != serving:
            status = (health_pb2.HealthCheckResponse.SERVING if ready
                      else health_pb2.HealthCheckResponse.NOT_SERVING)
            for name in ("", SERVICE_NAME):
                await servicer.set(name, status)
            serving = ready
        await asyncio.sleep(HEALTH_CHECK_S)
