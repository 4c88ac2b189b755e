"""Kafka down while a consumer's offset commit is on its way: ``at_commit`` on ``process_kill`` / ``process_pause``.

A kill of Tansu at a random moment rarely meets a commit: a commit is one small request among the fetches. This
makes the moment. The broker -> Kafka link goes through the harness' proxy (harness/reference_target.py
``prepare_links``: a plan holding such a fault routes it, as for a link fault on it), and the fault:

1. adds a ``hold_requests`` toxic (Ordeal's own, harness/toxiproxy/server.py) on the upstream of Tansu's proxy:
   a request with api key 8 (OffsetCommit) whose group id starts with ``commit_group_prefix`` is held there,
   with everything after it on its connection (the order is kept);
2. waits (at most ``commit_wait_s``) until the proxy holds at least one such commit;
3. kills (SIGKILL) or pauses (SIGSTOP) Tansu -- the process fault's own step, with its own evidence;
4. removes the toxic: what was held goes on to the upstream, a dead one (the connection is closed: the
   consumer's commit fails, aiokafka raises, the broker's next commit covers it) or a stopped one (the commit
   waits in Tansu's socket until SIGCONT).

Evidence: "an OffsetCommit held in flight when Kafka went down": how many the proxy held at the kill / pause and
when the toxic went, the first ones (group id, client id, correlation id), the wait; false when no commit came
within ``commit_wait_s`` (Kafka is then taken down anyway, as planned: the fault did not bite, it does not
pretend). Heal: the kill's or the pause's own, and an observation: the broker nodes' log lines about commits since
the apply (aiokafka's "Error sending OffsetCommitRequest ... marking coordinator dead" for a held group).

Refused at load (faults/catalog.py ``validate_spec``, ``provider_param_gaps``): a target other than ``kafka``,
``at_stage`` with it, the containers provider (its links are not routed through the harness' proxy).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from faults.base import Check, FaultContext, FaultNotApplicable, FaultSpec, FaultSpecError, Param
from faults.failure_paths import BrokerLogWatch
from faults.latency import BROKER_KAFKA, LINK_ATTRIBUTE, _call
from faults.redis_cluster_view import wait_until
from faults.selectors import kafka_role_of

OFFSET_COMMIT = 8  # the Kafka api key of OffsetCommit
AT_COMMIT_KINDS = ("process_kill", "process_pause")
# The reference broker's APPLICATION clients' and shared groups' consumer groups all begin so
# (reference_broker/app_clients.py, shared_subs.py: application-persisted-msg-, application-shared-msg-consumer-
# group-); its own nodes' consumers are ordeal-broker-<topic>.
DEFAULT_GROUP_PREFIX = "application-"
POLL_S = 0.02
HELD_CHECK = "an OffsetCommit held in flight when Kafka went down"

AT_COMMIT_PARAMS = (
    Param("at_commit", bool, False, "target kafka: SIGKILL / SIGSTOP Tansu while a consumer's OffsetCommit is "
          "held in flight on the broker -> Kafka link (the harness' proxy holds it)"),
    Param("commit_group_prefix", str, DEFAULT_GROUP_PREFIX, "at_commit: only commits of consumer groups whose id "
          "starts so are held and waited for (\"application-\": APPLICATION clients and shared groups; \"\": any)"),
    Param("commit_wait_s", float, 5.0, "at_commit: wait at most this long for a commit to hold (then Kafka goes "
          "down anyway and the fault did not bite)", min=0.1, max=60.0),
)
CONTAINERS_REFUSAL = ("at_commit holds the commit on the broker -> Kafka link's proxy; link faults go through a "
                      "toxiproxy on the link, on this provider meant to be the real toxiproxy image, which no image "
                      "registry reachable here provides, and the harness' own proxy (harness/toxiproxy/) is routed "
                      "for the local provider's links only")


def at_commit_links(faults: Iterable[Any]) -> set[str]:
    """The links a plan's faults (FaultSlot objects or dicts) need routed for ``at_commit``: broker-kafka."""
    for fault in faults:
        kind = fault.get("kind") if isinstance(fault, Mapping) else fault.kind
        params = (fault.get("params") if isinstance(fault, Mapping) else fault.params) or {}
        if kind in AT_COMMIT_KINDS and params.get("at_commit"):
            return {BROKER_KAFKA}
    return set()


def check_spec(kind: str, target: str | None, params: Mapping[str, Any]) -> None:
    """At load: ``at_commit`` only on the Kafka broker, and not with ``at_stage``.  Raises FaultSpecError (the
    caller adds the fault id)."""
    if kind not in AT_COMMIT_KINDS or not params.get("at_commit"):
        return
    if not target or kafka_role_of(target) != "kafka":
        raise FaultSpecError(f"fault kind {kind!r}: parameter 'at_commit' = true takes the Kafka broker down while "
                             f"its commit is held on the broker -> Kafka link: target must be 'kafka' (or "
                             f"node:kafka), got {target!r}")
    if params.get("at_stage", "now") != "now":
        raise FaultSpecError(f"fault kind {kind!r}: parameters 'at_commit' = true and 'at_stage' = "
                             f"{params['at_stage']!r} both time the kill; give one of them")


