"""Experiment trackers as metrics sinks: TensorBoard, MLflow, Weights & Biases.

`build_tracking_sinks` gives rank 0 one `TrackerSink` per configured tracker (every other
rank gets none); each sink hands records to its tracker on a background thread through a
bounded queue (toolkit.tracking.base), so a tracker that is slow or down never stalls or
kills training. What each tracker's run is (id, URL, log dir) and how many records it
dropped is written to RUN_DIR/tracking/trackers.json, which `toolkit runs` shows.
"""

from toolkit.tracking.build import build_tracking_sinks, read_trackers, tracker_links

__all__ = ["build_tracking_sinks", "read_trackers", "tracker_links"]
