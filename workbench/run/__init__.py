"""The run layer: the run loop of every study kind (runner), executors, training one run
(train, Lightning), the results store, and the scaling kind's measurements."""
