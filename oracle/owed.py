"""What each subscriber was owed, and each owed message it never got under the one invariant its loss breaks
(docs/invariants.md "Owed", rules 1-6, "Black-box limit rules: the settled backlog", and the loss rows of the
invariants table).

A *claim* is a published message and a client one of whose subscriptions (at any time) matches its topic; a
*candidate* is a claim the client was owed at publish time (rules 1-3).  Per client, each candidate queued
in an offline window (its *backlog*) is ranked in that backlog; then rules 4-6 say whether it was still owed,
and a never-delivered one that was owed is lost, by the first cause that fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oracle.messages import Publish, Received
from oracle.run import NEVER, Declared
from oracle.sessions import Life, Subscription, Window
from oracle.topics import matches, shared


@dataclass
class Claim:
    client: str
    message: Publish
    candidate: bool
    got: Received | None
    window: Window | None = None  # the first offline window that ends after the message arrived
    in_backlog: bool = False
    rank: int | None = None  # in its backlog, from the end the declared policy keeps
    trimmed: bool = False  # legally trimmed
    misplaced: bool = False  # past the limit, but its backlog's trim kept the wrong end
    expired: bool = False  # expired legally before its first chance
    undeliverable: bool = False
    settled: bool = False
    immediate: bool = False
    backlog: dict[str, Any] | None = None  # the backlog's own numbers (queue())
    cause: str | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        return self.client, self.message.publisher, self.message.pub_seq

    @property
    def delivered(self) -> bool:
        return self.got is not None

    @property
    def t_arr(self) -> int:
        return self.message.t_arr

    @property
    def kept_after(self) -> bool:
        """Delivered at or after the reconnect of its backlog: still in the queue when the backlog was read."""
        return self.in_backlog and self.got is not None and self.got.t_last >= self.window.c

    @property
    def owed(self) -> bool:
        return not self.undeliverable and not self.expired and not self.trimmed

    def newer_than(self, other: Claim) -> bool:
        """Queue order: arrival, then publisher, then sequence (an order for messages of one instant)."""
        return (self.t_arr, self.message.publisher, self.message.pub_seq) > (
            other.t_arr, other.message.publisher, other.message.pub_seq)


def deadline(message: Publish, declared: Declared) -> int:
    """Its MQTT 5 expiry after the publish, else the broker's message lifetime."""
    lifetime = message.expiry_s * 1_000_000 if message.expiry_s is not None else declared.ttl
    return message.t_invoke + lifetime


def claims(messages: dict[tuple[str, int], Publish], subscriptions: list[Subscription],
           got: dict[tuple, Received], lives: dict[str, Life], declared: Declared) -> list[Claim]:
    """Every claim with what rules 1-5 and the backlog ranks say of it (losses() decides the rest)."""
    seen = {(r.publisher, r.pub_seq) for r in got.values()}
    out: list[Claim] = []
    for message in messages.values():
        if message.invokes == 0 or message.topic is None:
            continue
        matching = [s for s in subscriptions if matches(s.topic_filter, message.topic)]
        eligible = (message.qos or 0) > 0 and (
            message.t_ack is not None
            or (message.t_indet is not None and (message.publisher, message.pub_seq) in seen))
        for client in sorted({s.client for s in matching}):
            # a shared subscription owes its group, not the member (the oracle does not judge groups)
            held = any(s.client == client and s.persistent and not shared(s.topic_filter) and s.granted > 0
                       and s.t_from < message.t_invoke
                       and (s.t_to is None or message.t_invoke < s.t_to) for s in matching)
            claim = Claim(client, message, eligible and held, got.get((client, message.publisher, message.pub_seq)))
            _place(claim, lives.get(client), declared)
            out.append(claim)
    _queue(out, declared)
    return out


def _place(claim: Claim, life: Life | None, declared: Declared) -> None:
    """Rules 4 and 6, and which backlog it was in (rule 5's windows)."""
    windows = life.windows if life is not None else []
    claim.window = next((w for w in windows if w.c > claim.t_arr), None)
    w = claim.window
    first_ack_t = claim.got.first_ack_t if claim.got is not None else None
    # In the backlog of w: it arrived while offline, or before and was not acknowledged before w began.
    claim.in_backlog = w is not None and (claim.t_arr >= w.d or first_ack_t is None or first_ack_t > w.d)
    if claim.in_backlog:
        # A queued message's first chance is the reconnect, or (acknowledged within the pipeline slack before
        # it) its arrival plus the slack: it may reach the queue after the backlog was read.
        chance = max(w.c, claim.t_arr + declared.slack)
        claim.undeliverable = w.c >= NEVER or w.discarded
        claim.immediate = w.c - w.d < declared.slack
        claim.settled = not claim.immediate and claim.t_arr < w.c - declared.slack
    else:
        chance = claim.t_arr
    claim.expired = deadline(claim.message, declared) < chance + declared.tol


