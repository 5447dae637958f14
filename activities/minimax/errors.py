"""The failure types of MiniMax's activities, which the provider's shape (`PROVIDER` in
activities.py) hands to the workflow's retry policies and failure handling."""

from __future__ import annotations

PERMANENT = "MiniMaxPermanent"  # keys, balance, content, parameters: MiniMax said no for good
UNAVAILABLE = "MiniMaxUnavailable"  # a free call got no usable answer: retried
DOWNLOAD_FAILED = "MiniMaxDownloadFailed"  # retried: the video is paid for
AMBIGUOUS_CREATE = "MiniMaxAmbiguousCreate"  # a task, and a charge, may exist
CREATE_GAVE_UP = "MiniMaxCreateGaveUp"  # every try was a provable "not now" until the budget ended
NO_KEY = "MiniMaxNoKey"
TASK_FAILED = "MiniMaxTaskFailed"
