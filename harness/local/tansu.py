"""The local topology's Kafka-protocol broker: Tansu, with its log in S3 on a local S3 server.

With S3 storage Tansu keeps no state of its own, so SIGKILL + restart of the broker loses nothing it
acknowledged (records and committed offsets live in the bucket).  The S3 server is a node too, so a
fault can kill it:
- ``moto`` (moto_server, in memory; the default): honours S3 conditional writes, which Tansu uses to
  hand out offsets.  A kill of the storage server loses the whole log.
- ``s3rver`` (npm, disk-backed): the bucket survives a kill of the storage server, but s3rver ignores
  conditional writes, so two producers appending to one partition at once can get the same offset and
  one acknowledged batch is overwritten.  Only for single-producer runs that kill the storage.
- ``memory``: Tansu's in-memory engine, no storage node; a broker kill loses everything.

Limits of this Tansu build (docs/recipes.md): no idempotent or transactional producers; ListOffsets "latest"
can be short; consumer-group joins take seconds; one broker only (a kill is an outage until restart)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from harness.kafka import BUCKET, MOTO_KEYS, _create_bucket, _s3_answers
from harness.node import ProcessNode

S3RVER_KEYS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}


def _no_proxy_env() -> dict[str, str]:
    # a host proxy setting must never route loopback traffic elsewhere
    return {"NO_PROXY": "*", "no_proxy": "*"}


def storage_node(kind: str, binary: Path, host: str, port: int, run_dir: Path) -> ProcessNode:
    name = "s3"
    data_dir = run_dir / "data" / name
    log_path = run_dir / "logs" / f"{name}.log"
    if kind == "s3rver":
        argv = [binary, "-d", data_dir, "-a", host, "-p", port, "--configure-bucket", BUCKET,
                "--allow-mismatched-signatures", "--silent"]
        after_ready = None
    elif kind == "moto":
        argv = [*moto_command(binary), "-H", host, "-p", port]
        after_ready = _create_bucket  # in memory: the bucket is gone after every (re)start
    else:
        raise ValueError(f"unknown S3 server kind {kind!r}")
    return ProcessNode(name, "storage", host, port, argv, log_path=log_path, data_dir=data_dir,
                       env=_no_proxy_env(), ready_check=_s3_answers, after_ready=after_ready)


def moto_command(binary: Path) -> list[str | Path]:
    """How to start moto's S3 server: through ``s3_stand_in.py`` (moto with its LIST timestamps memoized,
    less CPU per listed key, docs/measurements.md) when this interpreter has moto, else the ``moto_server`` script as is."""
    if importlib.util.find_spec("moto") is not None:
        return [sys.executable, Path(__file__).with_name("s3_stand_in.py")]
    return [binary]


class TansuNode(ProcessNode):
    """``advertised``: the address Tansu hands its clients in Metadata / FindCoordinator instead of its own (the
    broker -> Kafka link's proxy: faults/latency.py), which is then the bootstrap address too."""

    def __init__(self, binary: Path, host: str, port: int, run_dir: Path, storage: ProcessNode | None,
                 storage_kind: str, advertised: tuple[str, int] | None = None) -> None:
        url = f"tcp://{host}:{port}"
        self.advertised = f"{advertised[0]}:{advertised[1]}" if advertised else None
        env: dict[str, str] = {**_no_proxy_env(), "RUST_LOG": "warn"}
        if storage is not None:
            engine = f"s3://{BUCKET}/"
            env.update(S3RVER_KEYS if storage_kind == "s3rver" else MOTO_KEYS)
            env.update({"AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": f"http://{storage.address}",
                        "AWS_ALLOW_HTTP": "true"})
        else:
            engine = f"memory://{BUCKET}/"
        argv = [binary, "broker", "--cluster-id", "ordeal", "--listener-url", url,
                "--advertised-listener-url", f"tcp://{self.advertised}" if self.advertised else url,
                "--storage-engine", engine]
        super().__init__("kafka", "kafka", host, port, argv, log_path=run_dir / "logs" / "kafka.log",
                         data_dir=run_dir / "data" / "kafka", env=env)
        self.storage_engine = engine

    @property
    def bootstrap(self) -> str:
        return self.advertised or self.address