def _queue(all_claims: list[Claim], declared: Declared) -> None:
    """Rank every backlog of candidates and mark what its declared limit trims (rule 5, at the reconnect)."""
    backlogs: dict[tuple[str, int], list[Claim]] = {}
    for c in all_claims:
        if c.candidate and c.in_backlog:
            backlogs.setdefault((c.client, c.window.idx), []).append(c)
    for members in backlogs.values():
        newest_first = sorted(members, key=lambda c: (c.t_arr, c.message.publisher, c.message.pub_seq), reverse=True)
        for i, c in enumerate(newest_first, 1):
            c.rank = len(members) - i + 1 if declared.queue_policy == "drop_newest" else i
            c.trimmed = declared.trims and c.rank > declared.limit
        in_pipeline = sum(1 for c in members if not c.settled)
        # Kept although past the limit and past every message still in the pipeline: the wrong end was kept.
        wrongly_kept = [c.rank for c in members if c.kept_after and c.trimmed and c.settled
                        and c.rank > declared.limit + in_pipeline]
        kept = [c.rank for c in members if c.kept_after and not c.trimmed]
        numbers = {"n": len(members), "in_pipeline": in_pipeline,
                   "settled": sum(1 for c in members if c.settled),
                   "settled_kept": sum(1 for c in members if c.kept_after and c.settled),
                   "max_kept_rank": max(kept) if kept else None,
                   "wrong_end": bool(wrongly_kept), "wrongly_kept_rank": max(wrongly_kept) if wrongly_kept else None}
        for c in members:
            c.backlog = numbers
            # Past the limit, never delivered, but on the kept side of a message the broker kept beyond the limit
            # and the pipeline: a correct queue would have kept it (its newest limit + pipeline), so the rank does
            # not excuse it.  Further out it would have been trimmed either way.
            c.misplaced = (c.trimmed and not c.delivered and numbers["wrongly_kept_rank"] is not None
                           and c.rank < numbers["wrongly_kept_rank"] and c.rank <= declared.limit + in_pipeline)
            c.trimmed = c.trimmed and not c.misplaced


def losses(all_claims: list[Claim], lives: dict[str, Life], declared: Declared,
           unpromised_starts: list[int]) -> list[Claim]:
    """The owed candidates never delivered, each with its ``cause`` (one of the loss invariants)."""
    by_stream: dict[tuple[str, str], list[Claim]] = {}
    by_client: dict[str, list[Claim]] = {}
    for c in all_claims:
        if c.candidate:
            by_stream.setdefault((c.client, c.message.publisher), []).append(c)
            by_client.setdefault(c.client, []).append(c)
    lost = []
    for c in all_claims:
        if not c.candidate or c.delivered:
            continue
        stream = by_stream[(c.client, c.message.publisher)]
        later = [o for o in stream if o.delivered and o.message.pub_seq > c.message.pub_seq]
        older = [o for o in stream if o.delivered and o.message.pub_seq < c.message.pub_seq]
        later_first_t = min((o.got.t_first for o in later), default=None)
        if c.in_backlog and not c.trimmed and not c.misplaced:
            _carry(c, lives[c.client], by_client[c.client], later_first_t, declared)
        cause = _cause(c, declared, unpromised_starts)
        if c.owed and declared.queue_policy == "drop_oldest" and not c.misplaced:
            # Trimmed at any save, online too: the moments it can have left the queue by a trim.
            trim_from = max([c.t_arr] + [o.got.t_last for o in older])
            trim_until = later_first_t if later_first_t is not None else NEVER
            if trim_from <= trim_until and _peak_newer(c, by_client[c.client], trim_from, trim_until) >= declared.limit:
                c.trimmed = True
        if c.owed:
            c.cause = cause
            lost.append(c)
    return lost


def _carry(c: Claim, life: Life, candidates: list[Claim], later_first_t: int | None, declared: Declared) -> None:
    """Kept in its backlog but not yet sent when the subscriber went offline again (nothing newer of its stream
    delivered before that): still queued, it is the oldest of the next backlog, trimmed there by drop_oldest
    when that backlog holds at least the limit."""
    following = next((w for w in life.windows if w.idx == c.window.idx + 1), None)
    if following is None or (later_first_t is not None and later_first_t < following.d):
        return
    size = sum(1 for o in candidates if o.in_backlog and o.window.idx == following.idx)
    if declared.queue_policy == "drop_oldest" and size >= declared.limit:
        c.trimmed = True


def _peak_newer(c: Claim, candidates: list[Claim], t_from: int, t_until: int) -> int:
    """The most newer delivered candidates of the client queued at once within [t_from, t_until]: each from
    its arrival until the subscriber acknowledged it (else its last delivery)."""
    spans = []
    for o in candidates:
        if not o.delivered or not o.newer_than(c):
            continue
        gone = o.got.first_ack_t if o.got.first_ack_t is not None else o.got.t_last
        if gone > t_from and o.t_arr <= t_until:
            spans.append((max(o.t_arr, t_from), gone))
    # At each span start, how many spans hold it (a span is [start, gone): one that ends there does not).
    return max((sum(1 for s, g in spans if s <= start < g) for start, _ in spans if start <= t_until), default=0)


def _cause(c: Claim, declared: Declared, unpromised_starts: list[int]) -> str:
    """Why an owed, never-delivered candidate was lost: the first that fits."""
    if c.in_backlog:
        chance, since = c.window.c, min(c.t_arr, c.window.d - declared.slack)
    else:
        chance, since = c.t_arr + declared.slack, c.t_arr
    if any(since <= x <= chance for x in unpromised_starts):
        return "durability.lost_allowed"
    b = c.backlog or {}
    if c.in_backlog and declared.trims and b["n"] > declared.limit and b["wrong_end"]:
        return "limits.trim_not_newest" if declared.queue_policy == "drop_newest" else "limits.trim_not_oldest"
    if (c.in_backlog and declared.trims and not c.immediate and b["settled"] >= declared.limit
            and not b["wrong_end"] and (b["max_kept_rank"] is None or c.rank > b["max_kept_rank"])):
        return "limits.trimmed_under_limit"
    if c.in_backlog and c.message.expiry_s is not None:
        return "expiry.dropped_early"
    return "durability.lost"
