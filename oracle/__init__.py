"""An independent oracle for the checkers: a small, slow, plainly written model of the invariants.

``judge(run_dir)`` reads a stored run (history/*.parquet with pyarrow, scenario.json for what the target
declared) and decides, per invariant id of contracts/invariants.py it covers, a verdict (pass / fail /
unknown / not_applicable / allowed), a count, and the items it counted (the (client, publisher, pub_seq) of
each lost message, the seq of each delivery with a bad packet id, ...).  It walks each client's rows in seq
order and looks at every delivery of every message: quadratic where that is clearer, fine for the few
thousand rows of a generated history.

It shares nothing with spark_checkers/ but the contracts (the history schema, the invariant ids and their
flags, the declared defaults): a second author's reading of docs/invariants.md, so that a property test can
compare the two on many generated histories (tests/checkers/test_oracle_property.py).  ``oracle.generate``
draws those histories; ``oracle.compare`` lines up a checker report with a judgement.
"""

from oracle.judge import COVERED, Judgement, Verdict, judge, judge_loaded

__all__ = ["COVERED", "Judgement", "Verdict", "judge", "judge_loaded"]
