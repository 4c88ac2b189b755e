"""The run stage: topology providers (local/, containers/), the targets (reference, external) and the switch
between them (providers.py), the executor and its MQTT clients, the drain, snapshots and the history."""
