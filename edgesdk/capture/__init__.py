"""Sampled data capture (issue 41): the file format shared by the agent that writes capture
files and the host that decrypts them. A capture file holds one answered request (its inputs,
outputs and where they came from) encrypted to an operator's X25519 key; only the holder of the
operator's private key can read it (docs/security.md, "Data capture")."""
