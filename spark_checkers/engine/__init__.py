"""Running Spark, not checking: the settings every JVM the checkers start gets (settings.py), the choice and
making of the session a check runs on (spark_session.py), and the supervisor of the shared local Spark Connect
server (connect_server.py).  Nothing here knows a rule or a table; the checks receive a session from here."""
