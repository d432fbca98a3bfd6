"""Faults the toolkit detects and the evidence it keeps of them (hangs: toolkit.fault.hang)."""
