"""Datasets of [time, instrument, feature] values on disk, and samples cut from them.

One module per job: `manifest` (the layout and its one-file description), `formats`
(HDF5, Parquet, NumPy parts), `reader` (chunk-cached reads), `prepare` and `inspect` (the
`python -m toolkit.data` commands), `synthetic` (a factor model for tests and benchmarks),
`samples` (windows, leak-free time splits, normalisation), `loader` (multi-process batches
under the training loop's Loader contract) and `training` (what the launcher checks before
any rank starts). Nothing here imports torch at module level except `loader`.
"""
