"""Loss witnesses never state a wrong range: the checker collects only the first LOSS_ROWS_CAP lost rows,
so a gap cut by that cap must say it may go on (a loss of 283 messages was once written "118–317")."""

from __future__ import annotations

from spark_checkers.collect import LOSS_ROWS_CAP
from spark_checkers.rules.catalog import explain
from spark_checkers.rules.losses import loss_gaps
from spark_checkers.timeline import Timeline


def _lost(seqs, next_delivered):
    return [{"client": "sub-0", "publisher": "pub-0", "pub_seq": seq, "topic": "t", "t_invoke": 1_000_000 + seq,
             "t_ack": 1_000_100 + seq, "prev_delivered": 117, "next_delivered": next_delivered, "position": "middle"}
            for seq in seqs]


def test_a_gap_cut_by_the_row_cap_says_it_may_go_on():
    # 283 lost (118..400), only the first 200 collected: 118..317
    rows = _lost(range(118, 118 + LOSS_ROWS_CAP), next_delivered=401)
    (gap,) = loss_gaps(rows, Timeline("r"), total=283)
    text = explain("durability.lost", gap, Timeline("r"))
    assert gap["truncated"] == {"listed": 200, "total": 283, "next_delivered": 401}
    assert text.startswith("at least 200 messages 118–317")
    assert "only the first 200 of 283 lost messages are listed" in text and "next delivery was 401" in text


def test_a_complete_gap_states_its_exact_range():
    """Near miss: every lost row collected (total = rows), or the gap closed by the very next delivery."""
    whole = loss_gaps(_lost(range(118, 401), next_delivered=401), Timeline("r"), total=283)
    assert len(whole) == 1 and "truncated" not in whole[0]
    assert explain("durability.lost", whole[0], Timeline("r")).startswith("283 messages 118–400")
    closed = loss_gaps(_lost(range(118, 318), next_delivered=318), Timeline("r"), total=400)
    assert "truncated" not in closed[0]  # 318 arrived: this gap ends at 317 whatever else was cut


def test_a_gap_the_checker_measured_whole_states_its_exact_range_however_few_rows_were_listed():
    """The checker gives every lost row its whole gap (rules/losses.py owed_checks: gap_first, gap_last, gap_count):
    a gap cut by the row cap states its real range and count, not "at least"."""
    rows = [{**row, "gap_first": 118, "gap_last": 400, "gap_count": 283}
            for row in _lost(range(118, 118 + LOSS_ROWS_CAP), next_delivered=401)]
    (gap,) = loss_gaps(rows, Timeline("r"), total=283)
    assert "truncated" not in gap and (gap["first_seq"], gap["last_seq"], gap["count"]) == (118, 400, 283)
    assert explain("durability.lost", gap, Timeline("r")).startswith("283 messages 118–400")
