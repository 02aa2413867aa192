"""The request pipeline after auth and validation: score and plan the route, admit it
against limits, run the attempts (hedges, SLA guard), cascade and verify (second
opinions, judge, code runs), select among many models, relay streams, and settle each
call's cost into the ledger and the budgets."""
