"""`grpokit plot RUN_DIR`'s drawing: the library's (`grpokit.records.plot`), which a run draws itself when it ends."""

from grpokit.records.plot import curve_series, plot_run, read_metrics

__all__ = ["curve_series", "plot_run", "read_metrics"]
