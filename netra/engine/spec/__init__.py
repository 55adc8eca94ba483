"""Speculative decoding: drafting, verification, acceptance and commit of drafted blocks."""
