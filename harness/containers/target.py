"""An external (black-box) target as a container: the scenario's [target] ``start`` argv runs as the command
of the image ``localhost/ordeal/<target name>:bookworm`` (or ORDEAL_IMAGE_<NAME>), with the run directory
mounted at the same path, so the placeholders ({run_dir} {data_dir} {log_dir} {host} {port}) and the
config file work unchanged.  The broker listens on its own address on the run's network (10.123.0.60)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from contracts.scenario import Scenario
from harness.containers.autobuild import external_images, missing_message
from harness.containers.engine import RUN_LABEL, Engine
from harness.containers.images import image_reference
from harness.containers.node import ContainerNode
from harness.containers.sandbox import cgroup_parent
from harness.containers.topology import GATEWAY, SUBNET, TARGET_HOST, _drop_bridge_rules, _host, run_id_for
from harness.external_target import ExternalTarget, TargetError
from harness.history import HistoryRecorder

MQTT_PORT = 1883


class ContainerExternalTarget(ExternalTarget):
    def __init__(self, scenario: Scenario, run_dir: Path, recorder: HistoryRecorder):
        super().__init__(scenario, run_dir, recorder)
        self.host = _host(TARGET_HOST)
        self.port = self.spec.port or MQTT_PORT
        self.run_id = run_id_for(self.run_dir)
        self.network = f"ordeal-{self.run_id}"
        self.image = image_reference(self.spec.name)
        self.engine: Engine | None = None

    def prepare(self) -> None:
        if self.spec.tls.enabled:  # the run's certificates are made for host processes (harness/tls.py)
            raise TargetError("[target.tls] enabled = true: the containers provider does not make the run's TLS "
                              "certificates; run a TLS target with the local provider")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # The broker may drop root to a user of the image (mosquitto does): its uid is not the host's, so
        # the run's data directory is open to it.
        os.chmod(self.data_dir, 0o777)
        if self.spec.config_file:
            (self.run_dir / self.spec.config_file).write_text(self._format(self.spec.config_text, "config_text"))

    def start(self) -> None:
        self.engine = Engine.start(self.run_dir, self.run_id)
        missing = missing_message(external_images(self.spec.name), f"an external target named {self.spec.name!r} "
                                  f"runs the image {self.image}")
        if missing:
            raise TargetError(missing)
        self.engine.client.networks.create(
            self.network, driver="bridge", labels={RUN_LABEL: self.run_id},
            ipam={"Driver": "default", "Config": [{"Subnet": str(SUBNET), "Gateway": GATEWAY}]})
        argv = [self._format(a, "start") for a in self.spec.start]
        self.node = ContainerNode(self.engine, self.name, "mqtt-broker", self.image, self.host, self.port, argv,
                                  network=self.network, run_dir=self.run_dir, volume=False,
                                  binds={str(self.run_dir): str(self.run_dir)},
                                  cgroup_parent=cgroup_parent(self.run_id) if self.engine.process else None)
        self.node.binds_mode = "rw"
        self.node.start()
        self._event("start", argv=argv, image=self.image, pid=self.node.pid)
        self.node.wait_ready(self.spec.ready_timeout_s)
        self._event("ready", pid=self.node.pid)

    def stop(self) -> None:
        if self.node is not None:
            pid = self.node.pid
            self.node.stop()
            self._event("stop", pid=pid)
            self.node.remove()
            self.node = None
        if self.engine is not None:
            self.engine.remove_run_objects()
            self.engine.stop()
            self.engine = None
        _drop_bridge_rules()

    def kill(self) -> None:
        if self.node is not None:
            pid = self.node.pid
            self.node.kill()
            self._event("kill", pid=pid)
        self.stop()

    def client_bind_address(self) -> str:
        return GATEWAY

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "provider": "containers", "image": self.image, "network": self.network}
