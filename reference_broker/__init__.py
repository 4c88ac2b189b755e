"""The reference broker: the system under test that Ordeal ships with.

A persistent-session MQTT broker (MQTT 3.1.1 and 5.0) built to TBMQ 2.x's design (docs/tbmq-notes.md):
publishes go through Kafka (an incoming topic fanned out to a persisted topic keyed by subscriber),
persistent sessions and their queues live in Redis Cluster (Lua scripts in ../lua/), and several nodes
share the work through partition leases and node-to-node links.  Realistic bugs of that design can be switched on one by one
(defects.py), so the suite can show that it catches each.

It stands alone: it imports nothing of Ordeal, and of Ordeal only the harness (which starts it) and the
``ordeal`` commands import it (import-linter contracts in pyproject.toml keep both so).  Run a node with
``python -m reference_broker`` (__main__.py) or ``ordeal broker``.

Rooms: server.py (one node, wiring the rest), connection.py (one MQTT connection), kafka_path.py (the
Kafka stages), store.py and script_batch.py (Redis), peers.py (node links), topic_index.py (subscription
matching), codec.py (MQTT packets), config.py and defects.py (settings and defect switches),
source_address.py (outgoing source address).
"""
