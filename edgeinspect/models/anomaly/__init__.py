"""The anomaly gate: PatchCore-style anomaly detection taught from good frames only (DESIGN.md §8).

features.py turns frames into patch-feature grids (raw-pixel, efficientnet-lite0, siglip, onnx; each with a
fingerprint that every bank records); coreset.py keeps a greedy k-center subset of the good patches; bank.py holds a
taught bank (coreset features, calibrated threshold) and the versioned, atomically published on-disk store;
teach.py builds a bank from good frames with a leave-one-out threshold and refuses bad teach sets; scoring.py scores
frames against a bank (k=1 nearest patch, heatmap, regions) and draws the heatmap for a person; sample.py draws the
seeded sample set; evaluate.py measures a bank on a labelled set. Nothing heavy is imported here: import the module
you need.
"""
