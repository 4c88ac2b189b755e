"""When the drain may end: the rule as a pure function, and the bookkeeping of deliveries still owed.

A fixed quiet period is not enough: under load the broker → Kafka → broker pipeline lags several seconds,
and a short quiet ends the drain with acknowledged messages still in flight, which the checkers then
report as lost.  The executor therefore counts **outstanding** deliveries: a QoS > 0 publish acknowledged
by the broker while a persistent subscriber with a matching subscription (effective QoS > 0) was connected
and subscribed, not yet seen by that subscriber.  The rule (``drain_decision``):

- ``quiet``: every persistent subscriber is back and subscribed, nothing is outstanding, and no new
  delivery for ``quiet_s``;
- ``outstanding_quiet``: deliveries are still outstanding but nothing arrived for
  ``outstanding_quiet_s`` = max(3 × quiet_s, 10 s).  A broker may legally drop them (queue trimmed,
  message expired, session expired), which the drain cannot know, so it does not wait for ever;
- ``timeout``: ``timeout_s`` passed first (the checkers answer unknown).

The history's ``drain_end`` row keeps ``reason: "quiet"`` for both quiet endings (the checkers' contract)
and says which rule ended it in ``ended_by`` with the ``outstanding`` count.
A shared subscription ($share/GROUP/FILTER) is owed once per group, not per member: the message is outstanding
until any member of the group (``member_of``) has it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts.topics import filter_matches, shared_filter

QUIET, OUTSTANDING_QUIET, TIMEOUT = "quiet", "outstanding_quiet", "timeout"
OUTSTANDING_QUIET_FACTOR = 3.0
OUTSTANDING_QUIET_FLOOR_S = 10.0


@dataclass(frozen=True)
class DrainRule:
    quiet_s: float
    timeout_s: float

    def __post_init__(self) -> None:
        if not self.quiet_s > 0:
            raise ValueError(f"drain quiet_s must be > 0, got {self.quiet_s!r}")
        if self.timeout_s < self.quiet_s:
            raise ValueError(f"drain timeout_s ({self.timeout_s!r}) must be >= quiet_s ({self.quiet_s!r})")

    @property
    def outstanding_quiet_s(self) -> float:
        return max(OUTSTANDING_QUIET_FACTOR * self.quiet_s, OUTSTANDING_QUIET_FLOOR_S)


def drain_decision(rule: DrainRule, *, elapsed_s: float, quiet_for_s: float, all_up: bool,
                   outstanding: int) -> str | None:
    """Why the drain ends now (QUIET, OUTSTANDING_QUIET, TIMEOUT), or None to keep waiting.
    ``elapsed_s``: since the drain started; ``quiet_for_s``: since the last delivery (or the drain start);
    ``all_up``: every persistent subscriber connected and subscribed; ``outstanding``: owed deliveries."""
    if all_up and outstanding == 0 and quiet_for_s >= rule.quiet_s:
        return QUIET
    if all_up and outstanding > 0 and quiet_for_s >= rule.outstanding_quiet_s:
        return OUTSTANDING_QUIET
    if elapsed_s >= rule.timeout_s:
        return TIMEOUT
    return None


Owed = tuple[str, str, int]  # subscriber client id, publisher client id, publisher seq


SEEN_GENERATION = 100_000  # deliveries remembered per generation of ``OutstandingDeliveries.seen``


@dataclass
class OutstandingDeliveries:
    """Deliveries owed to connected persistent subscribers (see the module doc).  Loop thread only.

    ``seen`` / ``seen_before``: the deliveries of the last ``generation`` to 2 x ``generation`` deliveries, so that
    a delivery that overtakes its publisher's PUBACK is not owed when the PUBACK comes.  Why two generations and
    not every delivery of the run: that set grew by one entry per delivery (about 180 bytes each), which over an
    hour at 500 msg/s was the harness's whole RSS growth (docs/measurements.md "Soak").  A PUBACK overtaken by
    its delivery comes within moments; one that came after 100,000 more deliveries would leave its message owed
    and the drain waiting for it (``outstanding_quiet`` ends that), never a wrong verdict."""

    owed: set[Owed] = field(default_factory=set)
    # client id -> the $share filters it subscribes to: a delivery to it settles what the group was owed
    member_of: dict[str, frozenset[str]] = field(default_factory=dict)
    seen: set[Owed] = field(default_factory=set)
    seen_before: set[Owed] = field(default_factory=set)
    generation: int = SEEN_GENERATION

    def acknowledged(self, publisher: str, seq: int, topic: str, qos: int,
                     subscribers: list[tuple[str, list[tuple[str, int]]]]) -> None:
        """A publish was acknowledged; ``subscribers``: (client id, [(filter, qos)]) of every persistent
        subscriber that is connected and subscribed right now."""
        if qos == 0:
            return
        for client_id, subscriptions in subscribers:
            for topic_filter, sub_qos in subscriptions:
                shared = shared_filter(topic_filter)
                if min(qos, sub_qos) <= 0 or not filter_matches(shared or topic_filter, topic):
                    continue
                key = (topic_filter if shared else client_id, publisher, seq)  # a group is owed it once
                if key not in self.seen and key not in self.seen_before:  # a delivery may overtake its PUBACK
                    self.owed.add(key)

    def delivered(self, client_id: str, publisher: str | None, seq: int | None) -> None:
        if publisher is None or seq is None:
            return
        for key in [(client_id, publisher, seq), *((g, publisher, seq) for g in self.member_of.get(client_id, ()))]:
            if len(self.seen) >= self.generation:
                self.seen_before, self.seen = self.seen, set()
            self.seen.add(key)
            self.owed.discard(key)

    def forget(self, client_id: str) -> None:
        """The subscriber started a new session (session present 0: clean start, expiry): what its old one
        was owed is gone with it, legally; the checkers judge whether that was right.  What its groups are owed
        stays: another member may take it."""
        self.owed = {key for key in self.owed if key[0] != client_id}

    @property
    def count(self) -> int:
        return len(self.owed)


PIPELINE_EMPTY, PIPELINE_STALLED, KAFKA_UNREADABLE = "pipeline_empty", "pipeline_stalled", "kafka_unreadable"


def pipeline_wait_decision(*, owed: int, in_kafka: int | None, previous: tuple[int, int] | None) -> str | None:
    """After the drain gave up with deliveries owed (harness/run.py reads Kafka between waits): why the
    wait ends now, or None to keep waiting.  ``owed``: deliveries still owed; ``in_kafka``: how many of
    them Kafka still holds past the broker's committed offsets (None: unreadable); ``previous``: (owed,
    in_kafka) at the last read.  Waiting makes sense only while the pipeline still holds owed records and
    moves: a read showing neither fewer owed nor fewer waiting means it stalled."""
    if in_kafka is None:
        return KAFKA_UNREADABLE
    if in_kafka == 0:
        return PIPELINE_EMPTY
    if previous is not None and owed >= previous[0] and in_kafka >= previous[1]:
        return PIPELINE_STALLED
    return None