def provider_param_gap(provider: str, kind: str, params: Mapping[str, Any]) -> str:
    """Why ``provider`` cannot play this fault with these parameters, or ''."""
    if provider == "containers" and kind in AT_COMMIT_KINDS and params.get("at_commit"):
        return f"fault {kind!r} with parameter 'at_commit' is not supported by provider {provider!r}: " \
               f"{CONTAINERS_REFUSAL}"
    return ""


class CommitLogWatch(BrokerLogWatch):
    """The broker nodes' log lines about commits from the apply on (an observation for the heal's evidence):
    aiokafka's "Error sending OffsetCommitRequest ... marking coordinator dead" when the held commit's connection
    went with Kafka, the broker's own "commit of ... failed"."""

    PATTERN = re.compile(r"OffsetCommitRequest|Marking the coordinator dead|commit of .* failed|commit failed")
    SAMPLE = 5

    def check(self, groups: list[str]) -> Check:
        lines = [f"{name}: {line[:300]}" for name, line in self.lines_since() if self.PATTERN.search(line)]
        naming = [line for line in lines if any(group in line for group in groups)]
        return Check("the broker's commits met the outage (an observation)", {
            "commit_lines": len(lines), "naming_a_held_group": len(naming), "held_groups": groups,
            "lines": (naming or lines)[:self.SAMPLE]}, True)


def held_groups(evidence_checks: list[Check]) -> list[str]:
    """The group ids of the commits the apply's evidence says were held."""
    for check in evidence_checks:
        if check.what == HELD_CHECK:
            return sorted({r["group_id"] for r in check.observed.get("held_requests", []) if r.get("group_id")})
    return []


def _toxic_state(api: str, proxy: str, toxic: str) -> dict[str, Any]:
    """The toxic as the proxy's API serves it (its ``held`` count and ``held_requests``)."""
    with urllib.request.urlopen(f"http://{api}/proxies/{proxy}/toxics/{toxic}", timeout=2.0) as answer:
        return json.loads(answer.read())


def at_commit(spec: FaultSpec, ctx: FaultContext, node: Any, down: Callable[[], list[Check]]) -> list[Check]:
    """Hold the commits on ``node``'s proxy, wait for one, run ``down`` (the kill / pause and its checks), let
    the held bytes go; the held-commit check first, then ``down``'s."""
    where = f"fault {spec.id} ({spec.kind} at_commit of {node.name})"
    if node.role != "kafka":
        raise FaultNotApplicable(f"{where}: at_commit takes the Kafka broker down; {node.name} is a {node.role} node")
    routed = getattr(ctx.topology, LINK_ATTRIBUTE, None) or {}
    route = routed.get("links", {}).get(BROKER_KAFKA, {}).get(node.name)
    if route is None:
        raise FaultNotApplicable(f"{where}: the broker -> Kafka link is not routed through the harness' proxy in this "
                                 "run (the reference target routes it, on the local provider, when the plan holds an "
                                 "at_commit fault: harness/reference_target.py prepare_links)")
    api, proxy, toxic = routed["api"], route["proxy"], f"ordeal_{spec.id}_hold_commits"
    prefix = str(spec.params.get("commit_group_prefix", DEFAULT_GROUP_PREFIX))
    wait_s = float(spec.params.get("commit_wait_s", 5.0))
    _call(api, lambda server: server.get_proxy(proxy).add_toxic(
        name=toxic, type="hold_requests", stream="upstream", toxicity=1.0,
        attributes={"api_key": OFFSET_COMMIT, "group_prefix": prefix}))
    ctx.note_node_event(node.name, "hold_commits", fault_id=spec.id, proxy=proxy, group_prefix=prefix)
    added = time.monotonic()
    at_down: dict[str, Any] = {}
    final: dict[str, Any] = {}
    try:
        def some_held() -> tuple[bool, dict]:
            state = _toxic_state(api, proxy, toxic)
            return state["attributes"]["held"] >= 1, {"held": state["attributes"]["held"]}

        held, observed, waited = wait_until(some_held, wait_s, interval_s=POLL_S)
        at_down = _toxic_state(api, proxy, toxic)
        checks = down()
    finally:
        try:
            final = _toxic_state(api, proxy, toxic)
        except (urllib.error.URLError, OSError, ValueError) as error:
            final = {"error": f"{type(error).__name__}: {error}"}
        removed = _call(api, lambda server: server.get_proxy(proxy).destroy_toxic(toxic))
        ctx.note_node_event(node.name, "release_commits", fault_id=spec.id, proxy=proxy,
                            held=final.get("attributes", {}).get("held"), removed=removed)
    held_at_down = at_down["attributes"]["held"]
    return [Check(HELD_CHECK, {
        "proxy": proxy, "api_key": OFFSET_COMMIT, "group_prefix": prefix, "held_at_down": held_at_down,
        "held_until_released": final.get("attributes", {}).get("held"), "held_requests": at_down["held_requests"],
        "toxic_removed": removed,
        "waited_s": waited, "commit_wait_s": wait_s, "held_s": round(time.monotonic() - added, 3),
        **({"wait": observed} if not held else {})}, held and held_at_down >= 1)] + checks
