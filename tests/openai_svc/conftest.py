"""A worker, a scheduler and the HTTP front end, real processes, for the module's tests."""

from __future__ import annotations

import shutil

import pytest
from procs import start_http, start_scheduler, start_worker


@pytest.fixture(scope="session")
def chat_model(tiny_tok_model, default_model_dir, tmp_path_factory):
    """The tiny model with the default model's chat template."""
    path = tmp_path_factory.mktemp("tiny-chat")
    shutil.copytree(tiny_tok_model, path, dirs_exist_ok=True)
    for f in default_model_dir.glob("chat_template*"):
        shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="module")
def cluster(chat_model, tmp_path_factory):
    """(scheduler address, http base url, model dir) of a running cluster."""
    logs = tmp_path_factory.mktemp("http-logs")
    worker = start_worker(str(chat_model), logs, 256)
    scheduler = start_scheduler(str(chat_model), [worker.address], logs)
    http = start_http(scheduler.address, logs, "--model", str(chat_model))
    try:
        yield scheduler.address, f"http://{http.address}", chat_model
    finally:
        http.stop()
        scheduler.stop()
        worker.stop()
