"""Datasets of [time, instrument, feature] values on disk, and samples cut from them.

One module per job: `manifest` (the layout and its one-file description), `formats`
(HDF5, Parquet, NumPy parts), `reader` (chunk-cached reads), `prepare` and `inspect` (the
`python -m toolkit.data` commands), `synthetic` (a factor model for tests and benchmarks),
`samples` (windows, leak-free time splits, normalisation), `loader` (the training loop's
Loader contract, the DataLoader machinery behind it, and the market's batches), `tokens`
(text and synthetic tokens under the same contract), `files` (the files training data
needs, made once by the launcher), `training` (what the launcher checks before any rank
starts), `user` (your own torch Dataset under the same contract) and `windowed`
(pre-windowed samples as a Dataset). Nothing here imports torch at module level except
`loader`, `tokens`, `user` and `windowed`; `toolkit.data.WindowedSamples` imports it when first named.
"""


def __getattr__(name: str):
    if name == "WindowedSamples":  # data._target_=toolkit.data.WindowedSamples
        from toolkit.data.windowed import WindowedSamples

        return WindowedSamples
    raise AttributeError(f"module 'toolkit.data' has no attribute {name!r}")
