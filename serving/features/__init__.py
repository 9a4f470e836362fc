"""Online feature reads for a replica's micro-batch, through the model's FeatureService.

reader        ``OnlineFeatureReader``: the fast path where it applies, Feast's ``get_online_features`` otherwise
fast_reader   the FeatureService's features from the store read directly, on-demand views through Feast
store_reader  Feast's online storage (SQLite, Redis) read directly
"""
