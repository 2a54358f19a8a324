"""Day 2 on a running cluster: ``provision plan`` (:mod:`.plan`), ``--rolling`` (:mod:`.rolling`), ``provision
failover`` and ``provision watch`` (:mod:`.failover`), ``provision replace-node`` (:mod:`.replace`).
"""
