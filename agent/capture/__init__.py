"""Sampled data capture on the device (issue 41): a tap samples answered requests, one worker
thread encrypts each to the operator's key and writes it within a disk budget and a retention."""
