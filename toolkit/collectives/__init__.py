"""Collective-communication measurement: sizes and bus bandwidth (busbw), the ops with
checked inputs (ops), timing (measure), a hand-written reference loop (baseline), and the
table and HDF5 report (report). The benchmark's task and command build on it."""
