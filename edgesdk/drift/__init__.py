"""Drift against a reference profile (issue 41): what the converter computes from the validation
data and signs into the bundle (:mod:`edgesdk.drift.profile`), and the scores a device reports
when it compares its live traffic with it (:mod:`edgesdk.drift.scores`). Shared by the host
(``edgesdk convert``) and the device agent, so it imports only numpy and the schemas."""
